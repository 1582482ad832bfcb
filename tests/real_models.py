"""The catalog's real models for the tests that read them (parity, the logit lens, the bench's
real section): the cached GGUF file, or a skip (a failure where CI requires real models)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.checkpoint.catalog import CATALOG, cached_path


def cached_gguf(name: str) -> Path:
    """The cached GGUF of catalog model `name`; skips without it, unless
    TOKENTRACE_REQUIRE_REAL_MODELS=1 (CI), where a missing file fails the test."""
    path = cached_path(CATALOG[name])
    if not path.is_file():
        if os.environ.get("TOKENTRACE_REQUIRE_REAL_MODELS"):
            pytest.fail(f"{name} is not in the cache; run `python -m engine.checkpoint fetch {name} --no-hub`")
        pytest.skip(f"{name} not cached (python -m engine.checkpoint fetch {name} --no-hub)")
    return path
