"""The server on a tiny random model, driven by the official `openai` client over real sockets."""

from __future__ import annotations

import json
import threading

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from optimum_amdx.modeling import AMDModelForCausalLM, SamplingParams  # noqa: E402
from optimum_amdx.models import load_tokenizer  # noqa: E402

from .conftest import expected_text, running_server  # noqa: E402

KEY = "sk-test-key"


@pytest.fixture(scope="module")
def tok(tiny_dir):
    return load_tokenizer(tiny_dir)


@pytest.fixture(scope="module")
def server(tiny_dir, tok):
    model = AMDModelForCausalLM.from_pretrained(tiny_dir, device="cpu", num_blocks=64, block_size=4,
                                                max_num_seqs=4, max_model_len=128)
    with running_server(model, tok, api_key=KEY, max_body_bytes=4096, max_queue_len=2) as (url, state):
        yield url, state


@pytest.fixture(scope="module")
def reference(tiny_dir, tok):
    """Greedy continuation computed by a separate engine, one request at a time."""
    model = AMDModelForCausalLM.from_pretrained(tiny_dir, device="cpu", num_blocks=64, block_size=8, max_model_len=128)
    stops = (tok.eos_token_id,)

    def continuation(prompt_ids: list[int], max_tokens: int) -> tuple[str, list[int]]:
        out = model.engine.generate([prompt_ids], SamplingParams(max_new_tokens=max_tokens, stop_token_ids=stops))[0]
        return expected_text(tok, prompt_ids, out), out

    return continuation


def _client(url: str, key: str = KEY):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def test_completion_streamed_and_not_match_the_engine_alone(server, tok, reference):
    url, _ = server
    client = _client(url)
    prompt = "the value of a function is"
    want, out = reference(tok(prompt)["input_ids"], 12)
    res = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
    assert res.choices[0].text == want
    assert res.choices[0].finish_reason == ("stop" if out[-1] == tok.eos_token_id else "length")
    assert (res.usage.prompt_tokens, res.usage.completion_tokens) == (len(tok(prompt)["input_ids"]), len(out))
    chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == res.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == len(out)


def test_chat_streamed_and_not(server, tok, reference):
    url, _ = server
    client = _client(url)
    messages = [{"role": "system", "content": "the name"}, {"role": "user", "content": "value of a class"}]
    ids = tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
              add_special_tokens=False)["input_ids"]
    want, out = reference(ids, 10)
    res = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
    assert res.choices[0].message.role == "assistant" and res.choices[0].message.content == want
    assert res.usage.prompt_tokens == len(ids) and res.usage.completion_tokens == len(out)
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_stop_strings_seed_and_sampling(server, tok, reference):
    url, _ = server
    client = _client(url)
    prompt = "the value of a function is"
    full, _ = reference(tok(prompt)["input_ids"], 12)
    words = full.split()
    res = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, stop=[words[2]])
    assert res.choices[0].finish_reason == "stop" and res.choices[0].text == full[:full.find(words[2])]
    sampled = [client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=1.5, top_p=0.95,
                                         seed=s, extra_body={"top_k": 50}).choices[0].text for s in (7, 7, 8)]
    assert sampled[0] == sampled[1]
    assert sampled[0] != full or sampled[2] != full


def test_models_health_metrics(server):
    url, state = server
    assert [m.id for m in _client(url).models.list().data] == ["tiny"]
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    text = httpx.get(f"{url}/metrics").text
    for name in ("amdx_num_requests_waiting", "amdx_num_requests_running", "amdx_kv_blocks_free",
                 "amdx_kv_blocks_used", "amdx_time_to_first_token_seconds_bucket",
                 "amdx_time_per_output_token_seconds_bucket", "amdx_generation_tokens_total"):
        assert name in text


def _post(url: str, body: bytes | str, key: str | None = KEY, path: str = "/v1/completions") -> httpx.Response:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return httpx.post(f"{url}{path}", content=body, headers=headers, timeout=60)


def test_bad_requests_get_openai_error_bodies(server):
    url, state = server
    cases = [
        (_post(url, "{not json"), 400, None),
        (_post(url, "[1, 2]"), 400, None),
        (_post(url, json.dumps({"model": "gpt-4", "prompt": "the"})), 404, "model_not_found"),
        (_post(url, json.dumps({"model": "tiny", "prompt": "the", "max_tokens": -3})), 400, None),
        (_post(url, json.dumps({"model": "tiny", "prompt": "the " * 3000})), 413, "request_too_large"),
        (_post(url, json.dumps({"model": "tiny", "prompt": "the"}), key="wrong"), 401, "invalid_api_key"),
        (_post(url, json.dumps({"model": "tiny", "prompt": "the"}), key=None), 401, "invalid_api_key"),
        (_post(url, json.dumps({"model": "tiny", "prompt": "the " * 200})), 400, "context_length_exceeded"),
        (_post(url, json.dumps({"model": "tiny", "prompt": "the", "max_tokens": 200})), 400, "context_length_exceeded"),
        (_post(url, json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "a"}], "tools": [{}]}),
               path="/v1/chat/completions"), 400, "unsupported_parameter"),
        (httpx.get(f"{url}/v1/nothing"), 404, "not_found"),
    ]
    for res, status, code in cases:
        assert res.status_code == status, res.text
        err = res.json()["error"]
        assert err["message"] and err["type"]
        if code is not None:
            assert err["code"] == code
    client = _client(url)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="the")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="the", max_tokens=-1)
    with pytest.raises(openai.AuthenticationError):
        _client(url, key="bad").completions.create(model="tiny", prompt="the")
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(model="tiny", prompt="the " * 3000)
    assert info.value.status_code == 413
    assert state.loop.engine.num_free_blocks == state.loop.engine.num_blocks


def test_queue_full_gets_429_and_frees_everything(server, tok):
    url, state = server
    limit = state.max_in_flight  # max_num_seqs 4 + max_queue_len 2
    client = _client(url)
    streams = [client.completions.create(model="tiny", prompt="the value", max_tokens=100, temperature=0, stream=True)
               for _ in range(limit)]
    try:
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model="tiny", prompt="the", max_tokens=2)
    finally:
        threads = [threading.Thread(target=lambda s=s: [None for _ in s]) for s in streams]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    res = client.completions.create(model="tiny", prompt="the", max_tokens=2, temperature=0)
    assert res.usage.completion_tokens >= 1
    assert state.in_flight == 0 and state.loop.engine.num_free_blocks == state.loop.engine.num_blocks


def _aborted(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith('amdx_requests_total{outcome="aborted"}'):
            return float(line.split()[-1])
    return 0.0


def test_client_that_gives_up_on_a_whole_answer_aborts_it(server):
    url, state = server
    engine = state.loop.engine
    before = _aborted(url)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{url}/v1/completions", timeout=httpx.Timeout(60, read=0.05),
                   headers={"authorization": f"Bearer {KEY}"},
                   json={"model": "tiny", "prompt": "the", "max_tokens": 120, "temperature": 0})
    for _ in range(200):  # bounded: the abort lands within a few engine steps
        if state.in_flight == 0 and engine.num_free_blocks == engine.num_blocks and not engine.has_unfinished():
            break
        threading.Event().wait(0.05)
    assert state.in_flight == 0 and engine.num_free_blocks == engine.num_blocks and not engine.has_unfinished()
    assert _aborted(url) == before + 1
