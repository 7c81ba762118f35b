"""The ASGI application: JSON endpoints under /v1/ and the web page at `/`.

Every answer to a bad request is 4xx with the CLI's message (field, problem, fix) and never a
traceback; an unexpected failure is a 500 naming only the exception's type (the server logs it).
"""

import asyncio
import hmac
import json
import logging
import re
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.responses import Response

from planner import __version__
from planner.errors import InputIssue, PlannerInputError, parse_json_text
from planner.service.actions import (
    ACTIONS,
    Limits,
    OutOfTime,
    action_answer,
    catalog_answer,
    problems_answer,
    schema_answer,
    to_json,
)
from planner.service.pool import AnswerCache, Busy, WorkPool
from planner.service.sweep_jobs import (
    SweepJobs,
    SweepLimits,
    TooManySweeps,
    parse_sweep_request,
)

__all__ = ["ServiceSettings", "create_app"]

LOG = logging.getLogger("planner.service")
STATIC = {"app.js": "text/javascript", "charts.js": "text/javascript", "style.css": "text/css"}  # the only files served


@dataclass(frozen=True)
class ServiceSettings:
    token: str | None = None  # bearer token every /v1/ request must carry (None: open, for 127.0.0.1)
    max_body_bytes: int = 1 << 20  # a problem is a few kB, a plan of a 72-accelerator rack ~100 kB
    workers: int = 2  # requests worked on at once
    backlog: int = 4  # requests waiting for a worker; more are answered 503
    request_timeout_s: float = 120.0  # a request's answer, at most (504 after it)
    retry_after_s: int = 5
    cache_answers: int = 128
    limits: Limits = field(default_factory=Limits)
    sweeps: SweepLimits = field(default_factory=SweepLimits)


def _error(status: int, issues: list[InputIssue], message: str, headers: dict | None = None) -> Response:
    record = {"error": message, "issues": [{"field": i.field, "problem": i.problem, "fix": i.fix} for i in issues]}
    return Response(json.dumps(record), status_code=status, headers=headers, media_type="application/json")  # ASCII: any text encodes


def _input_error(exc: PlannerInputError) -> Response:
    return _error(400, list(exc.issues), exc.render())


def _static_text(name: str) -> str:
    return resources.files("planner.service").joinpath("static", name).read_text(encoding="utf-8")


class TooLarge(PlannerInputError):
    """A request body over the server's limit (answered 413)."""

    def __init__(self, limit: int):
        super().__init__(InputIssue("(body)", f"larger than the server's limit of {limit:,} bytes", "send a smaller document"))


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, read no further than `limit` bytes (a declared length over it is refused unread)."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise TooLarge(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_body(raw: bytes) -> object:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlannerInputError(InputIssue("(body)", f"not UTF-8 text (byte {exc.start})", "send the JSON as UTF-8")) from None
    body = parse_json_text(text or "null", "(body)", fix="send a JSON object, e.g. {\"problem\": \"deepseek-v3-gb200-nvl72\"}")
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (\ud800) is valid JSON but no text: no name, file or script can hold it
        raise PlannerInputError(InputIssue("(body)", "a string holds a lone UTF-16 surrogate (\\ud800-\\udfff)", "send real text")) from None
    except RecursionError:
        raise PlannerInputError(InputIssue("(body)", "JSON nested too deeply", "send a problem or plan document")) from None
    return body


def _authorised(request: Request, token: str | None) -> bool:
    if token is None:
        return True
    given = request.headers.get("authorization", "")
    return given.startswith("Bearer ") and hmac.compare_digest(given[len("Bearer "):].encode(), token.encode())


def _run_action(name: str, body: object, limits: Limits, timeout_s: float) -> tuple[str, bytes]:
    """On a worker thread: the answer, its work stopped at the request's deadline (counted from the
    moment a worker takes it)."""
    try:
        answer = action_answer(name, body, replace(limits, deadline=time.monotonic() + timeout_s))
    except OutOfTime:
        raise TimeoutError() from None
    except OverflowError as exc:  # a size the schemas leave unbounded (a model written inline) too large to compute with
        raise PlannerInputError(InputIssue("problem", f"a number is too large to compute with ({exc})",
                                           "give the model's real sizes (layers, hidden size, heads, experts)")) from None
    return ("image/svg+xml", answer.encode()) if isinstance(answer, str) else ("application/json", to_json(answer))


def create_app(settings: ServiceSettings | None = None) -> FastAPI:
    settings = settings or ServiceSettings()
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await asyncio.to_thread(app.state.sweeps.close, settings.sweeps.shutdown_wait_s)  # running sweeps cancelled, their files removed

    app = FastAPI(title="LLM deployment planner", version=__version__, docs_url="/docs", redoc_url=None, lifespan=lifespan)
    pool = WorkPool(settings.workers, settings.backlog, settings.request_timeout_s)
    cache = AnswerCache(settings.cache_answers)
    app.state.pool, app.state.cache, app.state.settings = pool, cache, settings

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if request.url.path.startswith("/v1/") and not _authorised(request, settings.token):
            return _error(401, [InputIssue("Authorization", "missing or wrong bearer token", "send Authorization: Bearer TOKEN")],
                          "unauthorised", {"WWW-Authenticate": "Bearer"})
        try:
            return await call_next(request)
        except Exception as exc:  # never a traceback in an answer
            LOG.exception("unexpected error in %s", request.url.path)
            return _error(500, [], f"internal error ({type(exc).__name__}); the server's log has the details")

    async def act(action: str, request: Request) -> Response:
        if action not in ACTIONS:
            return _error(404, [InputIssue("(path)", f"no endpoint /v1/{action[:40]}", f"use one of: {', '.join(ACTIONS)}")], "not found")
        try:
            body = _parse_body(await _read_body(request, settings.max_body_bytes))
        except PlannerInputError as exc:
            return _error(413 if isinstance(exc, TooLarge) else 400, list(exc.issues), exc.render())
        key = cache.key(action, json.dumps(body, sort_keys=True, default=str).encode())
        cached = cache.get(key)
        if cached is not None:
            return Response(cached[1], media_type=cached[0], headers={"X-Planner-Cache": "hit"})
        try:
            media, content = await pool.run(_run_action, action, body, settings.limits, settings.request_timeout_s)
        except PlannerInputError as exc:
            return _input_error(exc)
        except Busy:
            return _error(503, [], f"busy: {pool.capacity} requests are being worked on or waiting; try again",
                          {"Retry-After": str(settings.retry_after_s)})
        except TimeoutError:
            return _error(504, [], f"no answer within {settings.request_timeout_s:g} s; lower time_limit or ask a smaller question")
        cache.put(key, (media, content))
        return Response(content, media_type=media)

    async def read_json(request: Request) -> object:
        return _parse_body(await _read_body(request, settings.max_body_bytes))

    _add_sweeps(app, settings, read_json)
    _add_actions(app, act)
    _add_reads(app)
    return app


def _busy(what: str, retry_after_s: int) -> Response:
    return _error(503, [], f"busy: {what}; try again", {"Retry-After": str(retry_after_s)})


def _add_sweeps(app: FastAPI, settings: ServiceSettings, read_json) -> None:
    """Sweeps as jobs (planner/service/sweep_jobs.py): submit, poll, read the table, cancel."""
    jobs = app.state.sweeps = SweepJobs(replace(settings.sweeps, time_limit_s=min(settings.sweeps.time_limit_s, settings.limits.time_limit_s)))

    def unknown(job_id: str) -> Response:
        return _error(404, [InputIssue("(path)", f"no sweep {job_id[:40]!r} (finished sweeps are kept {settings.sweeps.keep} at most)",
                                       "submit it again with POST /v1/sweeps")], "not found")

    from planner.service.openapi import sweep_request_schema

    body_schema = {"requestBody": {"required": True, "content": {"application/json": {"schema": sweep_request_schema()}}}}

    @app.post("/v1/sweeps", status_code=202, summary="`planner sweep SPEC` as a job: answers its id and where to poll it", openapi_extra=body_schema)
    async def submit(request: Request) -> Response:
        try:
            body = await read_json(request)
            spec, points, base_dir = await app.state.pool.run(parse_sweep_request, body, jobs.limits.max_points)
            job = jobs.submit(spec, points, base_dir)
        except PlannerInputError as exc:
            return _error(413 if isinstance(exc, TooLarge) else 400, list(exc.issues), exc.render())
        except Busy:
            return _busy(f"{app.state.pool.capacity} requests are being worked on or waiting", settings.retry_after_s)
        except TooManySweeps:
            return _busy(f"{jobs.limits.max_running} sweep(s) running, the most this server runs at once", settings.retry_after_s)
        return Response(to_json(job.record()), status_code=202, media_type="application/json", headers={"Location": f"/v1/sweeps/{job.id}"})

    @app.get("/v1/sweeps/{job_id}", summary="a sweep's status, points done of all, and when done the summary `planner sweep` prints")
    async def progress(job_id: str) -> Response:
        job = jobs.get(job_id)
        return unknown(job_id) if job is None else Response(to_json(job.record()), media_type="application/json")

    @app.get("/v1/sweeps/{job_id}/table", summary="the sweep's table: JSON rows, or `planner sweep`'s CSV with ?format=csv")
    async def table(job_id: str, request: Request) -> Response:
        from planner.output.sweep_table import columns_of, table_csv

        job, fmt = jobs.get(job_id), request.query_params.get("format", "json")
        if job is None:
            return unknown(job_id)
        if fmt not in ("json", "csv"):
            return _error(400, [InputIssue("format", f"unknown table format {fmt[:40]!r}", "use json or csv")], "bad format")
        if job.state not in ("done", "cancelled"):
            return _error(409, [InputIssue("(path)", f"the sweep is {job.state} ({job.done} of {len(job.points)} points)",
                                           f"poll /v1/sweeps/{job.id} until its status is done")], f"sweep {job.state}")
        if fmt == "csv":  # the file name from the sweep's name, kept to characters any header can carry
            filename = re.sub(r"[^A-Za-z0-9._-]", "_", job.spec.name)
            return Response(table_csv(job.rows), media_type="text/csv", headers={"Content-Disposition": f'attachment; filename="{filename}.csv"'})
        return Response(to_json({"name": job.spec.name, "status": job.state, "columns": columns_of(job.rows), "rows": job.rows}),
                        media_type="application/json")

    @app.delete("/v1/sweeps/{job_id}", summary="cancel a queued or running sweep (a finished one is forgotten)")
    async def cancel(job_id: str) -> Response:
        job = jobs.cancel(job_id)
        return unknown(job_id) if job is None else Response(to_json(job.record()), media_type="application/json")


def _add_actions(app: FastAPI, act) -> None:
    """One documented POST route per action (request bodies from planner/service/openapi.py), then a
    catch-all that names the endpoints that exist."""
    from fastapi.openapi.utils import get_openapi

    from planner.service.openapi import add_schemas, request_schema

    for name, function in ACTIONS.items():
        async def endpoint(request: Request, _name: str = name) -> Response:
            return await act(_name, request)

        body = {"requestBody": {"required": True, "content": {"application/json": {"schema": request_schema(name)}}}}
        app.add_api_route(f"/v1/{name}", endpoint, methods=["POST"], summary=(function.__doc__ or name).strip().split("\n")[0],
                          openapi_extra=body, name=name)

    @app.post("/v1/{action}", include_in_schema=False)
    async def unknown(action: str, request: Request) -> Response:
        return await act(action, request)

    def openapi() -> dict:
        if app.openapi_schema is None:
            app.openapi_schema = add_schemas(get_openapi(title=app.title, version=app.version, routes=app.routes))
        return app.openapi_schema

    app.openapi = openapi


def _add_reads(app: FastAPI) -> None:
    """The GET endpoints: the catalog, the schemas, the bundled problems, health, and the page."""

    @app.get("/v1/catalog")
    async def catalog() -> Response:
        return Response(to_json(catalog_answer()), media_type="application/json")

    @app.get("/v1/schema/{kind}")
    async def schema(kind: str) -> Response:
        try:
            return Response(to_json(schema_answer(kind)), media_type="application/json")
        except PlannerInputError as exc:
            return _input_error(exc)

    @app.get("/v1/problems")
    async def problems() -> Response:
        return Response(to_json(problems_answer()), media_type="application/json")

    @app.get("/v1/health")
    async def health(request: Request) -> dict:
        pool = request.app.state.pool
        return {"version": __version__, "workers": pool.workers, "admitted": pool.admitted, "capacity": pool.capacity,
                "sweeps_running": request.app.state.sweeps.running()}

    @app.get("/", include_in_schema=False)
    async def page() -> Response:
        return Response(_static_text("index.html"), media_type="text/html")

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        if name not in STATIC:  # a fixed list: the name never becomes a path
            return _error(404, [InputIssue("(path)", "no such file", f"use one of: {', '.join(STATIC)}")], "not found")
        return Response(_static_text(name), media_type=STATIC[name])
