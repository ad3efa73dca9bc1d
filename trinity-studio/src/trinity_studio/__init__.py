"""Trinity Studio: configure, launch and inspect runs in the browser (``trinity studio``).

A FastAPI application (:mod:`trinity_studio.app`) serving a hand-written page from
``static/``. Imported only by ``trinity studio`` and ``trinity debug --module viewer``; the
lighter commands never load it.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import threading

__all__ = ["is_loopback", "launch", "studio_url"]

CHECKPOINT_ROOT_ENV = "TRINITY_CHECKPOINT_ROOT_DIR"


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def default_root() -> str:
    """The checkpoint root ``trinity run`` uses when a config names none."""
    return os.environ.get(CHECKPOINT_ROOT_ENV) or "./checkpoints"


def studio_url(host: str, port: int, token: str | None = None, page: str = "") -> str:
    """The address to open; carries the token (once: the page then keeps it as a cookie)."""
    if host in ("0.0.0.0", "::", ""):  # every interface: the name other machines reach it by
        import socket

        host = socket.gethostname()
    shown = f"[{host}]" if ":" in host else host
    query = f"?token={token}" if token else ""
    return f"http://{shown}:{port}/{query}{'#' + page if page else ''}"


def launch(
    host: str = "127.0.0.1",
    port: int = 8080,
    root: str | None = None,
    experience_file: str | None = None,
    open_browser: bool = False,
) -> None:
    """Serve the studio until Ctrl-C.

    Binds ``host`` (loopback by default); any other address requires the access token printed
    here on every request. ``experience_file`` (a jsonl file such as ``trinity debug
    --output-file`` writes, or an SQL buffer) opens on the Experiences page.
    """
    import uvicorn

    from trinity_studio.app import create_app

    token = None if is_loopback(host) else secrets.token_urlsafe(24)
    if experience_file is not None:
        experience_file = (
            os.path.abspath(experience_file) if "://" not in experience_file else experience_file
        )
    app = create_app(root or default_root(), token=token, experience_file=experience_file)
    url = studio_url(host, port, token, "experiences" if experience_file else "")
    print(f"Trinity Studio on {url}  (checkpoint root {app.state.studio.root}; Ctrl-C stops it)", flush=True)
    if token:
        print(
            f"Access token: {token} (needed because --host {host} is reachable from other machines)",
            flush=True,
        )
    if open_browser:
        import webbrowser

        threading.Timer(1.0, webbrowser.open, args=(url,)).start()
    uvicorn.run(app, host=host, port=port, log_level="warning")
