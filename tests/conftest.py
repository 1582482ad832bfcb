import os

# Triton kernels run on the CPU through the interpreter (on a GPU machine, with
# TOKENTRACE_TEST_DEVICE=cuda, natively); must be set before triton imports.
if os.environ.get("TOKENTRACE_TEST_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from tests.tiny import make_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """checkpoint(arch) -> directory of a tiny random model (built once per session)."""
    cache = {}

    def get(arch: str):
        if arch not in cache:
            cache[arch] = make_checkpoint(arch, tmp_path_factory.mktemp(arch))
        return cache[arch]
    return get
