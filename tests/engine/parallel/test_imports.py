"""engine/parallel's modules import one way: no circle, and no import inside a function to
hide one; rank 0's runner loads first in a fresh interpreter (engine/llm_engine.py imports it)."""
from __future__ import annotations

import ast
import subprocess
import sys

from tests.paths import ROOT

PARALLEL = ROOT / "engine" / "parallel"


def _imports(path) -> tuple[set[str], list[str]]:
    """(the engine.parallel modules a file imports at its top, the imports inside its functions)."""
    tree = ast.parse(path.read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("engine.parallel."):
            top.add(node.module.rsplit(".", 1)[1])
    inner = [f"{path.name}:{n.lineno}" for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
             for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return top, inner


def test_parallel_imports_have_no_circle_and_none_inside_functions():
    graph, inner = {}, []
    for path in sorted(PARALLEL.glob("*.py")):
        graph[path.stem], found = _imports(path)
        inner += found
    assert inner == []
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join(path + (module,))}"
        if module not in done:
            for dep in graph.get(module, ()):
                visit(dep, path + (module,))
            done.add(module)
    for module in graph:
        visit(module, ())


def test_the_runner_imports_first_in_a_fresh_interpreter():
    code = "import engine.parallel.runner as r, engine.llm_engine as e; assert e.ParallelRunner is r.ParallelRunner"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
