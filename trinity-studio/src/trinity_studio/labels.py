"""The Labels page's side of the studio: the label stores it offers, and a studio the
``human_preference_annotation_mapper`` operator serves while it waits for labels.

A label store (:class:`trinity.data.annotation.PreferenceStore`) is an SQLite file the operator
fills with pairs (``<job dir>/annotation/<project>.db``); the page shows the next undecided pair
of a store and records the person's choice in it. Only the stores of the runs under the studio's
root, and those the studio was started with, can be opened: a request never names a file the
studio would create.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlparse

from trinity.data.annotation import PreferenceStore, find_stores

logger = logging.getLogger(__name__)


def label_stores(root: str, extra: Sequence[str] = ()) -> list[str]:
    """The label stores of the runs under ``root``, then ``extra`` (absolute paths, no repeats)."""
    from trinity_studio.runs import find_runs

    found = [os.path.abspath(p) for p in extra]
    for run in find_runs(root):
        found += find_stores(run.path)
    return list(dict.fromkeys(found))


def describe(path: str) -> dict[str, Any]:
    """A store as the page lists it: its project, the answers' field names and its counts."""
    store = PreferenceStore(path)
    meta = store.meta()
    return {
        "store": store.path,
        "project": store.project,
        "answer1_key": meta.get("answer1_key", "answer1"),
        "answer2_key": meta.get("answer2_key", "answer2"),
        "counts": store.counts(),
    }


def export_rows(store: PreferenceStore) -> Iterator[str]:
    """The store's labelled pairs as DPO rows, one JSON line each."""
    meta = store.meta()
    for row in store.dpo_rows(
        chosen_key=meta.get("chosen_key", "chosen"), rejected_key=meta.get("rejected_key", "rejected")
    ):
        yield json.dumps(row, ensure_ascii=False) + "\n"


@dataclass
class LabelServer:
    """Where the Labels page of a store is served; :meth:`close` stops a studio started for it."""

    page_url: str
    _server: Any = None
    _thread: threading.Thread | None = None

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=10)
            self._server = None


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _serves(api_url: str, store: str, token: str | None) -> bool:
    """Whether a studio at ``api_url`` offers ``store`` on its Labels page."""
    import urllib.request

    request = urllib.request.Request(f"{api_url}/api/labels/projects")
    if token:
        request.add_header("X-Studio-Token", token)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return any(p.get("store") == store for p in json.load(response))
    except Exception:  # not a studio (or not this version of it): the caller says so
        return False


def serve_labels(
    store: str, api_url: str, *, token: str | None = None, root: str | None = None
) -> LabelServer:
    """The Labels page of ``store`` at ``api_url``: a studio already serving it there, or one
    started now in a thread of this process (checkpoint root ``root``).

    A studio on a host reachable from other machines gets an access token (``token``, else a
    new one), carried once by the page's URL. Raises ``ValueError`` (one line) when something
    else holds the port.
    """
    from trinity_studio import is_loopback

    parsed = urlparse(api_url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    if not is_loopback(host) and not token:
        import secrets

        token = secrets.token_urlsafe(24)
    query = f"?token={quote(token)}" if token else ""
    page = f"{api_url.rstrip('/')}/{query}#labels?store={quote(store)}"
    if _port_in_use(host, port):
        if _serves(api_url.rstrip("/"), store, token):
            return LabelServer(page)
        raise ValueError(
            f"api_url {api_url}: the port is taken by something that does not serve this project's "
            f"labels (a studio over another root, or another server); free it or set args.api_url"
        )
    import uvicorn

    from trinity_studio.app import create_app

    app = create_app(root or os.path.dirname(store), token=token, label_stores=[store])
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="trinity-studio-labels", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not server.started:
        server.should_exit = True
        raise ValueError(f"api_url {api_url}: the studio did not start there")
    return LabelServer(page, server, thread)
