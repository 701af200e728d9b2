"""The real onnxruntime-rocm wheel on this GPU-less machine: asking for ROCm must fail loudly.

onnxruntime-rocm lists ROCMExecutionProvider as available even without ROCm, then silently
runs on the CPU. The wheel is installed into a separate folder (cached by pytest) that shadows
the normal onnxruntime in a subprocess, as a second environment would.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ._shadow_wheel import ensure_unpacked, run_shadowed, wheel_folder

pytestmark = [pytest.mark.slow, pytest.mark.network]

WHEEL = "onnxruntime-rocm==1.22.2.post3"


def _install(site: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target", str(site), WHEEL],
                   check=True, timeout=900)


@pytest.fixture(scope="module")
def rocm_site(request) -> Path:
    return ensure_unpacked(wheel_folder(request, "onnxruntime-rocm-1.22.2.post3"), "libonnxruntime_providers_rocm.so",
                           _install)


def test_rocm_provider_without_rocm_is_a_clear_error(rocm_site, bert_cls_onnx):
    proc = run_shadowed(rocm_site, f"""
        import warnings
        import onnxruntime
        assert onnxruntime.__version__.startswith("1.22"), onnxruntime.__file__
        assert "ROCMExecutionProvider" in onnxruntime.get_available_providers()
        from optimum_amdx.errors import ProviderError
        from optimum_amdx.onnxruntime import ORTModelForSequenceClassification
        try:
            ORTModelForSequenceClassification.from_pretrained({str(bert_cls_onnx)!r}, provider="rocm")
        except ProviderError as err:
            print("PROVIDER_ERROR:", err)
        else:
            raise SystemExit("no error: ROCm was requested and the session silently ran elsewhere")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = ORTModelForSequenceClassification.from_pretrained({str(bert_cls_onnx)!r}, provider="rocm",
                                                                      allow_fallback=True)
        print("FALLBACK:", model.provider, any("ROCMExecutionProvider was requested" in str(w.message) for w in caught))
    """, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("PROVIDER_ERROR:"))
    assert "ROCMExecutionProvider was requested but ONNX Runtime is running on CPUExecutionProvider" in line
    # The first unloadable library is named (libhipblas, libamdhip64, ... depending on what is missing).
    assert "cannot open shared object file" in line and ".so" in line
    assert "FALLBACK: CPUExecutionProvider True" in proc.stdout
