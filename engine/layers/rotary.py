"""Rotary position embeddings (RoPE), with the `linear`, `llama3` and `yarn` scalings."""
import math

import torch
from torch import nn

from engine.config_deepseek import yarn_mscale


def inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":
        return inv_freq / scaling["factor"]
    if scaling["rope_type"] == "yarn":
        return yarn_frequencies(head_dim, theta, scaling)
    # llama3: leave high frequencies alone, divide low ones by `factor`,
    # interpolate smoothly in between.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def yarn_frequencies(dim: int, theta: float, scaling: dict) -> torch.Tensor:
    """YaRN (DeepSeek V2/V3): fast-turning dims kept (extrapolated), slow ones divided by
    `factor` (interpolated), a linear ramp between the dims that turn beta_fast and
    beta_slow times over the pre-training length."""
    factor, old_len = scaling["factor"], scaling["original_max_position_embeddings"]
    beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def dim_at(rotations: float) -> float:  # the dim that turns `rotations` times over old_len
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))
    low, high = dim_at(beta_fast), dim_at(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = theta ** (torch.arange(0, dim, 2).float() / dim)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (unchanged), 0: interpolate
    return (1.0 / (factor * pos_freqs)) * (1 - keep) + (1.0 / pos_freqs) * keep


def attention_factor(scaling: dict | None) -> float:
    """What YaRN multiplies cos and sin by (1 for the other scalings)."""
    if scaling is None or scaling["rope_type"] != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor, mscale, mscale_all = scaling["factor"], scaling.get("mscale"), scaling.get("mscale_all_dim")
    if mscale and mscale_all:
        return float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all))
    return yarn_mscale(factor)


INITIAL_ROWS = 4096  # positions the tables hold at load: they grow to the longest pass (Gemma 3's
# two 32k-position tables were 128 MiB resident from the start)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables indexed by absolute position (rotate-half layout).

    The tables are computed, never loaded, so they are plain float32 tensors made on the
    CPU rather than buffers: building the model on the meta device, casting it to bf16
    or moving it leaves them intact. They follow the positions to their device on first use,
    and hold the first INITIAL_ROWS positions until a pass reaches further (`cover`: at least
    doubling, up to max_positions). `sin` has its first half negated, the sign that
    rotate-half puts on x's second half (see `rotate`)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None) -> None:
        super().__init__()
        self.max_positions = max_positions
        with torch.device("cpu"):
            self.inv_freq = inverse_frequencies(head_dim, theta, scaling)
        self.factor = attention_factor(scaling)  # YaRN: cos and sin scaled, as the reference does
        self.cos, self.sin = self._tables(min(max_positions, INITIAL_ROWS), torch.device("cpu"))

    def _tables(self, rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.device("cpu"):
            freqs = torch.arange(rows, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
            cos = torch.cat([freqs, freqs], dim=-1).cos()
            sin = torch.cat([-freqs.sin(), freqs.sin()], dim=-1)
            if self.factor != 1.0:
                cos, sin = cos * self.factor, sin * self.factor
        return cos.to(device), sin.to(device)

    def cover(self, positions: int) -> None:
        """Tables for positions [0, positions) (up to max_positions): rebuilt larger when short."""
        rows = self.cos.shape[0]
        if positions > rows and rows < self.max_positions:
            self.cos, self.sin = self._tables(min(self.max_positions, max(positions, 2 * rows)), self.cos.device)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for these positions: [T, 1, D], shared by every layer that uses this table."""
        if self.cos.device != positions.device:
            self.cos, self.sin = self.cos.to(positions.device), self.sin.to(positions.device)
        return (self.cos.index_select(0, positions).unsqueeze(1).to(dtype),
                self.sin.index_select(0, positions).unsqueeze(1).to(dtype))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on x [T, heads, D]: x * cos + rotate_half(x) * sin, where rotate_half(x) =
    [-x2, x1]. The minus sign lives in `sin` (RotaryEmbedding), so the halves are only
    swapped, in one op: the same products as the reference, bit for bit."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    # q: [T, H, D], k: [T, KVH, D]
    return rotate(q, cos, sin), rotate(k, cos, sin)
