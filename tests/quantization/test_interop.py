"""Interop with the maintained peer, GPT-QModel 7.6 (CPU): it loads what we write, we load what it writes.

Tolerance: logits of the same checkpoint from the two runtimes agree within 2e-2 absolute (logits of
these tiny models are O(1); GPT-QModel's CPU kernel rounds activations to half precision) and the
greedy next token agrees at 95% of positions or more.
"""

from __future__ import annotations

import pytest
import torch

from .conftest import make_llama
from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer, load_gptq_model

pytestmark = pytest.mark.peers  # runs in CI's peers environment (.ci/run), skipped elsewhere
pytest.importorskip("gptqmodel")

ATOL = 2e-2


def _compare(a: torch.Tensor, b: torch.Tensor) -> None:
    a, b = a.float(), b.float()
    assert (a - b).abs().max() < ATOL, float((a - b).abs().max())
    agree = (a.argmax(-1) == b.argmax(-1)).float().mean()
    assert agree >= 0.95


def test_transformers_with_gptqmodel_loads_our_checkpoint(tmp_path, tokenizer, calib):
    from transformers import AutoModelForCausalLM

    model = make_llama(seed=3)
    quantizer = GPTQQuantizer(GPTQConfig(bits=4, group_size=32, desc_act=True, sym=False, n_samples=8, seqlen=64),
                              verbose=False)
    quantizer.quantize(model, tokenizer, calib)
    out = quantizer.save_pretrained(model, tmp_path / "ours", tokenizer)
    theirs = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, device_map="cpu")
    assert "gptqmodel" in type(theirs.model.layers[0].self_attn.q_proj).__module__
    ours = load_gptq_model(out, "cpu", torch.float32)
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _compare(ours(ids).logits, theirs(ids).logits)


def test_we_load_gptqmodel_checkpoint(tmp_path, tiny_dir, calib):
    from gptqmodel import BACKEND, GPTQModel, QuantizeConfig

    qc = QuantizeConfig(bits=4, group_size=32, desc_act=True, sym=False)
    peer = GPTQModel.load(str(tiny_dir), qc)
    peer.quantize([{"input_ids": s, "attention_mask": torch.ones_like(s)} for s in calib], batch_size=1)
    peer.save(str(tmp_path / "theirs"))
    theirs = GPTQModel.load(str(tmp_path / "theirs"), backend=BACKEND.TORCH, device="cpu")
    ours = load_gptq_model(tmp_path / "theirs", "cpu", torch.float32)
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref = theirs.model(ids.to(theirs.model.device)).logits
        _compare(ours(ids).logits, ref)


@pytest.mark.parametrize("tie", [False, True])
def test_gptqmodel_loads_our_act_order_checkpoint_with_a_quantized_head(tmp_path, tokenizer, calib, tie):
    """GPT-QModel's own loader (not through transformers) on our desc_act + lm_head=True checkpoint: it refuses
    a config that declares act_group_aware beside desc_act, so we write what ran; the 4-bit head is its kernel's."""
    from gptqmodel import BACKEND, GPTQModel

    model = make_llama(seed=3, tie=tie)
    quantizer = GPTQQuantizer(GPTQConfig(bits=4, group_size=32, desc_act=True, n_samples=8, seqlen=64, lm_head=True),
                              verbose=False)
    quantizer.quantize(model, tokenizer, calib)
    out = quantizer.save_pretrained(model, tmp_path / "ours", tokenizer)
    theirs = GPTQModel.load(str(out), backend=BACKEND.TORCH, device="cpu")
    assert "gptqmodel" in type(theirs.model.lm_head).__module__
    ours = load_gptq_model(out, "cpu", torch.float32)
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _compare(ours(ids).logits, theirs.model(ids).logits)


def test_we_load_gptqmodel_checkpoint_with_its_8bit_head(tmp_path, tiny_dir, calib):
    """GPT-QModel's lm_head=True writes the head at 8 bits through a per-module `dynamic` override."""
    from gptqmodel import BACKEND, GPTQModel, QuantizeConfig

    from optimum_amdx.quantization import QuantLinear

    peer = GPTQModel.load(str(tiny_dir), QuantizeConfig(bits=4, group_size=32, lm_head=True))
    peer.quantize([{"input_ids": s, "attention_mask": torch.ones_like(s)} for s in calib], batch_size=1)
    peer.save(str(tmp_path / "theirs"))
    theirs = GPTQModel.load(str(tmp_path / "theirs"), backend=BACKEND.TORCH, device="cpu")
    ours = load_gptq_model(tmp_path / "theirs", "cpu", torch.float32)
    assert isinstance(ours.lm_head, QuantLinear) and ours.lm_head.bits == 8
    assert ours.model.layers[0].mlp.down_proj.bits == 4
    ids = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        _compare(ours(ids).logits, theirs.model(ids.to(theirs.model.device)).logits)
