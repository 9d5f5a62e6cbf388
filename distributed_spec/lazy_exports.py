"""A package's public names imported on first use (PEP 562), so importing the package stays cheap.

    __getattr__ = lazy_exports(__name__, {"loading": ("load_pair", ...)})

distributed_spec.config imports the torch-free config modules of engine/, models/ and distributed/;
their packages' `__init__` must not pull torch, transformers or Ray in with them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, Sequence[str]]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package`: exports maps a submodule's name to the names it serves."""
    module_of = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
