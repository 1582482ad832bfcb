import os

# Triton kernels run on the CPU through the interpreter (on a GPU machine, with
# TOKENTRACE_TEST_DEVICE=cuda, natively); must be set before triton imports.
if os.environ.get("TOKENTRACE_TEST_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TOKENTRACE_DB", "none")  # servers the tests start keep traces in memory unless a test says --db
# OpenMP threads (torch's and the C kernels') that finish a parallel region spin up to 300,000
# times before they sleep: with 3 workers on 2 cores they spin against each other's work (3
# processes decoding beside each other: 30 s, 10 s with passive waits, 13 s at 1,000; one alone:
# 3.2 s, 9.2, 4.1). Set before torch loads libgomp; the servers and ranks the tests start inherit it
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

import pytest  # noqa: E402

from tests import cpu_times  # noqa: E402
from tests.worker_timeline import TIMELINE  # noqa: E402
from tests.workers import auto_workers  # noqa: E402
from tests.cost_markers import costliest_modules_first, mark_costs  # noqa: E402
from tests.tiny import make_checkpoint  # noqa: E402


def pytest_collection_modifyitems(config, items) -> None:
    """Mark what makes each test slow (browser, procs, real_model) from what it uses, so no
    test file carries these marks by hand (select with -m, e.g. -m "not browser"); then the
    costliest modules first, for the workers (pytest.ini)."""
    mark_costs(items)
    costliest_modules_first(items)


def pytest_xdist_auto_num_workers(config) -> int:
    return auto_workers()


# CPU seconds per test, printed after --durations' wall times (tests/cpu_times.py)
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from cpu_times.measure(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from cpu_times.measure(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from cpu_times.measure(item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    cpu_times.attach(item, outcome.get_result())


def pytest_runtest_logreport(report) -> None:
    cpu_times.keep(report)
    TIMELINE.keep(report)


def pytest_terminal_summary(terminalreporter) -> None:
    cpu_times.summary(terminalreporter)
    TIMELINE.summary(terminalreporter)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """checkpoint(arch) -> directory of a tiny random model (built once per session)."""
    cache = {}

    def get(arch: str):
        if arch not in cache:
            cache[arch] = make_checkpoint(arch, tmp_path_factory.mktemp(arch))
        return cache[arch]
    return get


# --- browser tests (tests/app/*/test_browser_*.py): each module defines its own `server` ---
@pytest.fixture(scope="module")
def browser(server):
    """Chromium for a module's page tests (after its server: that skips, or fails in CI, without a browser)."""
    # imported here, not at the top: it imports gradio (seconds), which most tests never need
    from tests.browser_utils import chromium
    with chromium() as b:
        yield b


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    """Where the browser tests' screenshots go: $TOKENTRACE_SCREENSHOTS, to look at them, or a temporary folder."""
    from pathlib import Path
    d = Path(os.environ.get("TOKENTRACE_SCREENSHOTS") or tmp_path_factory.mktemp("screenshots"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture
def cpu_kernels_switch(monkeypatch):
    """switch(on) turns the CPU's C kernels (engine/kernels/cpu*.c) on or off for this test
    and says whether they run; on=True without them skips, or fails where CI requires them
    (TOKENTRACE_REQUIRE_CPU_KERNELS=1). Afterwards the switch is undone and the cached
    libraries dropped, so no later test inherits an "off" looked up during this one."""
    from engine.kernels import cpu, cpu_quant

    def clear() -> None:
        cpu.library.cache_clear()
        cpu_quant.library.cache_clear()

    def switch(on: bool) -> bool:
        monkeypatch.setenv("TOKENTRACE_CPU_KERNELS", "1" if on else "0")
        clear()
        if on and not cpu.available():
            if os.environ.get("TOKENTRACE_REQUIRE_CPU_KERNELS") == "1":
                cpu.build()  # raises with the compiler's message
            pytest.skip("no C compiler for the CPU kernels")
        return cpu.available()

    yield switch
    monkeypatch.undo()
    clear()
