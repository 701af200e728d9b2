"""Hardware parsing with real strings from ROCm and NVIDIA, the problem finder, and host settings."""

import pytest

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.hardware import (
    PROFILES,
    find_problems,
    lookup_profile,
    nvidia_arch,
    numa_balancing,
    parse_gcn_arch,
    profile_for_device,
    visible_device_vars,
)


@pytest.mark.parametrize(
    "text,name,features,family,wave",
    [
        ("gfx942:sramecc+:xnack-", "gfx942", {"sramecc": True, "xnack": False}, "CDNA3", 64),
        ("gfx90a:sramecc+:xnack-", "gfx90a", {"sramecc": True, "xnack": False}, "CDNA2", 64),
        ("gfx90a:sramecc-:xnack+", "gfx90a", {"sramecc": False, "xnack": True}, "CDNA2", 64),
        ("gfx1100", "gfx1100", {}, "RDNA3", 32),
        ("gfx950:sramecc+:xnack-", "gfx950", {"sramecc": True, "xnack": False}, "CDNA4", 64),
    ],
)
def test_parse_gcn_arch_real_strings(text, name, features, family, wave):
    arch = parse_gcn_arch(text)
    assert arch.name == name
    assert arch.features == features
    assert arch.family == family
    assert arch.wave_size == wave
    assert arch.vendor == "amd"


def test_parse_gcn_arch_rejects_non_amd():
    with pytest.raises(InvalidArgumentError, match="gfx942"):
        parse_gcn_arch("sm_90")


def test_unknown_gfx_is_honest():
    arch = parse_gcn_arch("gfx1036")
    assert arch.family == "unknown" and arch.wave_size is None


def test_nvidia_arch():
    arch = nvidia_arch(9, 0)
    assert arch.name == "sm_90" and arch.family == "Hopper" and arch.wave_size == 32


@pytest.mark.parametrize(
    "device_name,key",
    [
        ("AMD Instinct MI300X", "mi300x"),
        ("AMD Instinct MI300X VF", "mi300x"),
        ("AMD Instinct MI250X/MI250", "mi250"),
        ("AMD Instinct MI210", "mi210"),
        ("AMD Radeon RX 7900 XTX", "rx7900xtx"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
    ],
)
def test_profile_for_device_names_torch_reports(device_name, key):
    assert profile_for_device(device_name).key == key


def test_unknown_device_has_no_profile():
    assert profile_for_device("AMD Radeon Pro W6800") is None


def test_profiles_match_design_table():
    assert PROFILES["mi300x"].bandwidth_tbs == 5.3 and PROFILES["mi300x"].effective_bandwidth_tbs == 4.1
    assert PROFILES["mi355x"].lds_workgroup_kib == 160 and PROFILES["rx7900xtx"].wave_size == 32
    assert PROFILES["h200"].effective_bandwidth_tbs == 4.2


def test_lookup_profile_aliases_and_errors():
    assert lookup_profile("MI300X").key == "mi300x"
    assert lookup_profile("mi250x").key == "mi250"
    with pytest.raises(InvalidArgumentError, match="Known GPUs: .*mi300x"):
        lookup_profile("mi999")


def test_numa_balancing_reads_file(tmp_path):
    f = tmp_path / "numa_balancing"
    f.write_text("1\n")
    assert numa_balancing(f) == 1
    f.write_text("0\n")
    assert numa_balancing(f) == 0
    assert numa_balancing(tmp_path / "missing") is None


def test_visible_device_vars_explain_each():
    rows = visible_device_vars({"HIP_VISIBLE_DEVICES": "0,1"})
    by_name = {r["name"]: r for r in rows}
    assert by_name["HIP_VISIBLE_DEVICES"]["value"] == "0,1"
    assert by_name["ROCR_VISIBLE_DEVICES"]["value"] is None
    assert "ROCr" in by_name["ROCR_VISIBLE_DEVICES"]["meaning"]


def _report(**over):
    report = {
        "torch": {"backend": "rocm", "gpu_available": True, "device_count": 2, "kfd_present": True,
                  "hip_version": "6.4", "cuda_version": None, "torch": "2.9"},
        "gpus": [{"index": i, "name": "AMD Instinct MI300X", "arch": "gfx942", "profile": {"key": "mi300x"}}
                 for i in range(2)],
        "visible_devices": visible_device_vars({}),
        "numa_balancing": 0,
        "tunableop": {"available": True, "enabled": False},
        "onnxruntime": {"installed": True, "distributions": {"onnxruntime-rocm": "1.22.2"}, "provider_problems": {}},
        "triton": {"installed": True, "target": {"backend": "hip", "arch": "gfx942", "warp_size": 64}},
    }
    report.update(over)
    return report


def test_healthy_machine_has_no_problems():
    assert find_problems(_report()) == []


def test_numa_balancing_on_multi_gpu_is_flagged_with_fix():
    problems = find_problems(_report(numa_balancing=1))
    assert len(problems) == 1
    assert "NUMA" in problems[0].problem and "numa_balancing" in problems[0].fix


def test_numa_balancing_on_single_gpu_is_fine():
    report = _report(numa_balancing=1)
    report["gpus"] = report["gpus"][:1]
    assert find_problems(report) == []


def test_both_onnxruntime_wheels_is_an_error():
    ort = {"installed": True, "distributions": {"onnxruntime": "1.31.1", "onnxruntime-rocm": "1.22.2"},
           "provider_problems": {}}
    (problem,) = find_problems(_report(onnxruntime=ort))
    assert problem.severity == "error"
    assert "pip uninstall -y onnxruntime onnxruntime-rocm" in problem.fix
    assert problem.fix.endswith("pip install onnxruntime-rocm")


def test_rocm_provider_with_missing_libraries_is_an_error():
    ort = {"installed": True, "distributions": {"onnxruntime-rocm": "1.22.2"},
           "provider_problems": {"ROCMExecutionProvider": "libonnxruntime_providers_rocm.so cannot be loaded: "
                                                          "missing libamdhip64.so.6"}}
    (problem,) = find_problems(_report(onnxruntime=ort))
    assert "libamdhip64.so.6" in problem.problem and "silently" in problem.problem


def test_rocm_torch_without_gpu_and_cpu_torch_with_kfd():
    report = _report(gpus=[])
    report["torch"] = dict(report["torch"], gpu_available=False, device_count=0)
    assert any("sees no GPU" in p.problem for p in find_problems(report))
    report["torch"] = dict(report["torch"], backend="cpu")
    assert any("CPU build" in p.problem for p in find_problems(report))


def test_unknown_gpu_profile_is_a_warning():
    report = _report()
    report["gpus"] = [{"index": 0, "name": "AMD Radeon Pro W6800", "arch": "gfx1030", "profile": "unknown"}]
    (problem,) = find_problems(report)
    assert problem.severity == "warning" and "no profile" in problem.problem
