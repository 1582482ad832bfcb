"""engine/disagg's modules import one way (its package docstring's order), none inside a
function, and the package loads first in a fresh interpreter."""
from __future__ import annotations

import ast
import subprocess
import sys

from tests.paths import ROOT

DISAGG = ROOT / "engine" / "disagg"
ALLOWED = {"protocol": set(), "transfer": set(), "routing": set(), "lanes": set(), "prefill": {"protocol", "transfer"},
           "engine": {"protocol", "transfer", "prefill", "routing", "lanes"}, "__init__": {"engine"}}


def test_disagg_imports_go_one_way_and_none_hide_in_functions():
    for path in sorted(DISAGG.glob("*.py")):
        tree = ast.parse(path.read_text())
        top = {n.module.rsplit(".", 1)[1] for n in tree.body
               if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("engine.disagg.")}
        top |= {a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "engine.disagg"
                for a in n.names}
        assert top <= ALLOWED[path.stem], (path.name, top - ALLOWED[path.stem])
        inner = [n.lineno for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert not inner, (path.name, inner)


def test_the_package_loads_first():
    code = "import engine.disagg.engine, engine.disagg.prefill, engine.disagg.routing, engine.disagg.lanes"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
