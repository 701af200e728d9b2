"""Every third-party import of optimum-amdx is declared in pyproject.toml, in a user-facing group.

CI goes further (scripts/ci_extras.sh): it builds the core install at the lowest declared versions and
each extra on top of it, and runs `scripts/check_extras.py env EXTRA` in each. Here the same checker
runs its static part, and is shown to catch an undeclared import.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_extras.py"


def _checker():
    spec = importlib.util.spec_from_file_location("check_extras", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_import_is_declared():
    result = subprocess.run([sys.executable, str(SCRIPT), "static"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("static check: ok")


def test_static_check_catches_an_undeclared_import(monkeypatch):
    checker = _checker()
    real = checker.third_party_imports()
    monkeypatch.setattr(checker, "third_party_imports", lambda: {**real, "sklearn.linear_model": {"x.py"}})
    (problem,) = checker.check_static()
    assert "sklearn.linear_model" in problem and "x.py" in problem


def test_static_check_catches_a_dev_only_dependency(monkeypatch):
    checker = _checker()
    groups = checker.declared()
    groups["core"] = groups["core"] - {"accelerate"}
    monkeypatch.setattr(checker, "declared", lambda: groups)
    problems = checker.check_static()
    assert any("accelerate is needed by the core features" in p for p in problems)


def test_default_model_needs_are_core_dependencies():
    groups = _checker().declared()
    assert {"accelerate", "gguf", "transformers", "torch"} <= groups["core"]
    assert "pytest" not in groups["core"] and "gptqmodel" not in groups["all"]


def test_lower_bounds_file_matches_pyproject():
    """scripts/lower-bounds.txt pins exactly the lower bound pyproject.toml declares for each core dependency."""
    import re
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    lows = {}
    for dep in deps:
        match = re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", dep)
        assert match, f"{dep!r} has no lower bound"
        lows[match.group(1).lower().replace("-", "_")] = match.group(2)
    pinned = {}
    for line in (ROOT / "scripts" / "lower-bounds.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pinned[name.strip().lower().replace("-", "_")] = version.strip()
    lows.pop("torch")  # CI pins torch==2.13.0 (the CPU wheel it has); older torch is not tested
    for name, low in lows.items():
        assert name in pinned, f"{name} is missing from scripts/lower-bounds.txt"
        norm = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
        assert norm(pinned[name]) == norm(low) + (0,) * (len(norm(pinned[name])) - len(norm(low))), (name, low)
