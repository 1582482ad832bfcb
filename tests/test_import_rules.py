"""The layers' rules, read from the source (every import statement, those inside functions
too): engine/ imports nothing of app/, visualizers/, benchmarks/ or tests/; visualizers/
import neither engine/ nor app/; app/ imports only the engine's public modules, and of
them only the names they export, and reads none of an engine object's parts."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tests.paths import ROOT

# The engine as a server sees it: the package (engine/__init__.py's __all__: LLM, LLMEngine and
# its describe()/load() dataclasses, SamplingParams, outputs, errors, the tracer) and its trace
# (engine/trace/__init__.py's __all__: the tracer, STAGES, SCHEMA_VERSION). Everything else in
# engine/ is the engine's own business, free to change.
PUBLIC_ENGINE = ("engine", "engine.trace")
FORBIDDEN = {"engine": ("app", "visualizers", "benchmarks", "tests"),
             "visualizers": ("engine", "app", "benchmarks", "tests")}
# Attributes of the engine's parts: reading one from app/ reaches past LLMEngine's public methods.
ENGINE_PARTS = {"runner", "scheduler", "block_manager", "speculator", "model_config", "kv_cache",
                "decode_graphs", "requests", "stats", "block_table", "num_aborted"}


def imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names imported from it) for every import in a file."""
    out = []
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from the file's own package up
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            out.append((node.lineno, module, [a.name for a in node.names]))
    return out


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def top(module: str) -> str:
    return module.split(".")[0]


def violations(folder: str) -> list[str]:
    bad = []
    for path in sources(folder):
        where = path.relative_to(ROOT)
        for line, module, names in imports(path):
            if top(module) in FORBIDDEN.get(folder, ()):
                bad.append(f"{where}:{line} imports {module}")
            if folder == "app" and top(module) == "engine":
                if module not in PUBLIC_ENGINE:
                    bad.append(f"{where}:{line} imports {module}, not one of the engine's public modules "
                               f"{PUBLIC_ENGINE}")
                else:
                    exported = importlib.import_module(module).__all__
                    bad += [f"{where}:{line} imports {n} from {module}, which does not export it"
                            for n in names if n not in exported]
    return bad


@pytest.mark.parametrize("folder", ["engine", "visualizers", "app"])
def test_each_layer_imports_only_what_it_may(folder):
    assert sources(folder), folder
    assert violations(folder) == []


def test_app_reads_no_part_of_the_engine():
    bad = []
    for path in sources("app"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ENGINE_PARTS:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} .{node.attr}")
            # anything private of an engine: engine._x, self.engine._x, service.engine._x
            inner = node.value if isinstance(node, ast.Attribute) else None
            if isinstance(inner, (ast.Name, ast.Attribute)) and node.attr.startswith("_") and \
                    (getattr(inner, "id", None) or getattr(inner, "attr", None)) == "engine":
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} engine.{node.attr}")
    assert bad == []


def test_the_rules_catch_a_violation(tmp_path, monkeypatch):
    """The checks above are not vacuous: a bad import in each folder is found."""
    for folder, line in (("engine", "from app.serving import engine_service"),
                         ("visualizers", "import engine"),
                         ("app", "from engine.block_manager import BlockManager"),
                         ("app", "from engine import Sequence")):
        bad = tmp_path / folder / "bad_module.py"
        bad.parent.mkdir(exist_ok=True)
        bad.write_text(f"def f():\n    {line}\n")
        monkeypatch.setattr("tests.test_import_rules.sources", lambda f, b=bad, fo=folder: [b] if f == fo else [])
        monkeypatch.setattr("tests.test_import_rules.ROOT", tmp_path)
        assert len(violations(folder)) == 1, (folder, line)
        bad.unlink()
