"""The layers' rules, read from the source (every import statement, those inside functions
too): engine/ imports nothing of app/, visualizers/, benchmarks/ or tests/; visualizers/
import neither engine/ nor app/; app/ imports only the engine's public modules, and of
them only the names they export, and reads none of an engine object's parts.

And the house's rules, outside tests/: no import circle among the project's modules; no
import of a project module inside a function unless its line (or the line above) says it
is lazy, for a heavy or optional package; no file over 500 lines; no function over 100; the
engine's core (engine/llm_engine.py) at most 400 lines, so that it reads top to bottom; no
comment or docstring that writes the path of a file the module imports (the import names it)."""
from __future__ import annotations

import ast
import importlib
import io
import os
import re
import tokenize
from functools import cache
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


# ---- the house's rules: circles, imports inside functions, sizes ----

PROJECT = ("app", "engine", "visualizers", "benchmarks")  # the packages whose modules these rules follow
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 100
CORE, MAX_CORE_LINES = Path("engine/llm_engine.py"), 400  # the loop a learner reads first
SKIPPED_FOLDERS = {"tests", "venv", "env", "site-packages", "node_modules", "build", "site", "__pycache__"}


def house_files(root: Path) -> list[Path]:
    """Every .py file under root outside tests/, hidden folders and environments."""
    out = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in SKIPPED_FOLDERS]
        out += [Path(folder) / f for f in files if f.endswith(".py")]
    return sorted(out)


def parsed(path: Path) -> tuple[str, ast.Module]:
    """(text, tree) of a file, parsed once for every rule (a rewritten file is parsed again)."""
    stat = path.stat()
    return _parsed(str(path), stat.st_mtime_ns, stat.st_size)


@cache
def _parsed(path: str, mtime_ns: int, size: int) -> tuple[str, ast.Module]:
    text = Path(path).read_text()
    return text, ast.parse(text, path)


def module_of(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports_with_place(tree: ast.AST, inside: bool = False):
    """(import node, whether it sits inside a function) for every import in a tree."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, inside
        yield from _imports_with_place(node, inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                          ast.Lambda)))


def _absolute(node: ast.ImportFrom, path: Path, root: Path) -> str:
    if not node.level:
        return node.module or ""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    base = list(package[:len(package) - node.level + 1])
    return ".".join(base + ([node.module] if node.module else []))


def _targets(node, path: Path, root: Path, modules: set[str]) -> list[str]:
    """The project modules an import statement loads (a name imported from a package may be a module)."""
    if isinstance(node, ast.Import):
        named = [a.name for a in node.names]
    else:
        module = _absolute(node, path, root)
        named = [f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names]
    out = []
    for name in named:
        parts = name.split(".")
        found = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules), None)
        if found and found not in out:
            out.append(found)
    return out


def import_graph(root: Path) -> dict[str, dict[str, str]]:
    """module -> {module it imports: "path:line" of the first such import}, every import statement
    counted (at module level, under `if TYPE_CHECKING:`, inside functions)."""
    files = {module_of(p, root): p for p in house_files(root) if p.relative_to(root).parts[0] in PROJECT}
    graph: dict[str, dict[str, str]] = {m: {} for m in files}
    for module, path in files.items():
        for node, _ in _imports_with_place(parsed(path)[1]):
            for target in _targets(node, path, root, set(files)):
                if target != module:
                    graph[module].setdefault(target, f"{path.relative_to(root)}:{node.lineno}")
    return graph


def _strongly_connected(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """Tarjan's components of more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _one_circle(graph: dict[str, dict[str, str]], component: list[str]) -> list[str]:
    """A shortest circle through the component's first module, as "a -> b (path:line)" steps."""
    inside, start = set(component), component[0]
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    steps, at = [], v
                    chain = [v]
                    while at != start:
                        at = came[at]
                        chain.append(at)
                    chain.reverse()
                    for a, b in zip(chain, chain[1:] + [start]):
                        steps.append(f"{a} -> {b} ({graph[a][b]})")
                    return steps
                if w in inside and w not in came and w != start:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    return []


def circles(root: Path) -> list[str]:
    graph = import_graph(root)
    return [f"{len(c)} modules in a circle ({', '.join(c)}): " + "; ".join(_one_circle(graph, c))
            for c in _strongly_connected(graph)]


def _says_lazy(lines: list[str], node: ast.AST) -> bool:
    near = lines[max(node.lineno - 2, 0):node.end_lineno]
    return any("#" in line and "lazy" in line.split("#", 1)[1].lower() for line in near)


def unmarked_imports(root: Path) -> list[str]:
    """Imports of a project module inside a function whose line (or the line above) does not say lazy."""
    bad = []
    for path in house_files(root):
        text, tree = parsed(path)
        lines = text.splitlines()
        for node, inside in _imports_with_place(tree):
            if not inside or _says_lazy(lines, node):
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [_absolute(node, path, root)]
            if any(top(n) in PROJECT for n in names) or getattr(node, "level", 0):
                bad.append(f"{path.relative_to(root)}:{node.lineno} {lines[node.lineno - 1].strip()}")
    return bad


def long_files(root: Path) -> list[str]:
    sizes = ((p, len(parsed(p)[0].splitlines())) for p in house_files(root))
    return [f"{p.relative_to(root)}:1 {n} lines" for p, n in sizes if n > MAX_FILE_LINES]


def long_core(root: Path) -> list[str]:
    path = root / CORE
    n = len(parsed(path)[0].splitlines()) if path.exists() else 0
    return [f"{CORE}:1 {n} lines, more than {MAX_CORE_LINES}"] if n > MAX_CORE_LINES else []


def long_functions(root: Path) -> list[str]:
    bad = []
    for path in house_files(root):
        for node in ast.walk(parsed(path)[1]):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    bad.append(f"{path.relative_to(root)}:{node.lineno} {node.name}() {n} lines")
    return bad


PATH_IN_TEXT = re.compile(r"\b(?:app|engine|visualizers|benchmarks)(?:/\w+)*\.py\b")


def _comments(text: str, tree: ast.Module) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a file."""
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(text).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                out.append((node.body[0].lineno, doc))
    return out


def paths_of_imports(root: Path) -> list[str]:
    """A comment or docstring that writes the path of a project file its module imports: the
    import already names it, and the path goes stale when the file moves."""
    bad = []
    for path in house_files(root):
        text, tree = parsed(path)
        imported = set()
        for node, _ in _imports_with_place(tree):
            if isinstance(node, ast.Import):
                imported |= {a.name for a in node.names}
            else:
                module = _absolute(node, path, root)
                imported |= {module} | {f"{module}.{a.name}" for a in node.names}
        for line, words in _comments(text, tree):
            for written in PATH_IN_TEXT.findall(words):
                if written.removesuffix(".py").replace("/", ".") in imported:
                    bad.append(f"{path.relative_to(root)}:{line} {written}")
    return bad


HOUSE_RULES = {"circles": circles, "unmarked_imports": unmarked_imports, "long_files": long_files,
               "long_functions": long_functions, "long_core": long_core, "paths_of_imports": paths_of_imports}


@pytest.mark.parametrize("rule", sorted(HOUSE_RULES))
def test_the_house_keeps_its_rules(rule):
    assert house_files(ROOT), ROOT
    bad = HOUSE_RULES[rule](ROOT)
    if bad:
        pytest.fail(f"{rule}: {len(bad)} found:\n" + "\n".join(bad), pytrace=False)


def test_the_house_rules_catch_a_violation(tmp_path):
    """A circle closed inside a function, that import unmarked, a long file, a long function, a
    long core and the path of an imported file in a docstring are each found; a lazy import of a
    heavy package, a circle-free tree and the path of a file not imported are not."""
    (tmp_path / "engine" / "kernels").mkdir(parents=True)
    (tmp_path / "engine" / "__init__.py").write_text("")
    (tmp_path / "engine" / "kernels" / "__init__.py").write_text("from .fast import run\n")
    (tmp_path / "engine" / "kernels" / "fast.py").write_text(
        "def run():\n    from ._triton import go  # lazy: importing triton is not free\n    return go()\n")
    (tmp_path / "engine" / "kernels" / "_triton.py").write_text("def go():\n    return 1\n")
    (tmp_path / "engine" / "a.py").write_text("from engine.b import y  # engine/kernels/fast.py: not imported\nx = 1\n")
    assert all(rule(tmp_path) == [] for rule in HOUSE_RULES.values())
    (tmp_path / "engine" / "b.py").write_text("def y():\n    from engine import a\n    return a.x\n"
                                              + "\n" * MAX_FILE_LINES)
    (tmp_path / CORE).write_text("x = 1\n" * (MAX_CORE_LINES + 1))
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "long.py").write_text('"""Reads engine/b.py."""\nimport engine.b\n\n\ndef f():\n'
                                              + "    pass\n" * MAX_FUNCTION_LINES)
    assert circles(tmp_path) == ["2 modules in a circle (engine.a, engine.b): engine.a -> engine.b (engine/a.py:1); "
                                 "engine.b -> engine.a (engine/b.py:2)"]
    assert unmarked_imports(tmp_path) == ["engine/b.py:2 from engine import a"]
    assert long_files(tmp_path) == [f"engine/b.py:1 {MAX_FILE_LINES + 3} lines"]
    assert long_functions(tmp_path) == [f"app/long.py:5 f() {MAX_FUNCTION_LINES + 1} lines"]
    assert paths_of_imports(tmp_path) == ["app/long.py:1 engine/b.py"]
    assert long_core(tmp_path) == [f"{CORE}:1 {MAX_CORE_LINES + 1} lines, more than {MAX_CORE_LINES}"]
