"""The studio's web application: a JSON API over the config models, runs and buffers, plus the
static page that uses it (``static/``: hand-written HTML, JS and CSS; nothing fetched at run time).

``create_app(root, token=...)``: with a token every request must carry it, as the cookie the
``?token=`` URL sets, or as the ``X-Studio-Token`` header.
"""

from __future__ import annotations

import os
import re
import secrets
import threading
import time
from collections.abc import Sequence
from importlib import resources
from typing import Annotated, Any

from fastapi import Body, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles

from trinity import __version__
from trinity.config.errors import ConfigError
from trinity.data.annotation import AlreadyLabelled
from trinity_studio import configs, labels
from trinity_studio.experiences import Filters, SourceError, open_source
from trinity_studio.jobs import JobManager
from trinity_studio.runs import ScalarCache, config_files, find_runs, run_tokenizer
from trinity_studio.schema import components, config_schema

TOKEN_COOKIE = "trinity_studio_token"
TOKEN_HEADER = "X-Studio-Token"
STATIC = resources.files("trinity_studio") / "static"
PAGE_LIMIT = 500


def create_app(
    root: str,
    *,
    token: str | None = None,
    experience_file: str | None = None,
    label_stores: Sequence[str] = (),
) -> FastAPI:
    """The studio for the checkpoint root ``root``; ``experience_file`` opens on the Experiences
    page (``trinity debug --module viewer``); ``label_stores`` are offered on the Labels page
    besides those of the runs under ``root``."""
    root = os.path.abspath(os.path.expanduser(root))
    app = FastAPI(title="Trinity Studio", version=__version__, docs_url=None, redoc_url=None)
    state = _State(root, experience_file)
    state.label_stores = [os.path.abspath(p) for p in label_stores]
    app.state.studio = state

    if token:
        _add_token_check(app, token)

    static_dir = str(STATIC)
    app.mount("/static", StaticFiles(directory=static_dir), name="static")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        # No caching: the page is tiny, and a stale script after an upgrade would be confusing.
        return FileResponse(os.path.join(static_dir, "index.html"), headers={"Cache-Control": "no-store"})

    @app.get("/api/info")
    def info() -> dict[str, Any]:
        return {
            "version": __version__,
            "root": root,
            "experience_file": experience_file,
            "config_dir": state.config_dir,
        }

    # -- config builder ---------------------------------------------------------------------
    @app.get("/api/schema")
    def schema() -> dict[str, Any]:
        return state.schema()

    @app.get("/api/components")
    def component_list() -> dict[str, Any]:
        return state.components()

    @app.post("/api/config/validate")
    def validate(body: Annotated[dict, Body()]) -> dict[str, Any]:
        return configs.check_config(_config(body))

    @app.post("/api/config/parse")
    def parse(body: Annotated[dict, Body()]) -> dict[str, Any]:
        return {"config": configs.parse_yaml(str(body.get("yaml", "")))}

    @app.post("/api/config/load")
    def load(body: Annotated[dict, Body()]) -> dict[str, Any]:
        path = os.path.abspath(os.path.expanduser(str(body.get("path", ""))))
        return {"config": configs.read_config_file(path), "path": path}

    @app.post("/api/config/yaml")
    def to_yaml(body: Annotated[dict, Body()]) -> PlainTextResponse:
        return PlainTextResponse(configs.dump_yaml(_config(body)), media_type="application/x-yaml")

    @app.post("/api/config/save")
    def save(body: Annotated[dict, Body()]) -> dict[str, Any]:
        path = str(body.get("path") or "").strip()
        if not path:
            raise ConfigError("give a file path to save the config to")
        return {"path": configs.save_config_file(path, _config(body))}

    # -- jobs -------------------------------------------------------------------------------
    @app.post("/api/jobs")
    def launch(body: Annotated[dict, Body()]) -> JSONResponse:
        config = _config(body)
        checked = configs.check_config(config)
        if not checked["ok"]:
            return JSONResponse(
                {"detail": "the config is invalid", "errors": checked["errors"]}, status_code=400
            )
        path = str(body.get("path") or "").strip() or state.new_config_path(config)
        path = configs.save_config_file(path, config)
        job_dir = _job_dir(checked["yaml"])
        job = state.jobs.start(path, job_dir)
        return JSONResponse(job.to_json())

    @app.get("/api/jobs")
    def jobs() -> list[dict[str, Any]]:
        return [j.to_json() for j in state.jobs.all()]

    @app.get("/api/jobs/{job_id}/output")
    def job_output(job_id: int, offset: int = 0) -> dict[str, Any]:
        job = _job(state, job_id)
        text, next_offset = state.jobs.output(job_id, offset)
        return {"text": text, "offset": next_offset, **job.to_json()}

    @app.post("/api/jobs/{job_id}/stop")
    def job_stop(job_id: int) -> dict[str, Any]:
        _job(state, job_id)
        return state.jobs.stop(job_id).to_json()

    # -- runs -------------------------------------------------------------------------------
    @app.get("/api/runs")
    def runs() -> list[dict[str, Any]]:
        return [r.to_json() for r in find_runs(root, state.jobs.statuses())]

    @app.get("/api/runs/scalars")
    def scalars(run: Annotated[list[str], Query()]) -> dict[str, Any]:
        out = {}
        for run_id in run:
            path = state.run_path(run_id)
            out[run_id] = state.scalars.scalars(path)
        return out

    @app.get("/api/runs/config")
    def run_config_files(run: str) -> dict[str, Any]:
        """The resolved configs the launcher saved in the run's folder: ``{name: YAML text}``."""
        path = state.run_path(run)
        files = {}
        for name in config_files(path):
            with open(os.path.join(path, name), encoding="utf-8", errors="replace") as f:
                files[name] = f.read()
        return {"run": run, "files": files}

    # -- experiences ------------------------------------------------------------------------
    @app.get("/api/experiences/sources")
    def sources() -> list[str]:
        found = [experience_file] if experience_file else []
        for r in find_runs(root):
            found += r.buffers
        return found

    @app.get("/api/experiences/tables")
    def tables(source: str, table: str | None = None) -> dict[str, Any]:
        src = state.source(source, table)
        return {"kind": src.kind, "tables": src.tables, "table": src.table_name}

    @app.get("/api/experiences")
    def experience_page(
        source: str,
        table: str | None = None,
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=PAGE_LIMIT)] = 50,
        min_reward: float | None = None,
        max_reward: float | None = None,
        step: int | None = None,
    ) -> dict[str, Any]:
        src = state.source(source, table)
        page = src.page(offset, limit, Filters(min_reward, max_reward, step))
        return {**page, "offset": offset, "limit": limit, "kind": src.kind, "table": src.table_name}

    @app.get("/api/experiences/item")
    def experience_item(source: str, id: int, table: str | None = None, tokenizer: str | None = None) -> Any:
        """One experience. Its tokens are decoded with ``tokenizer`` (a folder), else with the
        tokenizer of the run whose folder holds the source (from the run's saved config),
        loaded the first time an experience of that run is opened; ``tokenizer`` ``-`` shows
        ids. ``tokenizer`` / ``tokenizer_error`` in the answer say which one, or why none."""
        src = state.source(source, table)
        chosen = (tokenizer or "").strip()
        error = None
        if not chosen:
            chosen = state.run_tokenizer_of(source) or ""
        loaded = None
        if chosen and chosen != "-":
            try:
                loaded = state.tokenizer(chosen)
            except SourceError as exc:
                if tokenizer:  # asked for by name: say it failed
                    raise
                error = f"{exc} (showing token ids)"
        try:
            out = src.item(id, loaded)
        except KeyError:
            raise HTTPException(404, f"no experience {id} in {source}") from None
        return {**out, "tokenizer": chosen if chosen != "-" else None, "tokenizer_error": error}

    @app.get("/api/experiences/export")
    def experience_export(
        source: str,
        table: str | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        step: int | None = None,
    ) -> StreamingResponse:
        src = state.source(source, table)
        name = (
            re.sub(r"[^\w.-]", "_", os.path.splitext(os.path.basename(source.rstrip("/")))[0])
            or "experiences"
        )
        return StreamingResponse(
            src.export(Filters(min_reward, max_reward, step)),
            media_type="application/x-ndjson",
            headers={"Content-Disposition": f'attachment; filename="{name}.jsonl"'},
        )

    # -- labels (human_preference_annotation_mapper) ------------------------------------------
    @app.get("/api/labels/projects")
    def label_projects() -> list[dict[str, Any]]:
        return [labels.describe(path) for path in labels.label_stores(root, state.label_stores)]

    @app.get("/api/labels/next")
    def label_next(store: str, after: int = -1) -> dict[str, Any]:
        """The next undecided pair of ``store`` after position ``after`` (``null``: none left)."""
        opened = state.label_store(store)
        pair = opened.next_pending(after)
        return {"pair": pair.to_json() if pair else None, **labels.describe(opened.path)}

    @app.post("/api/labels")
    def label_pair(body: Annotated[dict, Body()]) -> JSONResponse:
        """Record ``labelled_by``'s ``choice`` for ``pair_id`` of ``store``; 409 with the first
        label when the pair has one already."""
        opened = state.label_store(str(body.get("store", "")))
        try:
            label = opened.label(
                str(body.get("pair_id", "")), str(body.get("choice", "")), str(body.get("labelled_by", ""))
            )
        except AlreadyLabelled as exc:
            return JSONResponse({"detail": str(exc), "label": exc.label.__dict__}, status_code=409)
        except KeyError as exc:
            raise HTTPException(404, str(exc.args[0])) from None
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        return JSONResponse({"label": label.__dict__, "counts": opened.counts()})

    @app.get("/api/labels/export")
    def label_export(store: str) -> StreamingResponse:
        opened = state.label_store(store)
        name = re.sub(r"[^\w.-]", "_", opened.project) or "labels"
        return StreamingResponse(
            labels.export_rows(opened),
            media_type="application/x-ndjson",
            headers={"Content-Disposition": f'attachment; filename="{name}-dpo.jsonl"'},
        )

    # -- errors -----------------------------------------------------------------------------
    @app.exception_handler(ConfigError)
    def _config_error(_request: Request, exc: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "key": exc.key}, status_code=400)

    @app.exception_handler(SourceError)
    def _source_error(_request: Request, exc: SourceError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=400)

    return app


def _config(body: dict) -> dict[str, Any]:
    config = body.get("config", {})
    if not isinstance(config, dict):
        raise ConfigError("the config must be a mapping of sections")
    return config


def _job(state: _State, job_id: int) -> Any:
    try:
        return state.jobs.get(job_id)
    except KeyError:
        raise HTTPException(404, f"no job {job_id}") from None


def _job_dir(resolved_yaml: str) -> str:
    import yaml

    return str(yaml.safe_load(resolved_yaml).get("checkpoint_job_dir") or "")


def _add_token_check(app: FastAPI, token: str) -> None:
    @app.middleware("http")
    async def check_token(request: Request, call_next: Any) -> Response:
        given = request.query_params.get("token")
        if given is not None and secrets.compare_digest(given, token):
            response = await call_next(request)
            # The link printed at start-up carries the token once; the cookie carries it after.
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
            return response
        carried = request.cookies.get(TOKEN_COOKIE) or request.headers.get(TOKEN_HEADER) or ""
        if not secrets.compare_digest(carried, token):
            return PlainTextResponse(
                "Trinity Studio needs its access token: open the URL printed by `trinity studio`.",
                status_code=401,
            )
        return await call_next(request)


class _State:
    """What the studio keeps between requests: jobs, caches of sources, scalars and schemas."""

    def __init__(self, root: str, experience_file: str | None) -> None:
        self.root = root
        self.experience_file = experience_file
        self.config_dir = os.path.join(root, ".studio")
        self.jobs = JobManager()
        self.scalars = ScalarCache()
        self._schema: dict[str, Any] | None = None
        self._components: dict[str, Any] | None = None
        self._sources: dict[tuple[str, str | None], Any] = {}
        self._tokenizers: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.label_stores: list[str] = []

    def schema(self) -> dict[str, Any]:
        if self._schema is None:
            self._schema = config_schema()
        return self._schema

    def components(self) -> dict[str, Any]:
        if self._components is None:
            self._components = components()
        return self._components

    def new_config_path(self, config: dict[str, Any]) -> str:
        label = "-".join(str(config.get(k) or k) for k in ("project", "name"))
        label = re.sub(r"[^\w.-]", "_", label)
        return os.path.join(self.config_dir, f"{label}-{time.strftime('%Y%m%d-%H%M%S')}.yaml")

    def label_store(self, path: str) -> Any:
        """The label store at ``path``: one of the Labels page's (a request never creates one)."""
        from trinity.data.annotation import PreferenceStore

        full = os.path.abspath(os.path.expanduser(path)) if path.strip() else ""
        if full not in labels.label_stores(self.root, self.label_stores):
            raise HTTPException(404, f"no label store {path!r} under {self.root}")
        return PreferenceStore(full)

    def run_path(self, run_id: str) -> str:
        path = os.path.abspath(os.path.join(self.root, run_id))
        if os.path.commonpath([path, self.root]) != self.root or not os.path.isdir(path):
            raise HTTPException(404, f"no run {run_id!r} under {self.root}")
        return path

    def source(self, source: str, table: str | None) -> Any:
        if not source.strip():
            raise SourceError("give an experience source: a .jsonl file, a .db file or an SQL URL")
        key = (source.strip(), table or None)
        with self._lock:
            src = self._sources.get(key)
        if src is None:
            src = open_source(*key)
            with self._lock:
                self._sources[key] = src
        return src

    def run_tokenizer_of(self, source: str) -> str | None:
        """The tokenizer of the run whose folder (under the root) holds the file ``source``."""
        if "://" in source:
            prefix = "sqlite:///"
            if not source.startswith(prefix):
                return None
            source = source[len(prefix) :].split("?")[0]
        path = os.path.abspath(os.path.expanduser(source))
        if os.path.commonpath([path, self.root]) != self.root:
            return None
        folder = os.path.dirname(path)
        while folder != self.root and os.path.commonpath([folder, self.root]) == self.root:
            if config_files(folder):
                return run_tokenizer(folder)
            folder = os.path.dirname(folder)
        return None

    def tokenizer(self, path: str) -> Any:
        """The tokenizer in folder ``path``, loaded once (a failure is remembered too)."""
        with self._lock:
            found = self._tokenizers.get(path)
        if found is None:
            from transformers import AutoTokenizer

            try:
                found = AutoTokenizer.from_pretrained(os.path.expanduser(path), local_files_only=True)
            except Exception as exc:
                lines = str(exc).strip().splitlines() or [type(exc).__name__]
                found = SourceError(f"cannot load a tokenizer from {path}: {lines[0]}")
            with self._lock:
                self._tokenizers[path] = found
        if isinstance(found, SourceError):
            raise SourceError(str(found))
        return found
