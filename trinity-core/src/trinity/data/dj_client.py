"""The ``data_juicer`` operator's side of the Data-Juicer service (:mod:`trinity.data.dj_server`).

``service.data_juicer`` decides where recipes run:

- ``auto_start: true``: this process starts a service on 127.0.0.1 (``port``, else the port of
  ``server_url``, else a free one; a busy port is replaced by a free one, with a warning) with
  a fresh token, shares it between its operators and stops it when the last one closes;
- ``server_url`` alone: the operators use that running service (``$TRINITY_DJ_TOKEN`` is sent
  as its token); one that does not answer stops the job in one line naming the URL.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.config.sections.data import DataJuicerServiceConfig

#: The environment variable holding the service's bearer token (read by client and server).
TOKEN_ENV = "TRINITY_DJ_TOKEN"
#: What the service answers as its name on ``/health``.
SERVICE = "trinity-data-juicer"

logger = logging.getLogger(__name__)

#: How long an auto-started service may take to answer (importing Data-Juicer takes seconds).
STARTUP_TIMEOUT = 180.0
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class DataJuicerClient:
    """Talks to one Data-Juicer service (:mod:`trinity.data.dj_server`'s protocol)."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 3600.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        host = urllib.parse.urlsplit(self.url).hostname or ""
        self.local = host in _LOOPBACK
        # A proxy from the environment must not see requests to this machine's own service.
        handlers = [urllib.request.ProxyHandler({})] if self.local else []
        self._opener = urllib.request.build_opener(*handlers)

    def _call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        data = None if body is None else json.dumps(body, default=str).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with self._opener.open(request, timeout=timeout or self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error") or exc.reason
            except ValueError:
                message = exc.reason
            raise RuntimeError(f"Data-Juicer service at {self.url}{path}: {exc.code} {message}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ConnectionError(f"Data-Juicer service at {self.url} does not answer: {reason}") from None

    def health(self, timeout: float = 5.0) -> dict[str, Any]:
        """The service's ``/health`` reply; ``ConnectionError`` when it is not a Trinity
        Data-Juicer service that answers."""
        reply = self._call("GET", "/health", timeout=timeout)
        if not isinstance(reply, dict) or reply.get("service") != SERVICE:
            raise ConnectionError(
                f"{self.url} answers, but is not a Trinity Data-Juicer service ({reply!r:.80})"
            )
        return reply

    def create(self, process: list[dict[str, Any]], np: int) -> str:
        """A session running recipe ``process`` with ``np`` workers; returns its id."""
        try:
            return str(self._call("POST", "/create", {"process": process, "np": np})["session_id"])
        except RuntimeError as exc:
            raise ValueError(f"the Data-Juicer service rejected the recipe: {exc}") from None

    def process(self, session: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The rows session ``session``'s recipe keeps, with their stats."""
        return list(self._call("POST", "/process", {"session_id": session, "rows": rows})["rows"])

    def close(self, session: str) -> None:
        try:
            self._call("POST", "/close", {"session_id": session}, timeout=10.0)
        except (RuntimeError, ConnectionError) as exc:  # a stopped service has no session to close
            logger.debug("closing Data-Juicer session %s: %s", session, exc)


class _LocalService:
    """A service this process started (shared by its operators, stopped with the last)."""

    def __init__(self, port: int) -> None:
        self.token = secrets.token_urlsafe(24)
        # The service's output, kept open for its whole life (read back when it fails to start).
        self.log = tempfile.NamedTemporaryFile(prefix="trinity-dj-server-", suffix=".log", delete=False)  # noqa: SIM115
        env = {**os.environ, TOKEN_ENV: self.token}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trinity.data.dj_server", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.client = DataJuicerClient(f"http://127.0.0.1:{port}", self.token)
        self.users = 0

    def wait_ready(self, timeout: float) -> None:
        print(
            f"[trinity] waiting for the Data-Juicer service (pid {self.process.pid}) on "
            f"{self.client.url} to answer /health (up to {timeout:.0f} s)",
            flush=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the Data-Juicer service exited with code {self.process.returncode} before answering: "
                    f"{self._tail()}"
                )
            try:
                self.client.health(timeout=2.0)
                return
            except ConnectionError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"the Data-Juicer service on {self.client.url} did not answer within {timeout:.0f} s "
                        f"(log: {self.log.name})"
                    ) from None
                time.sleep(0.25)

    def _tail(self) -> str:
        try:
            with open(self.log.name, errors="replace") as f:
                lines = [line.strip() for line in f if line.strip()]
        except OSError:
            return "(no log)"
        return lines[-1] if lines else "(no output)"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


_lock = threading.Lock()
_local: _LocalService | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def connect(config: DataJuicerServiceConfig, startup_timeout: float = STARTUP_TIMEOUT) -> DataJuicerClient:
    """A client of the service ``config`` names, starting it when ``auto_start`` is set.

    Every call must be matched by :func:`release` with the returned client."""
    global _local
    if not config.auto_start:
        if not config.server_url:
            raise ValueError("service.data_juicer needs server_url, or auto_start: true")
        client = DataJuicerClient(config.server_url, os.environ.get(TOKEN_ENV) or None)
        try:
            client.health()
        except ConnectionError as exc:
            raise ValueError(
                f"{exc}; start one with `python -m trinity.data.dj_server --port PORT`, "
                "or set service.data_juicer.auto_start: true"
            ) from None
        except RuntimeError as exc:  # it answers, but refuses us (a wrong token)
            raise ValueError(f"{exc} (its token is read from ${TOKEN_ENV})") from None
        logger.info("using the Data-Juicer service at %s", client.url)
        return client
    with _lock:
        if _local is None or _local.process.poll() is not None:
            wanted = config.port or urllib.parse.urlsplit(config.server_url or "").port
            port = wanted or _free_port()
            if wanted and not _port_is_free(wanted):
                port = _free_port()
                logger.warning("service.data_juicer: port %d is busy; the service starts on %d", wanted, port)
                print(f"[trinity] service.data_juicer: port {wanted} is busy; using {port}", flush=True)
            service = _LocalService(port)
            try:
                service.wait_ready(startup_timeout)
            except BaseException:
                service.stop()
                raise
            _local = service
            atexit.register(service.stop)  # a process that never closes its operators
            logger.info("Data-Juicer service started at %s (pid %d)", service.client.url, service.process.pid)
        _local.users += 1
        return _local.client


def release(client: DataJuicerClient) -> None:
    """The operator that :func:`connect` gave ``client`` is done; stops an auto-started service
    when its last operator is."""
    global _local
    with _lock:
        if _local is None or client is not _local.client:
            return
        _local.users -= 1
        if _local.users <= 0:
            _local.stop()
            _local = None
