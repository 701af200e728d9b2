"""Request checks and the streaming detokenizer, without a server."""

from __future__ import annotations

import pytest

from optimum_amdx.serving.detokenizer import IncrementalDetokenizer
from optimum_amdx.serving.protocol import APIError, parse_chat, parse_completion

from .conftest import build_tokenizer, expected_text


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_completion_fields_are_checked(tok):
    req = parse_completion({"model": "m", "prompt": "the value of", "max_tokens": 5, "temperature": 0.5,
                            "top_p": 0.9, "top_k": 7, "seed": 3, "stop": ["of"], "n": 1,
                            "frequency_penalty": 0, "user": "u"}, "m", tok)
    assert (req.max_tokens, req.temperature, req.top_p, req.top_k, req.seed, req.stop) == (5, 0.5, 0.9, 7, 3, ["of"])
    assert req.prompt_ids == _ids(tok, "the value of") and req.kind == "completion"
    bad = [({"prompt": "x"}, 400, "model"), ({"model": "other", "prompt": "x"}, 404, "model"),
           ({"model": "m", "prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
           ({"model": "m", "prompt": "x", "max_tokens": True}, 400, "max_tokens"),
           ({"model": "m", "prompt": "x", "n": 2}, 400, "n"),
           ({"model": "m", "prompt": "x", "logprobs": 2}, 400, "logprobs"),
           ({"model": "m", "prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty"),
           ({"model": "m", "prompt": "x", "wibble": 1}, 400, "wibble"),
           ({"model": "m", "prompt": ["a", "b"]}, 400, "prompt"),
           ({"model": "m", "prompt": [1, 10**9]}, 400, "prompt"),
           ({"model": "m", "prompt": "x", "temperature": 3}, 400, "temperature"),
           ({"model": "m", "prompt": "x", "top_p": 0}, 400, "top_p"),
           ({"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
           ({"model": "m", "prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options")]
    for body, status, param in bad:
        with pytest.raises(APIError) as info:
            parse_completion(body, "m", tok)
        assert (info.value.status, info.value.param) == (status, param), body
        assert info.value.body()["error"]["message"]


def test_chat_uses_the_chat_template(tok):
    req = parse_chat({"model": "m", "messages": [{"role": "system", "content": "the"},
                                                 {"role": "user", "content": [{"type": "text", "text": "value"}]}],
                      "max_completion_tokens": 4}, "m", tok)
    text = tok.apply_chat_template([{"role": "system", "content": "the"}, {"role": "user", "content": "value"}],
                                   tokenize=False, add_generation_prompt=True)
    assert req.prompt_ids == _ids(tok, text) and req.max_tokens == 4 and req.kind == "chat"
    for messages in ([], [{"role": "tool", "content": "x"}], [{"role": "user", "content": "x", "tool_calls": []}],
                     [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]):
        with pytest.raises(APIError) as info:
            parse_chat({"model": "m", "messages": messages}, "m", tok)
        assert info.value.status == 400


def test_streamed_pieces_add_up_to_the_whole_text(tok):
    prompt = _ids(tok, "the value of")
    out = _ids(tok, "a function is the name of a class") + [tok.eos_token_id]
    det = IncrementalDetokenizer(tok, prompt)
    pieces = [det.add([t], final=i == len(out) - 1) for i, t in enumerate(out)]
    assert "".join(pieces) == expected_text(tok, prompt, out) == " a function is the name of a class"
    assert all(p for p in pieces[:-1])  # nothing held back without stop strings


def test_stop_strings_cut_the_text_even_across_tokens(tok):
    prompt = _ids(tok, "the")
    out = _ids(tok, "value of a function is the name")
    det = IncrementalDetokenizer(tok, prompt, stop=["function is"])
    pieces = []
    for t in out:
        pieces.append(det.add([t]))
        if det.stopped:
            break
    assert "".join(pieces) == " value of a " and det.stopped
    assert det.add(_ids(tok, "the")) == ""
