"""The package's import graph has no circles, and every module imports on its own.

A circle (a imports b, which imports a) works only in some import orders; docs/design.md section 8
lays the package out in layers so that none can form. The graph counts every import of a package
module, at module level or inside a function (a lazy import is still a dependency), except those
under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import distributed_spec

PACKAGE_DIR = Path(distributed_spec.__file__).resolve().parent
PACKAGE = PACKAGE_DIR.name


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imported_modules(path: Path) -> set[str]:
    """The package modules `path` imports: `from pkg import sub` counts as pkg.sub when sub is a module."""
    module = _module_name(path)
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in MODULES else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {name for name in found if name in MODULES and name != module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                connect(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            connect(node)
    return components


def test_the_import_graph_has_no_circles():
    graph = {module: _imported_modules(path) for module, path in MODULES.items()}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Imported on its own in a forked child of an interpreter that has loaded only third-party libraries
# (torch, transformers, DeepSpeed, Ray, W&B: the slow ones): nothing of the package is imported before the module, so a
# missing or circular import shows, at a fraction of a fresh interpreter's cost per module.
_ISOLATED_IMPORTS = """
import os, sys, traceback
import torch, transformers, deepspeed, ray, hydra, wandb  # noqa: F401
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel  # noqa: F401  (lazy)
failed = []
for name in sys.argv[1:]:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            __import__(name)
            os._exit(0)
        except BaseException:
            os.write(write_end, traceback.format_exc()[-1500:].encode())
            os._exit(1)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    if status != 0:
        failed.append(name + ": " + message)
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""
# Modules that need what a CPU test machine may lack.
_OPTIONAL = {f"{PACKAGE}.verify.triton_block": "triton"}


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_every_module_imports_on_its_own():
    import importlib.util

    modules = [
        module
        for module in sorted(MODULES)
        if module not in _OPTIONAL or importlib.util.find_spec(_OPTIONAL[module]) is not None
    ]
    result = subprocess.run(
        [sys.executable, "-c", _ISOLATED_IMPORTS, *modules], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
