"""The Data-Juicer service: runs Data-Juicer recipes for the ``data_juicer`` operator of other
processes (``service.data_juicer``), so the Data-Juicer install, its workers and its memory live
apart from the explorer.

    python -m trinity.data.dj_server --port 5005            # 127.0.0.1 by default

The protocol is JSON over HTTP (this project's own; upstream Trinity-RFT's Flask server sends
Arrow tables of its Experience schema, so the two are not interchangeable):

- ``GET /health``: ``{"status": "ok", "service": "trinity-data-juicer", "data_juicer": VERSION}``
- ``POST /create`` ``{"process": [{op: args}, ...], "np": N}``: builds the recipe's operators
  (an unknown operator or argument is a 400 with Data-Juicer's message) -> ``{"session_id"}``
- ``POST /process`` ``{"session_id", "rows": [...]}`` -> ``{"rows": [...]}``: the rows the recipe
  keeps, each with its computed stats under ``__dj__stats__``
- ``POST /close`` ``{"session_id"}``

Every request must carry ``Authorization: Bearer TOKEN`` when the server has a token
(``--token`` or ``$TRINITY_DJ_TOKEN``). A server bound to anything but loopback refuses to
start without one: a recipe names files and models on the server's machine.
"""

# No ``from __future__ import annotations``: FastAPI reads the handlers' annotations, which
# name types imported inside build_app (fastapi stays out of the module's import).
import argparse
import hmac
import json
import os
import sys
import threading
import uuid
from typing import Any

from trinity.data.dj_client import SERVICE, TOKEN_ENV

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def build_app(token: str | None = None) -> Any:
    """The FastAPI app (``token``: the bearer token every request must carry)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    from trinity.data.data_juicer import Recipe, data_juicer_version

    app = FastAPI(title="Trinity Data-Juicer service")
    sessions: dict[str, Recipe] = {}
    lock = threading.Lock()

    def reply(body: Any, status: int = 200) -> Response:
        # default=str: stats Data-Juicer computes may hold values JSON has no type for.
        return Response(json.dumps(body, default=str), status_code=status, media_type="application/json")

    def error(status: int, message: str) -> Response:
        return reply({"error": message}, status)

    if token:

        @app.middleware("http")
        async def _auth(request: Request, call_next: Any) -> Any:
            given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), token.encode()):
                return JSONResponse({"error": "missing or wrong token"}, status_code=401)
            return await call_next(request)

    @app.get("/health")
    def health() -> Response:
        return reply({"status": "ok", "service": SERVICE, "data_juicer": data_juicer_version()})

    @app.post("/create")
    def create(body: dict[str, Any]) -> Response:
        try:
            recipe = Recipe(body.get("process"), np=int(body.get("np", 1)))
            recipe.load()  # unknown operators and arguments fail here, not at the first batch
        except (ValueError, TypeError, ImportError) as exc:
            return error(400, str(exc))
        except Exception as exc:  # Data-Juicer's own errors for a bad recipe
            return error(400, f"{type(exc).__name__}: {exc}")
        session = uuid.uuid4().hex
        with lock:
            sessions[session] = recipe
        return reply({"session_id": session})

    @app.post("/process")
    def process(body: dict[str, Any]) -> Response:
        # A plain def: FastAPI runs it in its thread pool, so a long recipe does not block
        # /health or another session's batch.
        recipe = sessions.get(str(body.get("session_id")))
        if recipe is None:
            return error(404, "no such session (the server restarted, or it was closed)")
        rows = body.get("rows")
        if not isinstance(rows, list):
            return error(400, "rows must be a list of objects")
        try:
            return reply({"rows": recipe.run(rows)})
        except Exception as exc:
            return error(500, f"the recipe failed on {len(rows)} rows: {type(exc).__name__}: {exc}")

    @app.post("/close")
    def close(body: dict[str, Any]) -> Response:
        with lock:
            found = sessions.pop(str(body.get("session_id")), None)
        return reply({"closed": found is not None})

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trinity.data.dj_server", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--host", default="127.0.0.1", help="Address to bind (default 127.0.0.1).")
    parser.add_argument("--port", type=int, default=5005, help="Port (default 5005).")
    parser.add_argument("--token", default=None, help=f"Bearer token clients must send (or ${TOKEN_ENV}).")
    args = parser.parse_args(argv)
    token = args.token or os.environ.get(TOKEN_ENV) or None
    if args.host not in _LOOPBACK and not token:
        print(
            f"refusing to serve Data-Juicer on {args.host} without a token: pass --token or set ${TOKEN_ENV}",
            file=sys.stderr,
        )
        return 2
    import uvicorn

    print(f"Data-Juicer service on http://{args.host}:{args.port}", flush=True)
    uvicorn.run(build_app(token), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
