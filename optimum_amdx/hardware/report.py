"""The `optimum-amdx env` report: every fact in one dict, the problems found and how to fix each."""

from __future__ import annotations

import importlib.metadata
import platform
import re
import sys
from dataclasses import asdict, dataclass

from .devices import gpu_devices, torch_backend
from .runtimes import onnxruntime_info, triton_info
from .system import numa_balancing, tunableop_state, visible_device_vars

SCHEMA = "optimum-amdx.env/1"
# packages the default model needs (transformers reads its GGUF with them) and their lowest working versions
REQUIRED_FOR_DEFAULT_MODEL = {"accelerate": "1.1", "gguf": "0.17.1"}
# optional packages -> the extra that installs them
OPTIONAL_PACKAGES = {"onnx": "onnx", "onnxscript": "onnx", "datasets": "data", "deepspeed": "deepspeed",
                     "matplotlib": "benchmark"}
_DEVICE_ITEM = re.compile(r"\d+|GPU-[0-9A-Za-z-]+|MIG-[0-9A-Za-z/-]+")


@dataclass(frozen=True)
class Problem:
    """Something wrong or risky on this machine, with the fix."""

    severity: str  # "error" (a feature will not work) or "warning" (slower or surprising)
    problem: str
    fix: str


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages the report checks (None when missing)."""
    versions: dict[str, str | None] = {}
    for name in list(REQUIRED_FOR_DEFAULT_MODEL) + list(OPTIONAL_PACKAGES):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def _visible_value_problem(name: str, value: str) -> Problem | None:
    """A visible-device variable whose value hides GPUs by mistake (HIP/ROCr stop at the first bad entry)."""
    items = [item.strip() for item in value.split(",")]
    if value.strip() in ("", "-1"):
        return Problem("warning", f"{name}={value!r} hides every GPU from the programs started here.",
                       f"unset {name} to see all GPUs, or list the ones to use, e.g. export {name}=0,1")
    bad = [item for item in items if not _DEVICE_ITEM.fullmatch(item)]
    if bad or len(set(items)) != len(items):
        what = f"entries {', '.join(repr(b) for b in bad)} are not" if bad else "entries repeat; each must be"
        return Problem("error", f"{name}={value!r}: {what} a GPU index (0, 1, ...) or UUID (GPU-...); the runtime "
                       "ignores the list from the first bad entry on, so GPUs silently disappear.",
                       f"export {name}=0,1 (indices as `amd-smi list` or `rocm-smi` show them), or unset {name}")
    return None


def find_problems(report: dict) -> list[Problem]:
    """The problems a report shows. Pure function of the report, so it is testable with any facts."""
    problems: list[Problem] = []
    torch_info = report["torch"]
    gpus = report["gpus"]
    ort = report["onnxruntime"]
    env_vars = {v["name"]: v["value"] for v in report["visible_devices"]}

    packages = report.get("packages", {})  # absent in reports made before the check existed
    for name, minimum in REQUIRED_FOR_DEFAULT_MODEL.items():
        if name not in packages:
            continue
        found = packages[name]
        if found is None or _version_tuple(found) < _version_tuple(minimum):
            have = "is not installed" if found is None else f"is {found}, older than {minimum}"
            problems.append(Problem(
                "error", f"{name} {have}: the default model (a GGUF file, read by transformers) and any GGUF model "
                "cannot load.", f"pip install '{name}>={minimum}' (a core dependency: reinstalling optimum-amdx "
                "brings it)"))
    for name, value in env_vars.items():
        if value is not None:
            problem = _visible_value_problem(name, value)
            if problem is not None:
                problems.append(problem)
    if report.get("numa_balancing") == 1 and len(gpus) > 1:
        problems.append(Problem(
            "warning", "NUMA balancing is on (/proc/sys/kernel/numa_balancing = 1) on a multi-GPU host; "
            "it migrates pages under running kernels and slows multi-GPU work.",
            "sudo sh -c 'echo 0 > /proc/sys/kernel/numa_balancing' (or sysctl kernel.numa_balancing=0)."))
    if torch_info["backend"] == "cpu" and torch_info.get("kfd_present"):
        problems.append(Problem(
            "error", "This machine has an AMD GPU driver (/dev/kfd) but PyTorch is a CPU build.",
            "Install ROCm PyTorch: pip install torch --index-url https://download.pytorch.org/whl/rocm6.4"))
    if torch_info["backend"] == "rocm" and not torch_info["gpu_available"]:
        problems.append(Problem(
            "error", "PyTorch is a ROCm build but sees no GPU.",
            "Check that /dev/kfd and /dev/dri are accessible (add your user to the 'render' and 'video' groups) "
            "and that HIP_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES do not hide every GPU."))
    if torch_info["backend"] == "rocm" and env_vars.get("CUDA_VISIBLE_DEVICES") is not None and (
            env_vars.get("HIP_VISIBLE_DEVICES") is not None
            and env_vars["HIP_VISIBLE_DEVICES"] != env_vars["CUDA_VISIBLE_DEVICES"]):
        problems.append(Problem(
            "warning", "Both HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES are set, to different values; on ROCm both "
            "filter devices, one after the other.",
            "Set only HIP_VISIBLE_DEVICES (or ROCR_VISIBLE_DEVICES) on AMD machines."))
    for gpu in gpus:
        if gpu["profile"] == "unknown":
            problems.append(Problem(
                "warning", f"GPU {gpu['index']} ({gpu['name']}, {gpu['arch']}) has no profile: rooflines and "
                "configs sized for it use conservative defaults.",
                "Pass its bandwidth explicitly where asked (e.g. --measure-ceilings in benchmarks)."))
    dists = ort.get("distributions", {})
    if len(dists) > 1:
        names = " ".join(sorted(dists))
        keep = "onnxruntime-rocm" if "onnxruntime-rocm" in dists else (
            "onnxruntime-migraphx" if "onnxruntime-migraphx" in dists else sorted(dists)[0])
        problems.append(Problem(
            "error", f"Several ONNX Runtime wheels are installed ({', '.join(f'{k} {v}' for k, v in dists.items())}); "
            "they share the 'onnxruntime' package and overwrite each other's files.",
            f"pip uninstall -y {names} && pip install {keep}"))
    for provider, why in ort.get("provider_problems", {}).items():
        problems.append(Problem(
            "error", f"{provider} is listed by onnxruntime but {why}; sessions would silently run on the CPU.",
            "Install the ROCm runtime libraries it names (ROCm 6.x: rocm-libs / MIGraphX) and make sure they are on "
            "LD_LIBRARY_PATH (e.g. /opt/rocm/lib)."))
    if ort.get("import_error"):
        problems.append(Problem("error", f"onnxruntime fails to import: {ort['import_error']}",
                                "Reinstall exactly one ONNX Runtime wheel."))
    if not ort.get("installed"):
        problems.append(Problem(
            "warning", "ONNX Runtime is not installed: accelerator='ort' and `export --validate` are unavailable.",
            "pip install 'optimum-amdx[onnx]' (CPU), or onnxruntime-migraphx / onnxruntime-rocm on AMD (instead of "
            "onnxruntime)."))
    triton = report["triton"]
    if not triton.get("installed"):
        problems.append(Problem(
            "warning", "Triton is not installed: our GPU kernels fall back to slower PyTorch code.",
            "pip install 'optimum-amdx[kernels]' (ROCm PyTorch wheels bring pytorch-triton-rocm)."))
    elif triton.get("validated") is False:
        problems.append(Problem(
            "warning", f"Triton {triton.get('version')} is outside the range our kernels are validated on "
            f"({triton.get('range')}).", triton.get("fix") or ""))
    if triton.get("installed") and gpus and triton.get("target") is None:
        problems.append(Problem(
            "error", f"Triton cannot target the GPU: {triton.get('error', 'unknown reason')}",
            "Install the Triton that matches your PyTorch (pytorch-triton-rocm for ROCm PyTorch)."))
    tunable = report["tunableop"]
    if tunable.get("enabled") and torch_info["backend"] == "cpu":
        problems.append(Problem("warning", "TunableOp is enabled but PyTorch has no GPU backend: it has no effect.",
                                "Unset PYTORCH_TUNABLEOP_ENABLED on CPU machines."))
    return problems


def hardware_report() -> dict:
    """Everything `optimum-amdx env` knows about this machine, as plain JSON-able data."""
    from optimum_amdx import __version__  # the package root only: no layer of ours is imported

    report = {
        "schema": SCHEMA,
        "optimum_amdx": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch_backend(),
        "gpus": gpu_devices(),
        "visible_devices": visible_device_vars(),
        "numa_balancing": numa_balancing(),
        "tunableop": tunableop_state(),
        "onnxruntime": onnxruntime_info(),
        "triton": triton_info(),
        "packages": package_versions(),
    }
    report["problems"] = [asdict(p) for p in find_problems(report)]
    return report


def format_report(report: dict) -> str:
    """A readable table of the report, problems last."""
    rows: list[tuple[str, str]] = []
    t = report["torch"]
    backend = {"rocm": f"ROCm/HIP {t['hip_version']}", "cuda": f"CUDA {t['cuda_version']}", "cpu": "CPU only"}[t["backend"]]
    rows += [("optimum-amdx", report.get("optimum_amdx", "?")),
             ("python", report["python"]), ("platform", report["platform"]),
             ("torch", t["torch"]), ("backend", backend), ("GPUs visible", str(t["device_count"]))]
    for g in report["gpus"]:
        prof = g["profile"]
        prof_text = "unknown (no profile)" if prof == "unknown" else (
            f"{prof['name']}: {prof['bandwidth_tbs']} TB/s, {prof['fp16_tflops']} TF fp16, wave {prof['wave_size']}, "
            f"LDS {prof['lds_workgroup_kib']} KiB per workgroup")
        rows.append((f"GPU {g['index']}", f"{g['name']} | {g['arch']} ({g['family']}) | {g['memory_gib']} GiB | {prof_text}"))
    for v in report["visible_devices"]:
        rows.append((v["name"], v["value"] if v["value"] is not None else "(unset)"))
    numa = report["numa_balancing"]
    rows.append(("NUMA balancing", {None: "unknown", 0: "off", 1: "on"}.get(numa, str(numa))))
    tun = report["tunableop"]
    if tun.get("available"):
        rows.append(("TunableOp", f"enabled={tun['enabled']} tuning={tun['tuning']} file={tun['filename']}"))
    else:
        rows.append(("TunableOp", f"unavailable ({tun.get('reason', '')})"))
    ort = report["onnxruntime"]
    if ort.get("installed"):
        dists = ", ".join(f"{k} {v}" for k, v in ort["distributions"].items())
        rows.append(("onnxruntime", f"{dists} | providers: {', '.join(ort.get('providers', [])) or 'none'}"))
    else:
        rows.append(("onnxruntime", "not installed"))
    tri = report["triton"]
    if tri.get("installed"):
        target = tri.get("target")
        where = f"{target['backend']} {target['arch']}" if target else tri.get("note", tri.get("error", "no GPU target"))
        valid = {True: "yes", False: "NO", None: "unknown"}[tri.get("validated")]
        rows.append(("triton", f"{tri.get('version', '?')} | validated ({tri.get('range', '?')}): {valid} | target: {where}"))
    else:
        rows.append(("triton", "not installed"))
    packages = report.get("packages", {})
    if packages:
        rows.append(("packages", ", ".join(
            f"{name} {version}" if version else
            f"{name} missing" + (f" (extra [{OPTIONAL_PACKAGES[name]}])" if name in OPTIONAL_PACKAGES else "")
            for name, version in packages.items())))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    problems = report["problems"]
    lines.append("")
    if problems:
        lines.append(f"{len(problems)} problem(s) found:")
        for p in problems:
            lines.append(f"  [{p['severity']}] {p['problem']}\n      fix: {p['fix']}")
    else:
        lines.append("No problems found.")
    return "\n".join(lines)
