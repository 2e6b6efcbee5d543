"""The FastAPI application: one route table, thin handlers, errors mapped in one place."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from specdeploy_server.api import contract, openapi
from specdeploy_server.api.admission import AdmissionGate, authorized
from specdeploy_server.api.errors import (
    APIError,
    AuthenticationError,
    BadRequestError,
    MethodNotAllowedError,
    OverloadedError,
    PayloadTooLargeError,
    RouteNotFoundError,
    error_response,
    queue_full_error,
    shutting_down_error,
)
from specdeploy_server.api.failsafe import InternalErrors
from specdeploy_server.api.fields import DEFAULT_UNKNOWN_FIELDS, UnknownFields, UnknownFieldsPolicy
from specdeploy_server.api.limits import DEFAULT_MAX_REQUEST_BODY_BYTES, BodySizeLimit
from specdeploy_server.api.protocol import ChatCompletionRequest, CompletionRequest
from specdeploy_server.api.responses_api import document as responses_document
from specdeploy_server.api.responses_api.protocol import ResponsesRequest
from specdeploy_server.api.responses_api.serving import ResponsesServing
from specdeploy_server.api.serving import OpenAIServing, Run, ServingSettings
from specdeploy_server.engine import EngineClient, ObservableEngine
from specdeploy_server.metrics import ServerMetrics

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class AppState:
    engine: EngineClient
    serving: OpenAIServing
    metrics: ServerMetrics
    api_key: str | None
    shutdown_timeout: float
    draining: bool = False
    loop: asyncio.AbstractEventLoop | None = None  # the server's, once started
    drain_task: asyncio.Task[None] | None = None

    def begin_drain(self) -> None:
        """Start draining (SIGTERM): readiness and new requests answer 503 from now on, and the engine gives
        in-flight requests ``shutdown_timeout`` seconds from now, then aborts the rest (``finish_reason:
        abort``, so their responses still end properly). Safe to call from a signal handler."""
        self.draining = True
        if self.loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed: nothing left to drain
                self.loop.call_soon_threadsafe(self.drain)

    def refusal(self) -> OverloadedError | None:
        """Why no generation request is taken now (shutting down, the engine's queue full), or None."""
        if self.draining:
            return shutting_down_error()
        if self.engine.queue_full():
            return queue_full_error()
        return None

    def drain(self) -> asyncio.Task[None]:
        """The engine's drain, begun once (on the server's loop)."""
        self.draining = True
        if self.drain_task is None:
            self.drain_task = asyncio.get_running_loop().create_task(
                self.engine.stop(self.shutdown_timeout), name="drain"
            )
        return self.drain_task


def create_app(
    engine: EngineClient,
    served_model_name: str | None = None,
    api_key: str | None = None,
    default_max_tokens: int = 16,
    shutdown_timeout: float = 30.0,
    *,
    served_model_aliases: Sequence[str] = (),
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
    unknown_fields: UnknownFields = DEFAULT_UNKNOWN_FIELDS,
) -> FastAPI:
    name = served_model_name or engine.info.served_model_name
    metrics = ServerMetrics(name)
    metrics.bind_load(
        lambda: float(engine.queue_depth), lambda: engine.queue_seconds, lambda: engine.generation_rate
    )
    if isinstance(engine, ObservableEngine):
        engine.attach_observer(metrics)
        if engine.executor_stats is not None:
            metrics.bind_executor_stats(engine.executor_stats)
    settings = ServingSettings(name, default_max_tokens, tuple(served_model_aliases))
    state = AppState(
        engine=engine,
        serving=OpenAIServing(engine, settings, metrics),
        metrics=metrics,
        api_key=api_key,
        shutdown_timeout=shutdown_timeout,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        state.loop = asyncio.get_running_loop()
        try:
            yield
        finally:
            await state.drain()  # begun at SIGTERM (begin_drain), or now

    app = FastAPI(title="specdeploy-server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.specdeploy = state
    app.openapi = lambda: openapi.openapi_document(app, settings.served_model_names)  # type: ignore[method-assign]
    _install_error_handlers(app, state)
    _install_routes(app, state)
    app.add_middleware(UnknownFieldsPolicy, policy=unknown_fields)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=max_request_body_bytes,
        on_refused=lambda: metrics.errors.labels(metrics.model, PayloadTooLargeError.type).inc(),
    )
    app.add_middleware(  # refuses at the headers: before the body is read, parsed, validated
        AdmissionGate,
        refusal=state.refusal,
        api_key=api_key,
        on_refused=lambda error: metrics.errors.labels(metrics.model, error.type).inc(),
    )
    app.add_middleware(  # outermost: answers what nothing else handled, keeping the connection usable, and
        InternalErrors,  # counts every request by its status, the 413s, 503s and its own 500s too
        on_error=lambda error: metrics.errors.labels(metrics.model, error.type).inc(),
        on_done=_RequestCounter(state.metrics).count,
    )
    return app


def app_state(app: FastAPI) -> AppState:
    state: AppState = app.state.specdeploy
    return state


def _install_error_handlers(app: FastAPI, state: AppState) -> None:
    def respond(exc: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
        state.metrics.errors.labels(state.metrics.model, exc.type).inc()
        return error_response(exc, headers)

    async def on_api_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return respond(exc)

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return respond(_validation_error(exc))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            return respond(RouteNotFoundError("no such endpoint"))
        if exc.status_code == 405:  # Starlette's `Allow` names the first route's methods: name every route's
            allow = ", ".join(sorted(_allowed_methods(app, request)))
            headers = {**(exc.headers or {}), **({"Allow": allow} if allow else {})}
            return respond(MethodNotAllowedError("method not allowed for this endpoint"), headers)
        if exc.status_code == 413:
            return respond(PayloadTooLargeError(str(exc.detail)), {"Connection": "close"})
        error = APIError(str(exc.detail))
        error.status = exc.status_code
        error.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return respond(error)

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)


def _allowed_methods(app: FastAPI, request: Request) -> set[str]:
    """The methods of every route of the request's path (a path may have a route per method)."""
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, APIRoute) and route.matches(request.scope)[0] != Match.NONE:
            methods |= route.methods or set()
    return methods


def _validation_error(exc: RequestValidationError) -> BadRequestError:
    errors = exc.errors()
    if not errors:
        return BadRequestError("invalid request")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return BadRequestError("the request body is not valid JSON", code="invalid_json")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    # unions report one error per member; name the field and the first reason
    param = loc[0] if loc else None
    where = ".".join(p for p in loc if not p[:1].isupper() and not p.startswith(("function-", "list[")))
    reason = str(first.get("msg", "invalid value"))
    message = f"{where}: {reason}" if where else reason
    return BadRequestError(message, param=param)


def _install_routes(app: FastAPI, state: AppState) -> None:
    serving = state.serving

    def authorize(request: Request) -> None:
        if not authorized(request.headers, state.api_key):
            raise AuthenticationError("Incorrect or missing API key (Authorization: Bearer <key>)")

    def admit(request: Request) -> None:
        """The admission gate's checks again, for a request that passed it just before the queue filled or
        the drain began (the scheduler refuses one that does not fit at ``add`` in any case)."""
        authorize(request)
        error = state.refusal()
        if error is not None:
            raise error

    @app.get("/v1/models", response_model=None, responses=openapi.MODELS_RESPONSES)
    async def models(request: Request) -> Response:
        authorize(request)
        return _answer(serving.list_models())

    @app.get("/v1/models/{model:path}", response_model=None, responses=openapi.MODEL_RESPONSES)
    async def model(model: str, request: Request) -> Response:
        authorize(request)
        return _answer(serving.retrieve_model(model))

    @app.post(
        "/v1/completions",
        response_model=None,
        responses=openapi.generation_responses(contract.Completion, contract.CompletionChunk),
    )
    async def completions(body: CompletionRequest, request: Request) -> Response:
        admit(request)
        if body.stream:
            run = serving.start(await serving.prepare_completion(body))
            return _sse_response(serving.stream_completion(run), run)
        return _answer(await _unless_disconnected(request, serving.completion(body)))

    @app.post(
        "/v1/chat/completions",
        response_model=None,
        responses=openapi.generation_responses(contract.ChatCompletion, contract.ChatCompletionChunk),
    )
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        admit(request)
        if body.stream:
            run = serving.start(await serving.prepare_chat(body))
            return _sse_response(serving.stream_chat(run), run)
        return _answer(await _unless_disconnected(request, serving.chat(body)))

    responses_serving = ResponsesServing(serving)

    @app.post("/v1/responses", response_model=None, responses=responses_document.CREATE_RESPONSES)
    async def create_response(body: ResponsesRequest, request: Request) -> Response:
        admit(request)
        if body.stream:
            pending = await responses_serving.prepare(body)
            run = responses_serving.start(pending)
            return _sse_response(responses_serving.stream(pending, run), run)
        return _answer(await _unless_disconnected(request, responses_serving.create(body)))

    @app.get(RESPONSE_PATH, response_model=None, responses=responses_document.GET_RESPONSES)
    async def get_response(response_id: str, request: Request) -> Response:
        authorize(request)
        return _answer(responses_serving.retrieve(response_id))

    @app.delete(RESPONSE_PATH, response_model=None, responses=responses_document.DELETE_RESPONSES)
    async def delete_response(response_id: str, request: Request) -> Response:
        authorize(request)
        return _answer(responses_serving.delete(response_id))

    @app.get("/health/live", response_model=None, responses=openapi.HEALTH_RESPONSES)
    async def live() -> Response:
        ok = state.engine.ready or state.draining
        return _answer(contract.Health(status="ok" if ok else "engine stopped"), 200 if ok else 503)

    @app.get("/health", response_model=None, responses=openapi.HEALTH_RESPONSES)
    @app.get("/health/ready", response_model=None, responses=openapi.HEALTH_RESPONSES)
    async def ready() -> Response:
        ok = state.engine.ready and not state.draining
        status = "ready" if ok else ("draining" if state.draining else "not ready")
        return _answer(contract.Health(status=status), 200 if ok else 503)

    @app.get("/metrics", responses=openapi.METRICS_RESPONSES)
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


#: a stored response's path: counted under this name, not one series per id
RESPONSE_PATH = "/v1/responses/{response_id}"
#: (path, status) pairs whose request counters the middleware keeps at hand
MAX_COUNTED_PATHS = 256


class _RequestCounter:
    """Counts /v1 requests by path and status (told by the outermost middleware how each ended)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self._counters: dict[tuple[str, int], Any] = {}  # (path, status) -> its child, looked up once

    def count(self, scope: Scope, status: int) -> None:
        path = scope.get("path", "")
        if not path.startswith("/v1/"):
            return
        if path.startswith("/v1/responses/"):
            path = RESPONSE_PATH
        counter = self._counters.get((path, status))
        if counter is None:
            counter = self.metrics.requests.labels(self.metrics.model, path, str(status))
            if len(self._counters) < MAX_COUNTED_PATHS:  # paths come from clients: bound the cache
                self._counters[(path, status)] = counter
        counter.inc()


class _RunResponse(StreamingResponse):
    """An SSE response that ends its request however the response ends: streamed to the end, the client gone
    (Starlette cancels the body, possibly before it was ever started), or the server stopping."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            close = getattr(self.body_iterator, "aclose", None)
            if close is not None:
                await close()  # the events' own cleanup (metrics) first
            await self._on_close()


def _sse_response(events: AsyncIterator[str], run: Run) -> StreamingResponse:
    return _RunResponse(events, run.close)


async def _wait_for_disconnect(request: Request) -> None:
    """Return when the client has gone: the body is read, so the next ASGI message is ``http.disconnect``
    (or, once the response is sent, a late one). Nothing polls; the server wakes this when it happens."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


CLIENT_CLOSED_REQUEST = 499
"""nginx's status for a request its client abandoned: what the request counter records for them (the
response itself goes nowhere)."""


def _answer(body: BaseModel | None, status: int = 200) -> Response:
    if body is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return JSONResponse(contract.body(body), status_code=status)


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T | None:
    """Run ``work``; cancel it (and so the generation) if the client goes away first, and return None then
    (raising would make uvicorn log every abandoned request as an exception in the application)."""
    task = asyncio.ensure_future(work)
    listener = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, listener}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    finally:
        listener.cancel()
        if not task.done():
            task.cancel()
