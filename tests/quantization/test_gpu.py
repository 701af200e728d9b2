"""On a GPU: GPTQ runs on the device, and QuantLinear's W4A16 Triton path matches dequantize + matmul."""

from __future__ import annotations

import pytest
import torch

from .conftest import make_llama
from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer, QuantLinear

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@pytest.mark.parametrize("desc_act,sym", [(False, True), (True, False)])
def test_gptq_on_gpu_and_w4a16_kernel_path(desc_act, sym):
    model = make_llama(seed=8).half().cuda()
    gen = torch.Generator().manual_seed(8)
    samples = [torch.randint(0, 256, (1, 64), generator=gen) for _ in range(8)]  # no `datasets` needed
    GPTQQuantizer(GPTQConfig(bits=4, group_size=32, desc_act=desc_act, sym=sym, n_samples=8, seqlen=64),
                  device="cuda", verbose=False).quantize(model, dataset=samples)
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert len(layers) == 14 and all(m.qweight.is_cuda for m in layers)
    g = torch.Generator(device="cuda").manual_seed(0)
    for layer in layers:
        assert layer.kernel_weight().kernel_ready
        for m in (1, 7, 16, 64):
            x = torch.randn(m, layer.in_features, device="cuda", dtype=torch.float16, generator=g)
            ref = x.float() @ layer.dequantize().t()
            torch.testing.assert_close(layer(x).float(), ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max()))
    ids = torch.randint(0, 256, (1, 16), device="cuda", generator=g)
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 20)


def test_repacking_on_the_gpu_replaces_the_codes_instead_of_adding_a_copy():
    """A repacked layer holds one copy of its codes (round 35): on the GPU, repacking symmetric 4-bit layers whose
    shapes fill the 128 x 128 tiles leaves the allocated memory where it was (it grew by one copy before)."""
    import gc

    from optimum_amdx.kernels.w4a16 import pack_gptq_int32

    g = torch.Generator().manual_seed(3)
    k, n, count = 1024, 2048, 4
    layers = []
    for _ in range(count):
        tensors = {"qweight": pack_gptq_int32(torch.randint(0, 16, (k, n), generator=g), 4, dim=0).cuda(),
                   "qzeros": pack_gptq_int32(torch.full((k // 128, n), 7), 4, dim=1).cuda(),  # v1: real zero 8
                   "scales": (torch.rand(k // 128, n, generator=g) * 0.01).half().cuda(),
                   "g_idx": (torch.arange(k) // 128).to(torch.int32).cuda()}
        layers.append(QuantLinear.from_packed(tensors, k, n, 4, 128))
    del tensors
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for layer in layers:
        assert layer.kernel_weight().kernel_ready and layer._buffers["qweight"] is None
    gc.collect()
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated() - before
    assert abs(grown) < 0.05 * count * k * n // 2, grown  # one copy would be k * n / 2 bytes a layer


def test_a_checkpoint_loaded_onto_the_gpu_is_repacked_at_load(tmp_path):
    """`build_gptq_model` repacks every 4-bit linear on a GPU load (round 35): each holds only its repacked codes, the
    first forward repacks nothing, and the logits are the CPU load's."""
    from optimum_amdx.quantization import load_gptq_model

    model = make_llama(seed=9)
    quantizer = GPTQQuantizer(GPTQConfig(bits=4, group_size=32), method="rtn", device="cpu", verbose=False)
    quantizer.quantize(model)
    out = quantizer.save_pretrained(model, tmp_path / "q")
    gpu = load_gptq_model(out, "cuda", torch.float16)
    layers = [m for m in gpu.modules() if isinstance(m, QuantLinear)]
    assert len(layers) == 14 and all(m._buffers["qweight"] is None and m._prepared is not None for m in layers)
    prepared = [m._prepared for m in layers]
    ids = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(9))
    logits = gpu(ids.cuda()).logits.float().cpu()
    assert all(m._prepared is w for m, w in zip(layers, prepared))  # the forward repacked nothing
    cpu = load_gptq_model(out, "cpu", torch.float32)
    expected = cpu(ids).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=0.05 * float(expected.abs().max()))
