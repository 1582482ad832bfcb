"""What a config.json may ask of this engine: the activations and RoPE scalings it runs,
the error for anything else, and the RoPE fields read out of every spelling of them."""
from __future__ import annotations

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
SUPPORTED_ACTIVATIONS = ("silu", "swish", "gelu_pytorch_tanh")  # SwiGLU, or GeGLU (tanh GELU)


class UnsupportedModelError(ValueError):
    """The checkpoint describes a model this engine cannot run."""


def _by_layer_type(cfg: dict) -> dict | None:
    """transformers >= 5 writes Gemma 3's `rope_parameters` as one entry per layer type."""
    params = cfg.get("rope_parameters") or {}
    return params if "full_attention" in params or "sliding_attention" in params else None


def read_local_rope(cfg: dict) -> tuple[float | None, dict | None]:
    """(theta, scaling) of the sliding-window layers where they have a RoPE of their own
    (Gemma 3: `rope_local_base_freq`, or the `sliding_attention` entry); else (None, None)."""
    by_type = _by_layer_type(cfg)
    if by_type is not None and by_type.get("sliding_attention"):
        return read_rope({"rope_parameters": by_type["sliding_attention"], "rope_theta": cfg.get("rope_local_base_freq")})
    if cfg.get("rope_local_base_freq"):  # older files: scaling (rope_scaling) is for the global layers only
        return float(cfg["rope_local_base_freq"]), None
    return None, None


def read_rope(cfg: dict, allowed: tuple[str, ...] = SUPPORTED_ROPE_TYPES) -> tuple[float, dict | None]:
    # transformers >= 5 writes `rope_parameters` (theta inside); older files
    # write `rope_theta` + `rope_scaling`. Keyed by layer type: the global layers' entry.
    by_type = _by_layer_type(cfg)
    params = dict((by_type.get("full_attention") or {}) if by_type is not None
                  else cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", None) or cfg.get("rope_theta") or 10000.0)
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in allowed:
        raise UnsupportedModelError(
            f"unsupported RoPE scaling {rope_type!r}; supported: {', '.join(allowed)}")
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedModelError("partial rotary embeddings are not supported")
    return theta, ({**params, "rope_type": rope_type} if rope_type != "default" else None)
