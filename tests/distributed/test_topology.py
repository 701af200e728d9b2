"""Topology parsing on real tool output, GPU choice, visible-device environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from optimum_amdx.distributed.launch import parse_device_list, plan_launch, visible_devices_env
from optimum_amdx.distributed.topology import (
    choose_devices,
    explain_choice,
    parse_amd_smi,
    parse_nvidia_smi,
    parse_rocm_smi,
    parse_topology,
)
from optimum_amdx.errors import HardwareError, InvalidArgumentError

DATA = Path(__file__).parent / "data"


def mi250():
    bw = parse_topology((DATA / "rocm_smi_shownodesbw_mi250_8gcd.txt").read_text())
    return bw.merge(parse_topology((DATA / "rocm_smi_showtoponuma_mi250_8gcd.txt").read_text()))


def test_rocm_smi_showtopo_pcie_fixture():
    topo = parse_rocm_smi((DATA / "rocm_smi_showtopo_pcie_4gpu.txt").read_text())
    assert topo.num_devices == 4
    assert topo.weight[0][1] == 52 and topo.weight[3][2] == 52 and topo.weight[1][1] is None
    assert topo.hops[2][0] == 3
    assert topo.link_type[0][3] == "PCIE" and topo.link_type[2][2] is None
    assert topo.numa == [0, 1, 3, 2]
    assert not topo.direct(0, 1)
    assert choose_devices(topo, 2) == [0, 1]  # all pairs equal: the lowest indices


def test_mi250_bandwidth_fixture_parsed():
    topo = mi250()
    assert topo.num_devices == 8
    assert topo.bandwidth[0][1] == 200_000 and topo.bandwidth[0][6] == 100_000
    assert topo.bandwidth[0][2] == 50_000 and topo.bandwidth[0][3] == 0
    assert topo.bandwidth[4][4] is None
    assert topo.numa == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topo.direct(6, 7) and not topo.direct(1, 2)


def test_mi250_pairs_gcds_of_one_package():
    topo = mi250()
    # The Hugging Face optimum-amd page for this machine: two devices -> 0,1 (or 2,3 / 4,5 / 6,7).
    assert choose_devices(topo, 2) == [0, 1]
    assert choose_devices(topo, 2, candidates=[2, 3, 4, 6]) == [2, 3]
    assert choose_devices(topo, 2, candidates=[1, 3, 4, 5]) == [4, 5]
    # Three devices -> 0,1,6 as that page advises.
    assert choose_devices(topo, 3) == [0, 1, 6]
    four = choose_devices(topo, 4)
    assert all({a, a + 1} <= set(four) or not ({a, a + 1} & set(four)) for a in (0, 2, 4, 6))  # whole packages
    assert choose_devices(topo, 8) == list(range(8))
    text = explain_choice(topo, [0, 1])
    assert "GPU0-GPU1: 200 GB/s" in text


def test_too_many_gpus_is_a_hardware_error():
    with pytest.raises(HardwareError, match="Asked for 9 GPUs but only 8"):
        choose_devices(mi250(), 9)
    with pytest.raises(InvalidArgumentError, match="not on this machine"):
        choose_devices(mi250(), 2, candidates=[0, 11])


# amd-smi topology layout as quoted in ROCm/rocm-systems issue #5763 (tables titled "... TABLE:",
# devices labelled by PCI bus id). CONSTRUCTED for this test: an 8-GPU MI300X-like hive where every
# pair is one XGMI hop (weight 15 per the amd-smi docs) except GPUs 6 and 7, reached over PCIe.
def amd_smi_text() -> str:
    bdfs = [f"0000:{b:02x}:00.0" for b in (0x05, 0x26, 0x46, 0x65, 0x85, 0xA5, 0xC5, 0xE5)]

    def table(title, cell):
        head = "             " + " ".join(f"{b:<12}" for b in bdfs)
        rows = [f"{bdfs[i]} " + " ".join(f"{cell(i, j):<12}" for j in range(8)) for i in range(8)]
        return "\n".join([title, head, *rows, ""])

    def slow(i, j):
        return i != j and (i >= 6 or j >= 6)

    return "\n".join([
        table("ACCESS TABLE:", lambda i, j: "ENABLED"),
        table("WEIGHT TABLE:", lambda i, j: 0 if i == j else (40 if slow(i, j) else 15)),
        table("HOPS TABLE:", lambda i, j: 0 if i == j else (2 if slow(i, j) else 1)),
        table("LINK TYPE TABLE:", lambda i, j: "SELF" if i == j else ("PCIE" if slow(i, j) else "XGMI")),
    ])


def test_amd_smi_layout():
    topo = parse_topology(amd_smi_text())
    assert topo.sources == ["amd-smi"] and topo.num_devices == 8
    assert topo.labels[0] == "0000:05:00.0"
    assert topo.weight[0][1] == 15 and topo.weight[0][7] == 40 and topo.hops[6][1] == 2
    assert topo.link_type[2][3] == "XGMI" and topo.link_type[7][0] == "PCIE" and topo.link_type[3][3] is None
    assert choose_devices(topo, 2, candidates=[0, 6, 7]) == [0, 6]  # ties broken by lowest index
    assert choose_devices(topo, 6) == [0, 1, 2, 3, 4, 5]  # the XGMI-only six
    assert parse_amd_smi(amd_smi_text()).num_devices == 8


NVIDIA_TOPO = (
    "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
    "GPU0\t X \tSYS\tNV18\t0-15\t0\t\tN/A\n"
    "GPU1\tSYS\t X \tSYS\t16-31\t1\t\tN/A\n"
    "GPU2\tNV18\tSYS\t X \t0-15\t0\t\tN/A\n"
    "\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect\n"
)


def test_nvidia_smi_topo():
    topo = parse_nvidia_smi(NVIDIA_TOPO)
    assert topo.vendor == "nvidia" and topo.num_devices == 3
    assert topo.link_type[0][2] == "NV18" and topo.bandwidth[0][2] == 18 * 25_000 and topo.bandwidth[0][1] == 0
    assert topo.numa == [0, 1, 0]
    assert choose_devices(topo, 2) == [0, 2]


def test_unrecognized_text_is_a_clear_error():
    with pytest.raises(InvalidArgumentError, match="Unrecognized topology text"):
        parse_topology("hello world\n1 2 3\n")
    truncated = (DATA / "rocm_smi_showtopo_pcie_4gpu.txt").read_text().splitlines()
    del truncated[4]  # drop the GPU1 row of the weight matrix
    with pytest.raises(InvalidArgumentError, match="weight matrix"):
        parse_rocm_smi("\n".join(truncated))


def test_visible_devices_env():
    env, removed = visible_devices_env([4, 5], "amd")
    assert env == {"ROCR_VISIBLE_DEVICES": "4,5", "HIP_VISIBLE_DEVICES": "0,1"} and removed == ["CUDA_VISIBLE_DEVICES"]
    env, removed = visible_devices_env([1, 3], "nvidia")
    assert env == {"CUDA_VISIBLE_DEVICES": "1,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"} and removed == []
    assert parse_device_list("0, 2") == [0, 2] and parse_device_list("GPU-abc") is None


def test_plan_launch_chooses_and_sets_env(monkeypatch):
    import optimum_amdx.hardware.system as system

    monkeypatch.setattr(system, "numa_balancing", lambda *a, **k: 1)
    plan = plan_launch(["run.py", "--x", "1"], 2, topology=mi250(),
                       environ={"ROCR_VISIBLE_DEVICES": "2,3,4,5", "CUDA_VISIBLE_DEVICES": "7"})
    assert plan.devices == [2, 3]  # the inherited ROCR list (e.g. from SLURM) bounds the choice
    env = plan.environment({"CUDA_VISIBLE_DEVICES": "7", "PATH": "/bin"})
    assert env["ROCR_VISIBLE_DEVICES"] == "2,3" and env["HIP_VISIBLE_DEVICES"] == "0,1"
    assert "CUDA_VISIBLE_DEVICES" not in env and env["PATH"] == "/bin"
    assert plan.command[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    assert plan.command[-3:] == ["run.py", "--x", "1"]
    assert any("NUMA balancing is on" in w for w in plan.warnings)
    monkeypatch.setattr(system, "numa_balancing", lambda *a, **k: 0)
    assert plan_launch(["run.py"], 2, topology=mi250(), environ={}).warnings == []


def test_plan_launch_errors():
    with pytest.raises(HardwareError, match="Asked for 3 GPUs but only 2"):
        plan_launch(["run.py"], 3, topology=mi250(), environ={"ROCR_VISIBLE_DEVICES": "0,1"})
    with pytest.raises(InvalidArgumentError, match="No script given"):
        plan_launch([], 2, topology=mi250(), environ={})
    with pytest.raises(HardwareError, match=r"GPUs \[9\] are not visible"):
        plan_launch(["run.py"], 2, devices=[0, 9], topology=mi250(), environ={})


def test_launch_cli_dry_run(capsys, tmp_path, monkeypatch):
    from optimum_amdx.cli.main import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "script.py").write_text("print('hi')\n")
    files = ["--topology-file", str(DATA / "rocm_smi_shownodesbw_mi250_8gcd.txt"),
             "--topology-file", str(DATA / "rocm_smi_showtoponuma_mi250_8gcd.txt")]
    assert main(["launch", "--gpus", "2", *files, "--dry-run", "--", "script.py", "--flag"]) == 0
    err = capsys.readouterr().err
    assert "ROCR_VISIBLE_DEVICES=0,1" in err and "script.py --flag" in err
    assert main(["launch", "--gpus", "16", *files, "--dry-run", "--", "script.py"]) == 2
    assert "Asked for 16 GPUs but only 8" in capsys.readouterr().err


def test_real_nvidia_smi_topo_from_h200_pair():
    topo = parse_topology((DATA / "nvidia_smi_topo_h200x2.txt").read_text())
    assert topo.vendor == "nvidia" and topo.num_devices == 2
    assert topo.link_type[0][1] == "NV18" and topo.numa == [0, 0]
    plan = plan_launch(["run.py"], 2, topology=topo, environ={})
    assert plan.env_updates == {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_real_amd_smi_topology_from_amd_changelog():
    topo = parse_topology((DATA / "amd_smi_topology_8gpu_xgmi.txt").read_text())
    assert topo.sources == ["amd-smi"] and topo.num_devices == 8
    assert topo.labels[4] == "0000:9f:00.0"
    assert topo.weight[0][7] == 15 and topo.hops[5][2] == 1 and topo.link_type[1][6] == "XGMI"
    assert topo.bandwidth[3][4] == 50_000 and topo.bandwidth[3][3] is None
    assert all(topo.direct(i, j) for i in range(8) for j in range(8) if i != j)
    assert choose_devices(topo, 4) == [0, 1, 2, 3]  # a full XGMI mesh: every subset is equal
    assert choose_devices(topo, 2, candidates=[3, 5, 6]) == [3, 5]
