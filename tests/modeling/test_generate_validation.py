"""Bad generate()/add_request input is refused up front, and a failed or interrupted call leaves the engine clean."""

from __future__ import annotations

import math

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.modeling import AMDModelForCausalLM, SamplingParams

from .conftest import hf_greedy, tiny_model

PROMPT = [5, 17, 42, 9, 100, 3]


@pytest.fixture
def am():
    return AMDModelForCausalLM(tiny_model("llama"), num_blocks=32, block_size=4, max_model_len=64)


def _assert_clean(am: AMDModelForCausalLM) -> None:
    engine = am.engine
    assert not engine.has_unfinished()
    assert engine.num_free_blocks == engine.num_blocks
    assert engine._seqs == {} and engine._streamers == {}
    # and the next call works and is right
    assert am.generate([PROMPT], max_new_tokens=5) == [hf_greedy(am.model, PROMPT, 5)]


@pytest.mark.parametrize("bad", [[5, 256, 7], [5, -1, 7], [10**9]])
def test_out_of_vocabulary_ids_are_refused_and_nothing_stays_queued(am, bad):
    with pytest.raises(InvalidArgumentError, match=r"outside the vocabulary \[0, 256\)"):
        am.generate(torch.tensor([bad]), max_new_tokens=3)
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        am.generate([PROMPT, bad], max_new_tokens=3)  # the good row is not queued either
    _assert_clean(am)


@pytest.mark.parametrize("error", [RuntimeError("device failure"), KeyboardInterrupt()])
def test_a_failure_or_ctrl_c_mid_generation_leaves_the_engine_clean(am, monkeypatch, error):
    engine = am.engine
    real = engine.runner.execute
    calls = {"n": 0}

    def flaky(batch):
        calls["n"] += 1
        if calls["n"] == 3:
            raise error
        return real(batch)

    monkeypatch.setattr(engine.runner, "execute", flaky)
    with pytest.raises(type(error)):
        am.generate([PROMPT, PROMPT[:3]], max_new_tokens=8)
    monkeypatch.setattr(engine.runner, "execute", real)
    _assert_clean(am)


def test_engine_generate_cleans_up_after_a_failure(am, monkeypatch):
    engine = am.engine
    monkeypatch.setattr(engine.runner, "execute", lambda batch: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        engine.generate([PROMPT], SamplingParams(max_new_tokens=4))
    monkeypatch.undo()
    assert engine.num_free_blocks == engine.num_blocks and not engine.has_unfinished()


@pytest.mark.parametrize("inputs,kwargs,match", [
    ([], {}, "empty batch"),
    ([[]], {}, "Prompt 0 is empty"),
    (torch.zeros(1, 0, dtype=torch.long), {}, "Prompt 0 is empty"),
    (torch.tensor([[1, 2]]), {"attention_mask": torch.tensor([[0, 0]])}, "empty after removing padding"),
    (torch.tensor([[1.0, 2.0]]), {}, "integer token ids"),
    ([[1, "a"]], {}, "must be integers"),
    (torch.ones(1, 2, 2, dtype=torch.long), {}, r"\[batch, seq\]"),
])
def test_empty_or_malformed_inputs(am, inputs, kwargs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        am.generate(inputs, max_new_tokens=2, **kwargs)
    _assert_clean(am)


@pytest.mark.parametrize("value", [0, -3])
def test_non_positive_max_new_tokens_is_refused_not_turned_into_one(am, value):
    with pytest.raises(InvalidArgumentError, match=f"max_new_tokens={value}"):
        am.generate([PROMPT], max_new_tokens=value)
    with pytest.raises(InvalidArgumentError, match="max_length=4 leaves no room"):
        am.generate([PROMPT], max_length=4)


def test_typos_raise_like_transformers(am):
    with pytest.raises(InvalidArgumentError, match="unknown arguments: 'max_new_token' \\(did you mean 'max_new_tokens'\\?\\)"):
        am.generate([PROMPT], max_new_token=2)
    with pytest.raises(InvalidArgumentError, match="'temprature'"):
        am.generate([PROMPT], max_new_tokens=2, do_sample=True, temprature=0.5)
    _assert_clean(am)


@pytest.mark.parametrize("kwargs", [
    {"typical_p": 0.9}, {"output_attentions": True}, {"output_scores": True}, {"num_beams": 3},
    {"no_repeat_ngram_size": 2}, {"min_p": 0.1}, {"stop_strings": ["."]}, {"return_dict_in_generate": True},
    {"logits_processor": [object()]}, {"max_time": 1.0}, {"suppress_tokens": [3]},
])
def test_arguments_the_readme_refuses_raise(am, kwargs):
    name = next(iter(kwargs))
    with pytest.raises(InvalidArgumentError, match=f"does not support {name}="):
        am.generate([PROMPT], max_new_tokens=2, **kwargs)


def test_refused_settings_inside_a_generation_config_raise(am):
    from transformers import GenerationConfig

    with pytest.raises(InvalidArgumentError, match="generation_config.typical_p=0.5"):
        am.generate([PROMPT], generation_config=GenerationConfig(max_new_tokens=2, typical_p=0.5))


def test_neutral_values_and_no_effect_arguments_are_accepted(am):
    out = am.generate([PROMPT], max_new_tokens=4, typical_p=1.0, output_attentions=False, num_beams=1,
                      use_cache=True, num_return_sequences=1, return_dict_in_generate=False, bad_words_ids=None)
    assert out == [hf_greedy(am.model, PROMPT, 4)]


@pytest.mark.parametrize("kwargs,name", [
    ({"do_sample": True, "temperature": -1.0}, "temperature"),
    ({"do_sample": True, "temperature": math.nan}, "temperature"),
    ({"do_sample": True, "top_p": 1.5}, "top_p"),
    ({"do_sample": True, "top_p": 0.0}, "top_p"),
    ({"do_sample": True, "top_k": -2}, "top_k"),
    ({"do_sample": True, "top_k": "ten"}, "top_k"),
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": math.inf}, "repetition_penalty"),
    ({"min_new_tokens": 9}, "min_new_tokens"),
    ({"max_new_tokens": 2.5}, "max_new_tokens"),
    ({"eos_token_id": 999}, "eos_token_id"),
])
def test_sampling_values_out_of_range_name_the_argument(am, kwargs, name):
    kwargs.setdefault("max_new_tokens", 4)
    with pytest.raises(InvalidArgumentError, match=name):
        am.generate([PROMPT], **kwargs)
    _assert_clean(am)


def test_sampling_params_checks_types_and_ranges():
    for kwargs, name in [({"max_new_tokens": True}, "max_new_tokens"), ({"temperature": "hot"}, "temperature"),
                         ({"stop_token_ids": (-1,)}, "stop_token_ids"), ({"do_sample": 1}, "do_sample")]:
        with pytest.raises(InvalidArgumentError, match=name):
            SamplingParams(**kwargs)
    assert SamplingParams(stop_token_ids=[2, 3]).stop_token_ids == (2, 3)


def test_engine_add_request_validates_before_queueing(am):
    engine = am.engine
    for prompt, match in [([1, 256], "outside the vocabulary"), ([1.5, 2], "not an integer"), ([], "empty prompt"),
                          ("hello", "tokenize it first"), (torch.tensor([[1, 2]]), "1-D integer")]:
        with pytest.raises(InvalidArgumentError, match=match):
            engine.add_request(prompt, SamplingParams(max_new_tokens=2))
    with pytest.raises(InvalidArgumentError, match="SamplingParams"):
        engine.add_request([1, 2], {"max_new_tokens": 2})
    with pytest.raises(InvalidArgumentError, match="stop_token_ids"):
        engine.add_request([1, 2], SamplingParams(max_new_tokens=2, stop_token_ids=(300,)))
    assert not engine.has_unfinished() and engine._seqs == {}
    rid = engine.add_request(torch.tensor(PROMPT), SamplingParams(max_new_tokens=3))
    assert engine.run()[rid] == hf_greedy(am.model, PROMPT, 3)


def test_generation_past_the_context_length_warns(am):
    with pytest.warns(UserWarning, match="exceeds max_model_len=64"):
        out = am.generate([PROMPT], max_new_tokens=100)
    assert len(PROMPT) + len(out[0]) == 64


@pytest.mark.network
def test_default_model_recovers_after_bad_requests():
    """SmolLM2-135M: the reported cases (an out-of-vocabulary id, a typo, max_new_tokens=0) then a good call."""
    from optimum_amdx.models import load_causal_lm, load_tokenizer

    tok = load_tokenizer("default")
    model = load_causal_lm("default", dtype="fp32", device="cpu")
    am = AMDModelForCausalLM(model, num_blocks=16, max_model_len=256)
    ids = tok("The three primary colors are", return_tensors="pt").input_ids
    vocab = model.get_input_embeddings().num_embeddings
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        am.generate(torch.tensor([[1, vocab + 5]]), max_new_tokens=4)
    with pytest.raises(InvalidArgumentError, match="did you mean 'max_new_tokens'"):
        am.generate(ids, max_new_token=2)
    with pytest.raises(InvalidArgumentError, match="max_new_tokens=0"):
        am.generate(ids, max_new_tokens=0)
    with pytest.raises(InvalidArgumentError, match="typical_p"):
        am.generate(ids, max_new_tokens=2, typical_p=0.5)
    out = am.generate(ids, max_new_tokens=8)
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    assert torch.equal(out, ref)
    assert am.engine.num_free_blocks == am.engine.num_blocks and not am.engine.has_unfinished()
