"""Stream a checkpoint's weights (safetensors shards, or a GGUF's tensors dequantized) into
our model, with progress and one clear error per failure; quantize them if asked."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import torch
from tqdm.auto import tqdm

from engine.checkpoint.errors import ModelLoadError
from engine.checkpoint.gguf import close_gguf, is_gguf, read_tensors
from engine.checkpoint.quantize import quantize_model
from engine.config import ModelConfig, ProgressFn
from engine.kernels import cpu as cpu_kernels
from engine.layers.linear import pack_weights
from engine.model import IGNORED, CausalLM, checkpoint_target, shard_sizes


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
    fresh = type(rotary)(cfg.rotary_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
    rotary.cos, rotary.sin = fresh.cos.to(device), fresh.sin.to(device)
    return model.eval()


def checkpoint_tensors(path: Path, codes: dict | None = None) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
    """How many tensors the checkpoint holds, and the tensors as (HF name, tensor): from
    safetensors shards, or dequantized from a GGUF file (codes: see gguf_loader.read_tensors)."""
    if is_gguf(path):
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
    name, expert, shard = checkpoint_target(key, fused_qkv=cfg.mla is None)
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
               quantization: str | None = None, weight_dtype: torch.dtype | None = None) -> CausalLM:
    """quantization: "int8" / "int4" weight-only linear layers (quantize_model); the
    model's `quantization` attribute then holds what was done (None without). weight_dtype: the
    dtype the C kernels store the float weights in, where it is not `dtype` (the one the pass
    computes in): 16-bit weights on the CPU, float32 arithmetic (cpu_kernels)."""
    model = build_model(cfg, max_positions, dtype, device)
    codes: dict | None = {} if quantization is not None else None  # GGUF Q8_0 / Q4 blocks, used as they are
    load_weights(model, path, progress, codes)
    model.quantization = None
    if quantization is not None:
        model.quantization = quantize_model(model, quantization, codes)
        del codes
    # CPU: the weights into the C kernels' layout, their only copy (or large ones reordered for oneDNN)
    pack_weights(model, dtype=weight_dtype)
    if device.type == "cpu":
        cpu_kernels.release_freed_memory()  # what the load freed (float parameters, dequantized tensors)
    return model
