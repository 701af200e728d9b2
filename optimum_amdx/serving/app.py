"""The Starlette application: OpenAI routes, /health, /metrics, auth, body limits and admission.

A generation request is checked (fields, model name, prompt length against the model and the KV
pool) before it reaches the engine, so a request that can never run gets a 400 at once. Admitted
requests are counted; beyond `max_num_seqs + max_queue_len` in flight the answer is 429. A client
that goes away is noticed by Starlette (streaming) or by a watcher on the connection (non-streaming)
and its request is aborted, which frees its KV blocks before the next engine step.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..modeling.sampling import SamplingParams
from .detokenizer import IncrementalDetokenizer
from .engine_loop import EngineLoop, TokenEvent
from .metrics import CONTENT_TYPE, ServerMetrics
from .protocol import APIError, GenerationRequest, chunk_body, parse_chat, parse_completion, response_body


@dataclass
class ServerState:
    """Everything the handlers share. `draining` is set on SIGTERM: no new requests are admitted."""

    loop: EngineLoop
    tokenizer: Any
    model_name: str
    max_model_len: int
    stop_token_ids: tuple[int, ...]
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    max_queue_len: int = 128
    draining: bool = False
    in_flight: int = 0
    started: int = field(default_factory=lambda: int(time.time()))
    metrics: ServerMetrics | None = None

    def __post_init__(self) -> None:
        if self.metrics is None:
            self.metrics = ServerMetrics(self.loop, self.model_name)

    @property
    def max_in_flight(self) -> int:
        return self.loop.engine.scheduler.max_num_seqs + self.max_queue_len


def _error(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def _check_auth(state: ServerState, request: Request) -> None:
    if state.api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), state.api_key.encode()):
        raise APIError(401, "Missing or incorrect API key: send 'Authorization: Bearer <key>' with the key given "
                       "to --api-key.", code="invalid_api_key")


async def _read_json(state: ServerState, request: Request) -> dict[str, Any]:
    limit = state.max_body_bytes
    too_big = APIError(413, f"Request body is larger than the limit of {limit} bytes (--max-body-bytes).",
                       code="request_too_large")
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_big
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise too_big
    except ClientDisconnect:
        raise APIError(400, "The client closed the connection while sending the body.") from None
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise APIError(400, f"The request body is not valid JSON: {err}.") from None
    if not isinstance(data, dict):
        raise APIError(400, "The request body must be a JSON object.")
    return data


def _sampling_params(state: ServerState, req: GenerationRequest) -> SamplingParams:
    """Check lengths against the model and pool; build the engine's parameters."""
    prompt_len = len(req.prompt_ids)
    limit = state.max_model_len
    if prompt_len >= limit:
        raise APIError(400, f"The prompt has {prompt_len} tokens but this model's maximum context length is {limit} "
                       "tokens (--max-model-len), including at least one generated token. Shorten the prompt.",
                       param="messages" if req.kind == "chat" else "prompt", code="context_length_exceeded")
    if req.max_tokens is not None and prompt_len + req.max_tokens > limit:
        raise APIError(400, f"This model's maximum context length is {limit} tokens, but {prompt_len} prompt tokens "
                       f"+ max_tokens={req.max_tokens} is {prompt_len + req.max_tokens}. Lower max_tokens or shorten "
                       "the prompt.", param="max_tokens", code="context_length_exceeded")
    max_tokens = req.max_tokens if req.max_tokens is not None else limit - prompt_len
    engine = state.loop.engine
    block = engine.cache.block_size
    need = -(-(prompt_len + max_tokens) // block)
    if need > engine.num_blocks:
        raise APIError(400, f"The request needs {need} KV cache blocks ({prompt_len + max_tokens} tokens) but the "
                       f"whole pool has {engine.num_blocks}. Lower max_tokens or start the server with more KV memory "
                       "(--memory-fraction / --num-gpu-blocks-override).", param="max_tokens",
                       code="context_length_exceeded")
    do_sample = req.temperature > 0
    return SamplingParams(max_new_tokens=max_tokens, do_sample=do_sample,
                          temperature=req.temperature if do_sample else 1.0,
                          top_k=req.top_k if do_sample else 0, top_p=req.top_p if do_sample else 1.0,
                          repetition_penalty=req.repetition_penalty, stop_token_ids=state.stop_token_ids)


class _Generation:
    """One admitted request: submits it, yields (text delta, finish reason), aborts it if left early."""

    def __init__(self, state: ServerState, req: GenerationRequest, params: SamplingParams) -> None:
        self.state = state
        self.req = req
        self.params = params
        self.queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self.detok = IncrementalDetokenizer(state.tokenizer, req.prompt_ids, req.stop)
        self.num_tokens = 0
        self.finish_reason: str | None = None
        self.arrival = time.perf_counter()
        self.first_at: float | None = None
        self.last_at: float | None = None
        self._done = False

    async def events(self) -> AsyncIterator[tuple[str, str | None]]:
        state, metrics = self.state, self.state.metrics
        state.loop.submit(self.req.request_id, self.req.prompt_ids, self.params, self.queue.put_nowait, self.req.seed)
        metrics.prompt_tokens.inc(len(self.req.prompt_ids))
        try:
            while True:
                event = await self.queue.get()
                if event.error is not None:
                    self._done = True
                    metrics.requests.labels(outcome="refused" if event.refused else "error").inc()
                    if event.refused:
                        raise APIError(400, event.error)
                    raise APIError(500, event.error, type="server_error")
                now = time.perf_counter()
                if event.token_ids and self.first_at is None:
                    self.first_at = now
                    metrics.ttft.observe(now - self.arrival)
                self.last_at = now
                self.num_tokens += len(event.token_ids)
                metrics.generation_tokens.inc(len(event.token_ids))
                text = self.detok.add(event.token_ids, final=event.finished)
                if self.detok.stopped and not event.finished:
                    self.finish_reason = "stop"
                    yield text, "stop"
                    return  # the finally clause aborts the engine request
                if event.finished:
                    self._done = True
                    self.finish_reason = "stop" if event.finish_reason in ("stop", "abort") else "length"
                    yield text, self.finish_reason
                    return
                if text:
                    yield text, None
        finally:
            if not self._done:
                state.loop.abort(self.req.request_id)
            if self.finish_reason is not None:
                metrics.requests.labels(outcome=self.finish_reason).inc()
                if self.num_tokens > 1 and self.first_at is not None:
                    metrics.tpot.observe((self.last_at - self.first_at) / (self.num_tokens - 1))
            elif not self._done:
                metrics.requests.labels(outcome="aborted").inc()


def _sse(data: Any) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


async def _stream(gen: _Generation) -> AsyncIterator[bytes]:
    req = gen.req
    try:
        if req.kind == "chat":
            yield _sse(chunk_body(req, None, None, first=True))
        async for text, reason in gen.events():
            yield _sse(chunk_body(req, text, reason))
        if req.include_usage:
            yield _sse(chunk_body(req, None, None, usage_only=(len(req.prompt_ids), gen.num_tokens)))
        yield b"data: [DONE]\n\n"
    except APIError as err:
        yield _sse(err.body())
        yield b"data: [DONE]\n\n"
    finally:
        _release(gen.state)


async def _whole(gen: _Generation, request: Request) -> JSONResponse:
    """Collect the answer, aborting when the client disconnects first."""
    parts: list[str] = []

    async def collect() -> None:
        async for text, _reason in gen.events():
            parts.append(text)

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work, watcher = asyncio.ensure_future(collect()), asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if work not in done:  # the client left: cancelling `collect` aborts the engine request
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
            return JSONResponse({}, status_code=499)
        work.result()
    finally:
        watcher.cancel()
        _release(gen.state)
    return JSONResponse(response_body(gen.req, "".join(parts), gen.finish_reason, gen.num_tokens))


def _release(state: ServerState) -> None:
    state.in_flight -= 1
    state.metrics.in_flight.set(state.in_flight)


def _generation_route(parse: Callable[[dict, str, Any], GenerationRequest]):
    async def handler(request: Request) -> Response:
        state: ServerState = request.app.state.amdx
        try:
            _check_auth(state, request)
            if state.draining:
                raise APIError(503, "The server is shutting down and admits no new requests.", type="server_error")
            body = await _read_json(state, request)
            req = parse(body, state.model_name, state.tokenizer)
            params = _sampling_params(state, req)
            if state.in_flight >= state.max_in_flight:
                raise APIError(429, f"The server has {state.in_flight} requests in flight, its limit "
                               "(--max-num-seqs + --max-queue-len); retry later.", type="rate_limit_error",
                               code="queue_full")
        except APIError as err:
            if err.status >= 400:
                state.metrics.requests.labels(outcome=f"http_{err.status}").inc()
            return _error(err)
        state.in_flight += 1
        state.metrics.in_flight.set(state.in_flight)
        gen = _Generation(state, req, params)
        if req.stream:
            return StreamingResponse(_stream(gen), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            return await _whole(gen, request)
        except APIError as err:
            return _error(err)

    return handler


async def _models(request: Request) -> Response:
    state: ServerState = request.app.state.amdx
    try:
        _check_auth(state, request)
    except APIError as err:
        return _error(err)
    return JSONResponse({"object": "list", "data": [{"id": state.model_name, "object": "model", "created": state.started,
                                                     "owned_by": "optimum-amdx", "max_model_len": state.max_model_len}]})


async def _health(request: Request) -> Response:
    state: ServerState = request.app.state.amdx
    if state.draining or not state.loop.alive:
        return JSONResponse({"status": "draining" if state.draining else "engine stopped"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def _metrics(request: Request) -> Response:
    return Response(request.app.state.amdx.metrics.render(), media_type=CONTENT_TYPE)


async def _not_found(request: Request, exc: Exception) -> Response:
    return _error(APIError(404, f"No route {request.method} {request.url.path}.", code="not_found"))


async def _method_not_allowed(request: Request, exc: Exception) -> Response:
    return _error(APIError(405, f"{request.method} is not allowed on {request.url.path}."))


def build_app(state: ServerState) -> Starlette:
    """The ASGI app; its lifespan starts and stops the engine loop."""
    import contextlib

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        state.loop.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            state.draining = True
            state.loop.stop()

    routes = [
        Route("/v1/completions", _generation_route(parse_completion), methods=["POST"]),
        Route("/v1/chat/completions", _generation_route(parse_chat), methods=["POST"]),
        Route("/v1/models", _models, methods=["GET"]),
        Route("/health", _health, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: _not_found, 405: _method_not_allowed})
    app.state.amdx = state
    return app
