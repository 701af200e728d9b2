"""GPU interconnect topology: parse what `amd-smi`, `rocm-smi` and `nvidia-smi` print, pick GPUs.

Tensor parallelism all-reduces after every layer, so the GPUs that share the fastest links
should work together. On an MI250 node the two GCDs of one package share a 200 GB/s link while
other pairs have 50-100 GB/s or no direct link at all; picking GPUs 0 and 2 instead of 0 and 1
can halve all-reduce bandwidth. We read the link matrices (weight, hops, link type, bandwidth,
NUMA node) and choose the subset with the most direct bandwidth, then the fewest hops.

Parsing needs no GPU: tests run it on real tool output from AMD's and Hugging Face's documentation.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from ..errors import HardwareError, InvalidArgumentError

# Relative cost of an NVIDIA `nvidia-smi topo -m` connection class (lower is closer).
_NVIDIA_PCIE_WEIGHT = {"PIX": 20, "PXB": 30, "PHB": 40, "NODE": 50, "SYS": 60}
_NVLINK_MBS_PER_LINK = 25_000  # one NVLink 4 link, one direction, MB/s
_MAX_EXHAUSTIVE = 20_000  # subsets scored exhaustively; beyond this, greedy growth


@dataclass
class Topology:
    """Pairwise link facts of the GPUs of one node (indices as the tool numbers them)."""

    num_devices: int
    labels: list[str] = field(default_factory=list)
    weight: list[list[float | None]] | None = None
    hops: list[list[float | None]] | None = None
    link_type: list[list[str | None]] | None = None
    bandwidth: list[list[float | None]] | None = None  # max bandwidth in MB/s, 0 = no direct link
    numa: list[int | None] | None = None
    vendor: str = "amd"
    sources: list[str] = field(default_factory=list)

    def merge(self, other: "Topology") -> "Topology":
        """Combine the tables of two outputs of the same machine (e.g. --showtopo and --shownodesbw)."""
        if self.num_devices != other.num_devices:
            raise InvalidArgumentError(
                f"Topology outputs disagree on the number of GPUs ({self.num_devices} vs {other.num_devices}); "
                "give outputs of one machine."
            )
        out = Topology(self.num_devices, self.labels or other.labels, vendor=self.vendor)
        for name in ("weight", "hops", "link_type", "bandwidth", "numa"):
            setattr(out, name, getattr(self, name) if getattr(self, name) is not None else getattr(other, name))
        out.sources = self.sources + other.sources
        return out

    def direct(self, i: int, j: int) -> bool:
        """Whether i and j share a GPU-to-GPU link (XGMI / NVLink), not a path through PCIe or the CPU."""
        if self.bandwidth is not None and self.bandwidth[i][j] is not None:
            return self.bandwidth[i][j] > 0
        if self.link_type is not None and self.link_type[i][j]:
            kind = self.link_type[i][j].upper()
            return kind.startswith("XGMI") or kind.startswith("NV")
        return False

    def describe_pair(self, i: int, j: int) -> str:
        parts = []
        if self.link_type is not None and self.link_type[i][j]:
            parts.append(self.link_type[i][j])
        if self.bandwidth is not None and self.bandwidth[i][j] is not None:
            parts.append(f"{self.bandwidth[i][j] / 1000:g} GB/s")
        if self.weight is not None and self.weight[i][j] is not None:
            parts.append(f"weight {self.weight[i][j]:g}")
        if self.hops is not None and self.hops[i][j] is not None:
            parts.append(f"{self.hops[i][j]:g} hops")
        return ", ".join(parts) or "unknown"


# ----------------------------------------------------------------------------- parsing helpers

def _number(token: str) -> float | None:
    try:
        return float(token)
    except ValueError:
        return None


def _bandwidth(token: str) -> float | None:
    """'50000-200000' (min-max MB/s) -> 200000; 'N/A' -> None."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)", token)
    if m:
        return float(m.group(2))
    return _number(token)


def _read_matrix(lines: list[str], start: int) -> tuple[list[str], list[list[str]], int]:
    """Read a header row of labels and the rows below it; return labels, cells, next line index."""
    i = start
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i >= len(lines):
        return [], [], i
    labels = lines[i].split()
    rows: list[list[str]] = []
    i += 1
    while i < len(lines):
        tokens = lines[i].split()
        if not tokens or tokens[0] not in labels or len(tokens) < len(labels) + 1:
            break
        rows.append(tokens[1:len(labels) + 1])
        i += 1
    return labels, rows, i


def _square(labels: list[str], rows: list[list[str]], what: str) -> None:
    if not labels or len(rows) != len(labels):
        raise InvalidArgumentError(
            f"Could not read the {what} matrix: {len(labels)} column labels but {len(rows)} rows. "
            "Pass the complete, unedited tool output."
        )


_ROCM_SECTIONS = {
    "weight between two gpus": "weight",
    "hops between two gpus": "hops",
    "link type between two gpus": "link_type",
    "bandwidth": "bandwidth",
}


def parse_rocm_smi(text: str) -> Topology:
    """Parse `rocm-smi --showtopo` (weights, hops, link types, NUMA) and/or `--shownodesbw` output."""
    lines = text.splitlines()
    tables: dict[str, list[list[str]]] = {}
    labels: list[str] = []
    numa: dict[int, int] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.fullmatch(r"\s*=+\s*(.*?)\s*=+\s*", line)
        if m and m.group(1).lower() in _ROCM_SECTIONS:
            kind = _ROCM_SECTIONS[m.group(1).lower()]
            labels_k, rows, i = _read_matrix(lines, i + 1)
            _square(labels_k, rows, kind)
            tables[kind] = rows
            labels = labels_k
            continue
        nm = re.match(r"\s*GPU\[(\d+)\]\s*:\s*\(Topology\)\s*Numa Node:\s*(-?\d+)", line)
        if nm:
            numa[int(nm.group(1))] = int(nm.group(2))
        i += 1
    if not tables and not numa:
        raise InvalidArgumentError(
            "No rocm-smi topology tables found. Expected the output of `rocm-smi --showtopo` "
            "(and optionally `--shownodesbw`)."
        )
    n = len(labels) if labels else max(numa) + 1
    topo = Topology(n, labels or [f"GPU{k}" for k in range(n)], vendor="amd", sources=["rocm-smi"])
    _fill_tables(topo, tables)
    if numa:
        topo.numa = [numa.get(k) for k in range(n)]
    return topo


def _fill_tables(topo: Topology, tables: dict[str, list[list[str]]]) -> None:
    n = topo.num_devices
    for kind, rows in tables.items():
        if kind == "link_type":
            topo.link_type = [[None if r == c else rows[r][c] for c in range(n)] for r in range(n)]
        elif kind == "bandwidth":
            topo.bandwidth = [[None if r == c else _bandwidth(rows[r][c]) for c in range(n)] for r in range(n)]
        else:
            setattr(topo, kind, [[None if r == c else _number(rows[r][c]) for c in range(n)] for r in range(n)])


_AMD_SMI_TABLES = {
    "WEIGHT TABLE": "weight",
    "HOPS TABLE": "hops",
    "LINK TYPE TABLE": "link_type",
    "NUMA BW TABLE": "bandwidth",
}


def parse_amd_smi(text: str) -> Topology:
    """Parse `amd-smi topology` output (ACCESS/WEIGHT/HOPS/LINK TYPE/NUMA BW tables)."""
    lines = text.splitlines()
    tables: dict[str, list[list[str]]] = {}
    labels: list[str] = []
    i = 0
    while i < len(lines):
        title = lines[i].strip().rstrip(":").upper()
        if title in _AMD_SMI_TABLES:
            labels_k, rows, i = _read_matrix(lines, i + 1)
            _square(labels_k, rows, title.lower())
            tables[_AMD_SMI_TABLES[title]] = rows
            labels = labels_k
            continue
        i += 1
    if not tables:
        raise InvalidArgumentError("No amd-smi topology tables found. Expected the output of `amd-smi topology`.")
    topo = Topology(len(labels), labels, vendor="amd", sources=["amd-smi"])
    _fill_tables(topo, tables)
    return topo


def parse_nvidia_smi(text: str) -> Topology:
    """Parse `nvidia-smi topo -m`: NV# (NVLink count), PIX/PXB/PHB/NODE/SYS, NUMA affinity."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # nvidia-smi underlines the header on a terminal
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header_idx = next((k for k, ln in enumerate(lines) if re.match(r"\s+GPU0\b", ln) or ln.startswith("\tGPU0")), None)
    if header_idx is None:
        raise InvalidArgumentError("No `nvidia-smi topo -m` matrix found (expected a header row starting with GPU0).")
    header = [h.strip() for h in lines[header_idx].split("\t") if h.strip()]
    gpu_labels = [h for h in header if re.fullmatch(r"GPU\d+", h)]
    n = len(gpu_labels)
    numa_col = header.index("NUMA Affinity") if "NUMA Affinity" in header else None
    link: list[list[str | None]] = []
    numa: list[int | None] = []
    for ln in lines[header_idx + 1: header_idx + 1 + n]:
        cells = [c.strip() for c in ln.split("\t")]
        cells = [c for c in cells if c != ""]
        if not cells or cells[0] != f"GPU{len(link)}":
            raise InvalidArgumentError(f"Unexpected row in nvidia-smi topology output: {ln!r}")
        values = cells[1:]
        link.append([None if r == "X" else r for r in values[:n]])
        if numa_col is not None and len(values) > numa_col:
            numa.append(int(values[numa_col]) if values[numa_col].isdigit() else None)
    topo = Topology(n, gpu_labels, vendor="nvidia", sources=["nvidia-smi"])
    topo.link_type = link
    topo.bandwidth = [[None if v is None else (int(v[2:]) * _NVLINK_MBS_PER_LINK if v.startswith("NV") else 0.0)
                       for v in row] for row in link]
    topo.weight = [[None if v is None else (10.0 if v.startswith("NV") else float(_NVIDIA_PCIE_WEIGHT.get(v, 70)))
                    for v in row] for row in link]
    topo.numa = numa or None
    return topo


def parse_topology(text: str) -> Topology:
    """Recognize and parse the output of amd-smi, rocm-smi or nvidia-smi topology commands."""
    if re.search(r"^\s*(WEIGHT|HOPS|LINK TYPE|ACCESS) TABLE:?\s*$", text, re.MULTILINE):
        return parse_amd_smi(text)
    if "ROCm System Management Interface" in text or "(Topology)" in text or "between two GPUs" in text:
        return parse_rocm_smi(text)
    if re.search(r"^\s*GPU0\s+X\b", text, re.MULTILINE) or "Legend:" in text:
        return parse_nvidia_smi(text)
    raise InvalidArgumentError(
        "Unrecognized topology text. Give the output of `amd-smi topology`, `rocm-smi --showtopo` "
        "(optionally with `--shownodesbw`) or `nvidia-smi topo -m`."
    )


def detect_topology(timeout: float = 20.0) -> Topology | None:
    """Run the vendor tool found on PATH and parse its output; None when no tool answers."""
    attempts = [
        ("amd-smi", [["amd-smi", "topology"]]),
        ("rocm-smi", [["rocm-smi", "--showtopo"], ["rocm-smi", "--shownodesbw"]]),
        ("nvidia-smi", [["nvidia-smi", "topo", "-m"]]),
    ]
    for tool, commands in attempts:
        if shutil.which(tool) is None:
            continue
        topo: Topology | None = None
        for cmd in commands:
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout
                part = parse_topology(out)
            except (subprocess.SubprocessError, OSError, InvalidArgumentError):
                continue
            topo = part if topo is None else topo.merge(part)
        if topo is not None:
            return topo
    return None


# ----------------------------------------------------------------------------- choosing GPUs

def _subset_key(topo: Topology, subset: tuple[int, ...]) -> tuple:
    """Lower is better: most direct bandwidth, most direct pairs, lowest weight and hops, fewest NUMA nodes."""
    pairs = list(itertools.combinations(subset, 2))
    bw = sum((topo.bandwidth[i][j] or 0.0) for i, j in pairs) if topo.bandwidth is not None else 0.0
    direct = sum(topo.direct(i, j) for i, j in pairs)
    weight = sum((topo.weight[i][j] or 0.0) for i, j in pairs) if topo.weight is not None else 0.0
    hops = sum((topo.hops[i][j] or 0.0) for i, j in pairs) if topo.hops is not None else 0.0
    numa = len({topo.numa[i] for i in subset}) if topo.numa is not None else 0
    return (-bw, -direct, weight, hops, numa, subset)


def choose_devices(topo: Topology, n: int, candidates: list[int] | None = None) -> list[int]:
    """The best `n` GPUs for tensor parallelism among `candidates` (default: all), sorted."""
    pool = sorted(set(candidates)) if candidates is not None else list(range(topo.num_devices))
    bad = [d for d in pool if not 0 <= d < topo.num_devices]
    if bad:
        raise InvalidArgumentError(f"GPU indices {bad} are not on this machine (it has {topo.num_devices}).")
    if n < 1:
        raise InvalidArgumentError(f"Asked for {n} GPUs; expected at least 1.")
    if n > len(pool):
        raise HardwareError(
            f"Asked for {n} GPUs but only {len(pool)} are available ({', '.join(map(str, pool)) or 'none'}). "
            f"Lower --gpus to at most {len(pool)}, or free more GPUs."
        )
    total = 1
    for k in range(n):
        total = total * (len(pool) - k) // (k + 1)
    if total <= _MAX_EXHAUSTIVE:
        best = min(itertools.combinations(pool, n), key=lambda s: _subset_key(topo, s))
        return list(best)
    chosen = list(min(itertools.combinations(pool, 2), key=lambda s: _subset_key(topo, s)))
    while len(chosen) < n:
        rest = [d for d in pool if d not in chosen]
        nxt = min(rest, key=lambda d: _subset_key(topo, tuple(sorted(chosen + [d]))))
        chosen.append(nxt)
    return sorted(chosen)


def explain_choice(topo: Topology, devices: list[int]) -> str:
    """One line per chosen pair: what links them."""
    lines = [f"GPUs {','.join(map(str, devices))} chosen from {topo.num_devices} ({'/'.join(topo.sources)})"]
    for i, j in itertools.combinations(devices, 2):
        lines.append(f"  GPU{i}-GPU{j}: {topo.describe_pair(i, j)}")
    return "\n".join(lines)
