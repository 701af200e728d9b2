"""Check that every third-party module optimum-amdx imports is declared, in the extra that enables it.

Two modes (standard library only, so it runs in an environment without pytest):

  python scripts/check_extras.py static
      Reads every `import` in optimum_amdx/ (also those inside functions) and pyproject.toml: each
      third-party module must come from a distribution declared in the core dependencies or in a
      user-facing extra (not only in dev/peers).
  python scripts/check_extras.py extras
      Prints the user-facing extras of pyproject.toml (all optional groups but dev, peers and all).
  python scripts/check_extras.py env EXTRA        (EXTRA: core or one of those extras)
      Run inside an environment that has the core dependencies plus EXTRA only (CI builds them in
      scripts/ci_extras.sh). Proves the environment is isolated (the other extras' modules are absent),
      then imports every optimum_amdx module and every third-party name our code imports that core+EXTRA
      should provide, plus the modules libraries load for us (accelerate and gguf for the default
      model's GGUF, onnxscript for torch.onnx.export).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "optimum_amdx"

# import name -> distribution name on PyPI
DISTRIBUTION = {
    "torch": "torch", "transformers": "transformers", "optimum": "optimum", "safetensors": "safetensors",
    "huggingface_hub": "huggingface_hub", "tqdm": "tqdm", "numpy": "numpy", "gguf": "gguf",
    "accelerate": "accelerate", "onnx": "onnx", "onnxruntime": "onnxruntime", "onnxscript": "onnxscript",
    "triton": "triton", "datasets": "datasets", "deepspeed": "deepspeed", "matplotlib": "matplotlib",
    "starlette": "starlette", "uvicorn": "uvicorn", "prometheus_client": "prometheus_client",
}
# modules no import statement of ours names, but that a library loads for one of our features
IMPLICIT = {"core": ["accelerate", "gguf"], "onnx": ["onnxscript"]}
NOT_USER_EXTRAS = ("dev", "peers", "all")  # test tools, peer libraries for interop tests, everything


def _requirement_name(req: str) -> str:
    return re.split(r"[\s<>=!~;\[]", req.strip(), maxsplit=1)[0].lower().replace("-", "_")


def user_extras() -> list[str]:
    """The extras that enable features (every optional group but dev, peers and all)."""
    return [name for name in declared() if name not in ("core",) + NOT_USER_EXTRAS]


def declared() -> dict[str, set[str]]:
    """Distribution names per group of pyproject.toml: 'core' and each optional extra."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"core": {_requirement_name(r) for r in project["dependencies"]}}
    for extra, reqs in project["optional-dependencies"].items():
        groups[extra] = {_requirement_name(r) for r in reqs if not r.startswith("optimum-amdx")}
    return groups


def third_party_imports() -> dict[str, set[str]]:
    """Dotted third-party module names imported anywhere in optimum_amdx/, with the files importing each."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "optimum_amdx":
                    continue
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def check_static() -> list[str]:
    """Problems: undeclared or dev-only third-party imports."""
    groups = declared()
    user = groups["core"].union(*(groups[e] for e in user_extras()))
    problems = []
    for name, files in sorted(third_party_imports().items()):
        top = name.split(".")[0]
        dist = DISTRIBUTION.get(top)
        if dist is None:
            problems.append(f"{name} (imported by {', '.join(sorted(files))}) is not in DISTRIBUTION of "
                            f"scripts/check_extras.py: declare it in pyproject.toml and map it here")
        elif dist.lower() not in user:
            problems.append(f"{name} (distribution {dist}, imported by {', '.join(sorted(files))}) is not declared in "
                            f"the core dependencies or a user extra of pyproject.toml")
    for group, modules in IMPLICIT.items():
        for module in modules:
            if DISTRIBUTION[module] not in groups[group]:
                problems.append(f"{module} is needed by the {group} features but not declared in {group}")
    return problems


def _importable(name: str) -> str | None:
    try:
        importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - report every kind of import failure
        return f"{type(err).__name__}: {err}"
    return None


def check_env(extra: str) -> list[str]:
    """Problems in this environment, which must have core + `extra` only."""
    groups = declared()
    allowed = set(groups["core"]) | (groups[extra] if extra != "core" else set())
    problems = []
    # 1. isolation: the other extras' modules must be absent, or this check proves nothing
    for top, dist in sorted(DISTRIBUTION.items()):
        if dist in allowed or dist not in set().union(*(groups[e] for e in user_extras())):
            continue
        if importlib.util.find_spec(top) is not None:
            problems.append(f"{top} is importable, but {dist} belongs to another extra: this environment is not "
                            f"core+{extra} only")
    # 2. every third-party name our code imports from core+extra resolves
    for name, files in sorted(third_party_imports().items()):
        if DISTRIBUTION.get(name.split(".")[0]) in allowed:
            err = _importable(name)
            if err:
                problems.append(f"import {name} (used by {', '.join(sorted(files))}) fails with core+{extra}: {err}")
    for module in IMPLICIT["core"] + (IMPLICIT.get(extra, []) if extra != "core" else []):
        err = _importable(module)
        if err:
            problems.append(f"import {module} fails with core+{extra}: {err}")
    # 3. every optimum_amdx module imports, unless it imports another extra's module at its top level
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if module.endswith("__main__"):
            continue
        needs = _top_level_needs(path)
        if needs - allowed:
            continue
        err = _importable(module)
        if err:
            problems.append(f"import {module} fails with core+{extra}: {err}")
    # 4. the default model's GGUF path: transformers checks these itself
    from transformers.utils import is_accelerate_available, is_gguf_available

    if not (is_accelerate_available() and is_gguf_available()):
        problems.append("transformers cannot read the default model's GGUF (accelerate or gguf missing or too old)")
    return problems


def _top_level_needs(path: Path) -> set[str]:
    """Distributions a module imports at module level outside try blocks (what importing it requires)."""
    needs = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        needs |= {DISTRIBUTION[n.split(".")[0]] for n in names if n.split(".")[0] in DISTRIBUTION}
    return needs


def main(argv: list[str]) -> int:
    if argv[:1] == ["static"]:
        problems = check_static()
        label = "static check"
    elif argv == ["extras"]:
        print(" ".join(user_extras()))
        return 0
    elif len(argv) == 2 and argv[0] == "env" and argv[1] in ["core"] + user_extras():
        problems = check_env(argv[1])
        label = f"core+{argv[1]}" if argv[1] != "core" else "core"
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for p in problems:
        print(f"FAIL {p}")
    print(f"{label}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
