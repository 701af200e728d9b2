"""Lazy public names for packages whose modules import torch or transformers.

A package lists `name -> module` and gets module-level `__getattr__` / `__dir__` that import the
module on first access, so `import optimum_amdx.<package>` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


def lazy_exports(package: str, names: dict[str, str], eager: tuple[str, ...] = ()) -> tuple[
        Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """Return `(__getattr__, __dir__, __all__)` for `package`.

    `names` maps a public name to the module that defines it, absolute or relative to `package`
    (a leading "."). `eager` lists names the package already defines itself.
    """
    public = sorted(set(names) | set(eager))

    def __getattr__(name: str) -> Any:
        module_name = names.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(module_name, package if module_name.startswith(".") else None)
        value = getattr(module, name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:
        return public

    return __getattr__, __dir__, public
