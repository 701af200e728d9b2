"""The real onnxruntime-migraphx wheel on this GPU-less machine: asking for MIGraphX must fail loudly.

The wheel lists MIGraphXExecutionProvider as available, but its provider library needs ROCm's
libmigraphx_c and libamdhip64; without them ONNX Runtime silently runs on the CPU. The wheel is
fetched with `pip download --no-deps` and unpacked into a folder (cached by pytest) that shadows
the normal onnxruntime in a subprocess, as a second environment would.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.onnxruntime import providers as P

from ._shadow_wheel import ensure_unpacked, run_shadowed, wheel_folder

pytestmark = [pytest.mark.slow, pytest.mark.network]

WHEEL = "onnxruntime-migraphx==1.27.1"


def _fetch(site: Path) -> None:
    wheels = site.parent / (site.name + "-wheel")
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d",
                    str(wheels), WHEEL], check=True, timeout=900)
    wheel = next(wheels.glob("onnxruntime_migraphx-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    for lib in (site / "onnxruntime" / "capi").glob("*.so*"):
        lib.chmod(0o755)


@pytest.fixture(scope="module")
def migraphx_site(request) -> Path:
    return ensure_unpacked(wheel_folder(request, "onnxruntime-migraphx-1.27.1"), "libonnxruntime_providers_migraphx.so",
                           _fetch)


def test_migraphx_provider_without_rocm_is_a_clear_error(migraphx_site, llama_static_onnx, tmp_path):
    cache = tmp_path / "mgx-cache"
    proc = run_shadowed(migraphx_site, f"""
        import warnings
        import torch
        import onnxruntime
        assert onnxruntime.__version__ == "1.27.1", onnxruntime.__file__
        assert "MIGraphXExecutionProvider" in onnxruntime.get_available_providers()
        from optimum_amdx.errors import ProviderError
        from optimum_amdx.onnxruntime import ORTModelForCausalLM
        opts = {{"migraphx_fp16_enable": True, "migraphx_model_cache_dir": {str(cache)!r}}}
        try:
            ORTModelForCausalLM.from_pretrained({str(llama_static_onnx)!r}, provider="migraphx", provider_options=opts)
        except ProviderError as err:
            print("PROVIDER_ERROR:", err)
        else:
            raise SystemExit("no error: MIGraphX was requested and the session silently ran elsewhere")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = ORTModelForCausalLM.from_pretrained({str(llama_static_onnx)!r}, provider="migraphx",
                                                        provider_options=opts, allow_fallback=True)
        out = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=3, do_sample=False, pad_token_id=0)
        print("FALLBACK:", model.provider, model.use_static_shapes, tuple(out.shape),
              any("MIGraphXExecutionProvider was requested" in str(w.message) for w in caught))
    """, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("PROVIDER_ERROR:"))
    assert "MIGraphXExecutionProvider was requested but ONNX Runtime is running on CPUExecutionProvider" in line
    assert "libmigraphx_c.so" in line and "cannot open shared object file" in line
    # The static bucket graphs (what MIGraphX would compile) are what ran on the CPU fallback.
    assert "FALLBACK: CPUExecutionProvider True (1, 6) True" in proc.stdout
    assert cache.is_dir()


def test_migraphx_options_validated(tmp_path):
    opts = P.provider_options("migraphx", {"migraphx_fp16_enable": "yes", "migraphx_model_cache_dir": tmp_path / "c"})
    assert opts["migraphx_fp16_enable"] == "1" and opts["migraphx_model_cache_dir"] == str((tmp_path / "c").resolve())
    (tmp_path / "file").write_text("x")
    with pytest.raises(InvalidArgumentError, match="is a file"):
        P.provider_options("migraphx", {"migraphx_model_cache_dir": tmp_path / "file"})
    with pytest.raises(InvalidArgumentError, match="Unknown MIGraphXExecutionProvider option 'fp16'"):
        P.provider_options("migraphx", {"fp16": True})
    with pytest.raises(InvalidArgumentError, match="exclude each other"):
        P.provider_options("migraphx", {"migraphx_fp16_enable": 1, "migraphx_bf16_enable": 1})
    with pytest.raises(InvalidArgumentError, match="number of bytes"):
        P.provider_options("migraphx", {"migraphx_mem_limit": "4GB"})
