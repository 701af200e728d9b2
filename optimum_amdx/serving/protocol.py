"""The OpenAI request and response shapes the server speaks, and the checks on every request field.

Only fields that this server honours are accepted; a field that would change the answer and that
the engine cannot do (logprobs, penalties, tools, n > 1, ...) is refused with a 400 and an
OpenAI-style error body naming the field, never silently dropped. Fields that are only metadata
(`user`, `metadata`, `store`) are accepted. A field set to its neutral value (for example
`frequency_penalty: 0`, `n: 1`, `logprobs: null`) is accepted because it asks for nothing.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any


class APIError(Exception):
    """An error answered to the client as `{"error": {...}}` with an HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "n", "stream",
           "stream_options", "repetition_penalty", "user", "metadata", "store"}
COMPLETION_FIELDS = _COMMON | {"prompt"}
CHAT_FIELDS = _COMMON | {"messages", "max_completion_tokens"}

_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0, None), "presence_penalty": (0, 0.0, None), "logprobs": (None, False),
    "top_logprobs": (None, 0), "echo": (False, None), "best_of": (1, None), "suffix": (None, ""),
    "logit_bias": (None, {}), "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []),
    "function_call": (None, "none"), "parallel_tool_calls": (None,), "response_format": (None, {"type": "text"}),
    "service_tier": (None, "auto", "default"), "prediction": (None,), "modalities": (None, ["text"]),
    "audio": (None,), "reasoning_effort": (None,), "web_search_options": (None,),
}
"""Fields this server does not implement, with the values that ask for nothing (accepted)."""

MAX_STOP_SEQUENCES = 4


@dataclass
class GenerationRequest:
    """A checked completion or chat request, ready for the engine."""

    kind: str  # "completion" or "chat"
    model: str
    prompt_ids: list[int]
    max_tokens: int | None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    request_id: str = ""
    created: int = 0


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_fields(body: dict[str, Any], allowed: set[str]) -> None:
    """Refuse unknown fields and unsupported fields set to a non-neutral value."""
    for name, value in body.items():
        if name in allowed:
            continue
        if name in _NEUTRAL:
            if value in _NEUTRAL[name]:
                continue
            raise APIError(400, f"'{name}' is not supported by this server (got {value!r}); remove it.", param=name,
                           code="unsupported_parameter")
        raise APIError(400, f"Unknown field '{name}'; this server accepts: {', '.join(sorted(allowed))}.",
                       param=name, code="unknown_parameter")


def _sampling_fields(body: dict[str, Any], req: GenerationRequest) -> None:
    n = body.get("n", 1)
    if n is not None and (not _is_int(n) or n != 1):
        raise APIError(400, f"'n' must be 1 (one choice per request), got {n!r}.", param="n")
    temperature = body.get("temperature")
    if temperature is not None:
        if not _is_number(temperature) or not 0 <= temperature <= 2:
            raise APIError(400, f"'temperature' must be a number in [0, 2], got {temperature!r}.", param="temperature")
        req.temperature = float(temperature)
    top_p = body.get("top_p")
    if top_p is not None:
        if not _is_number(top_p) or not 0 < top_p <= 1:
            raise APIError(400, f"'top_p' must be a number in (0, 1], got {top_p!r}.", param="top_p")
        req.top_p = float(top_p)
    top_k = body.get("top_k")
    if top_k is not None:
        if not _is_int(top_k) or top_k < -1:
            raise APIError(400, f"'top_k' must be an integer >= 0 (0 or -1: off), got {top_k!r}.", param="top_k")
        req.top_k = max(0, top_k)
    rep = body.get("repetition_penalty")
    if rep is not None:
        if not _is_number(rep) or rep <= 0:
            raise APIError(400, f"'repetition_penalty' must be a positive number, got {rep!r}.",
                           param="repetition_penalty")
        req.repetition_penalty = float(rep)
    seed = body.get("seed")
    if seed is not None:
        if not _is_int(seed):
            raise APIError(400, f"'seed' must be an integer, got {seed!r}.", param="seed")
        req.seed = seed
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if (not isinstance(stops, list) or len(stops) > MAX_STOP_SEQUENCES
                or not all(isinstance(s, str) and s for s in stops)):
            raise APIError(400, f"'stop' must be a non-empty string or a list of up to {MAX_STOP_SEQUENCES} "
                           f"non-empty strings, got {stop!r}.", param="stop")
        req.stop = list(stops)
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise APIError(400, f"'stream' must be true or false, got {stream!r}.", param="stream")
    req.stream = bool(stream)
    options = body.get("stream_options")
    if options is not None:
        if not req.stream:
            raise APIError(400, "'stream_options' is only allowed with 'stream': true.", param="stream_options")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise APIError(400, f"'stream_options' supports only include_usage, got {options!r}.",
                           param="stream_options")
        req.include_usage = bool(options.get("include_usage", False))


def _max_tokens(body: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value) or value < 1:
            raise APIError(400, f"'{name}' must be a positive integer, got {value!r}.", param=name)
        return value
    return None


def _check_model(body: dict[str, Any], served: str) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, "'model' is required (a string); see GET /v1/models.", param="model")
    if model != served:
        raise APIError(404, f"The model '{model}' does not exist on this server; it serves '{served}'.",
                       param="model", code="model_not_found")
    return model


def _new(kind: str, body: dict[str, Any], served: str, prompt_ids: list[int], max_tokens: int | None,
         prefix: str) -> GenerationRequest:
    req = GenerationRequest(kind=kind, model=served, prompt_ids=prompt_ids, max_tokens=max_tokens,
                            request_id=f"{prefix}-{uuid.uuid4().hex}", created=int(time.time()))
    _sampling_fields(body, req)
    return req


def parse_completion(body: dict[str, Any], served: str, tokenizer: Any) -> GenerationRequest:
    """Check a /v1/completions body and tokenize its prompt."""
    check_fields(body, COMPLETION_FIELDS)
    _check_model(body, served)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "'prompt' is empty; give some text.", param="prompt")
        ids = list(tokenizer(prompt)["input_ids"])
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        vocab = len(tokenizer)
        if any(not 0 <= t < vocab for t in prompt):
            raise APIError(400, f"'prompt' token ids must be in [0, {vocab}).", param="prompt")
        ids = list(prompt)
    else:
        raise APIError(400, "'prompt' must be one string or one list of token ids (batches of prompts are not "
                       "supported: send one request per prompt).", param="prompt")
    return _new("completion", body, served, ids, _max_tokens(body, "max_tokens"), "cmpl")


def _message_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(400, f"messages[{index}].content: only text parts ({{'type': 'text', 'text': ...}}) "
                               "are supported.", param=f"messages[{index}].content")
            parts.append(part["text"])
        return "".join(parts)
    raise APIError(400, f"messages[{index}].content must be a string or a list of text parts.",
                   param=f"messages[{index}].content")


def parse_chat(body: dict[str, Any], served: str, tokenizer: Any) -> GenerationRequest:
    """Check a /v1/chat/completions body and render its messages with the tokenizer's chat template."""
    check_fields(body, CHAT_FIELDS)
    _check_model(body, served)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list of {role, content}.", param="messages")
    rendered = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in ("system", "developer", "user", "assistant"):
            raise APIError(400, f"messages[{i}] needs a role of system, developer, user or assistant.",
                           param=f"messages[{i}].role")
        extra = set(msg) - {"role", "content", "name"}
        if extra:
            raise APIError(400, f"messages[{i}] has unsupported fields {sorted(extra)} (tool calls are not supported).",
                           param=f"messages[{i}]")
        role = "system" if msg["role"] == "developer" else msg["role"]
        rendered.append({"role": role, "content": _message_text(msg.get("content"), i)})
    if getattr(tokenizer, "chat_template", None) is None:
        raise APIError(400, "This model's tokenizer has no chat template; use /v1/completions.", param="messages")
    text = tokenizer.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True)
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    return _new("chat", body, served, ids, _max_tokens(body, "max_completion_tokens", "max_tokens"), "chatcmpl")


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response_body(req: GenerationRequest, text: str, finish_reason: str | None, completion_tokens: int) -> dict:
    """The whole (non-streamed) answer."""
    if req.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": req.request_id, "object": obj, "created": req.created, "model": req.model, "choices": [choice],
            "usage": usage(len(req.prompt_ids), completion_tokens)}


def chunk_body(req: GenerationRequest, text: str | None, finish_reason: str | None, *, first: bool = False,
               usage_only: tuple[int, int] | None = None) -> dict:
    """One server-sent event of a streamed answer (`usage_only`: the final usage chunk)."""
    chat = req.kind == "chat"
    body: dict[str, Any] = {"id": req.request_id, "object": "chat.completion.chunk" if chat else "text_completion",
                            "created": req.created, "model": req.model}
    if usage_only is not None:
        body["choices"] = []
        body["usage"] = usage(*usage_only)
        return body
    if chat:
        delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        body["choices"] = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    else:
        body["choices"] = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}]
    if usage_only is None and req.include_usage:
        body["usage"] = None
    return body
