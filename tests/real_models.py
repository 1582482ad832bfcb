"""The catalog's real models for the tests that read them (parity, the logit lens, the bench's
real section): the cached GGUF file, or a skip (a failure where CI requires real models)."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from engine import LLM
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


@contextlib.contextmanager
def one_parse(path: Path) -> Iterator[None]:
    """Every `gguf.GGUFReader` of `path` opened inside is one reader, parsed once: transformers
    opens the file once for its tokenizer and again for its model, the engine once more, and
    parsing Gemma 3's 262k-token vocabulary is most of each load's time. The same class reads
    the same bytes as before; only the repeats go."""
    import gguf  # lazy: only the real-model tests read GGUF files through it

    real, shared = gguf.GGUFReader, {}

    def reader(p, *args, **kw):
        if args or kw or Path(p).resolve() != path.resolve():
            return real(p, *args, **kw)
        if "reader" not in shared:
            shared["reader"] = real(p)
        return shared["reader"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", reader)
        yield


def engine_and_reference(name: str) -> tuple[LLM, Any, torch.nn.Module]:
    """Catalog model `name` as the engine loads it (float32, CPU) and as transformers does from
    the same GGUF file: (LLM, transformers' tokenizer, transformers' model in eval mode)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: a heavy import

    path = cached_gguf(name)
    with one_parse(path):
        llm = LLM(str(path), device="cpu", dtype="float32")
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return llm, tok, model.eval()
