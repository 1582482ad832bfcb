"""What every section shares: the settings, the rows it adds, the prompts it runs."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.llm_engine import DEFAULT_MODEL, LLMEngine

DEFAULT_DRAFT = DEFAULT_MODEL.parent / "draft"

TEXT = ("The old lighthouse keeper climbed the stairs every evening to light the lamp. Ships passed "
        "in the night, and sailors told stories about the light that never went out. One winter the storm "
        "was so strong that the windows shook, but he kept the fire burning until morning. When the sun "
        "rose, a small boat reached the harbour, and the children ran down to the water to see who had "
        "come. Life is short, so be kind to the people you meet, and remember that a good friend is worth "
        "more than gold. The teacher asked the class what they had learned, and a boy said that patience "
        "is the art of hoping. Time flies like an arrow; fruit flies like a banana. ")


@dataclass
class Row:
    section: str
    name: str
    value: float
    unit: str
    baseline: float | None = None  # same quantity for the baseline, same run
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return self.value / self.baseline if self.baseline else None


@dataclass
class Settings:
    repeats: int = 3  # the compared runs, interleaved; each figure is a median over them
    new_tokens: int = 64  # generated per request (the tracing section: twice as many)
    prompt_tokens: int = 32
    batch: int = 8  # the second batch size of the decode rows (the first is 1)
    mixed_requests: int = 16  # the batching and memory sections' requests of mixed lengths
    system_prompt_tokens: int = 480  # the prefix-cache section's shared prompt


QUICK = Settings(repeats=1, new_tokens=8, prompt_tokens=8, batch=2, mixed_requests=4, system_prompt_tokens=40)


@dataclass
class Bench:
    """One model's run: the sections (functions of a Bench) append their rows here."""
    model: Path
    draft: Path | None
    device: str
    settings: Settings
    rows: list[Row] = field(default_factory=list)
    prompts: list[list[int]] = field(init=False)

    def __post_init__(self) -> None:
        # Prompts are windows of ordinary English, so a draft is judged on text like a user's.
        tok = LLMEngine(self.model, device=self.device, config=EngineConfig(num_kv_blocks=4)).tokenizer
        ids = tok.encode(TEXT, add_special_tokens=False) * 4
        stride = max(1, (len(ids) - self.settings.prompt_tokens) // 64)
        self.prompts = [ids[i * stride:i * stride + self.settings.prompt_tokens] for i in range(64)]

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    def engine(self, dtype: str = "auto", **config) -> LLMEngine:
        return LLMEngine(self.model, device=self.device, dtype=dtype, config=EngineConfig(**config))

    def add(self, *args, **kw) -> None:
        self.rows.append(Row(*args, **kw))

    def mixed(self) -> tuple[list[list[int]], list[int]]:
        """16 requests (by default) of mixed prompt and output lengths: prompts, outputs."""
        s, n = self.settings, self.settings.mixed_requests
        g = torch.Generator().manual_seed(1)
        lens = torch.randint(4, 4 * s.prompt_tokens, (n,), generator=g).tolist()
        outs = torch.randint(4, 2 * s.new_tokens, (n,), generator=g).tolist()
        return [(self.prompts[i % 64] * 8)[:lens[i]] for i in range(n)], outs
