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
