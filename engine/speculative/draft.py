"""A draft model proposes: a small model with its own weights, paged KV pool and prefix
cache, run one token at a time over each sequence's proposals, built from the engine's
config beside the target."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from engine.block_manager import BlockManager
from engine.config import EngineConfig, ModelConfig, ProgressFn
from engine.model_runner import ModelRunner
from engine.sampler import draw
from engine.sequence import ScheduledSeq, Sequence
from engine.speculative.verify import distribution
from engine.tokenizer import Tokenizer


@dataclass
class DraftView:
    """The draft model's side of a sequence: same tokens, its own blocks and progress.
    Shaped like a Sequence so the block manager and model runner serve it as is."""
    seq: Sequence
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    hashed_upto: int = 0  # tokens already offered to the draft's prefix cache
    traced: bool = False  # draft blocks are not drawn in the KV grid

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids

    @property
    def request_id(self) -> str:
        return self.seq.request_id

    @property
    def num_preemptions(self) -> int:
        return self.seq.num_preemptions

    def __len__(self) -> int:
        return len(self.seq)


class Speculator:
    """Runs the draft model: its own weights, paged KV pool and prefix cache."""
    method = "draft"

    def __init__(self, runner: ModelRunner, block_manager: BlockManager, max_tokens_per_pass: int) -> None:
        self.runner = runner
        self.bm = block_manager
        self.max_tokens_per_pass = max_tokens_per_pass  # the engine's step budget: no huge draft prefill
        self.views: dict[str, DraftView] = {}

    @classmethod
    def build(cls, path: Path, cfg: ModelConfig, config: EngineConfig, target_blocks: int, k: int,
              max_model_len: int, dtype: torch.dtype, device: torch.device,
              progress: ProgressFn | None = None) -> "Speculator":
        """The draft's weights, runner and block manager, beside a target of `target_blocks`
        KV blocks: the draft mirrors them, plus room for each sequence's k proposals."""
        extra = config.max_num_seqs * (k // config.block_size + 2)
        draft_config = replace(config, num_kv_blocks=target_blocks + extra, kv_cache_memory_fraction=None)
        runner = ModelRunner(path, cfg, draft_config, max_model_len, dtype, device, progress)
        return cls(runner, BlockManager(runner.num_blocks, config.block_size, config.enable_prefix_caching),
                   config.max_num_batched_tokens)

    def lookahead(self, seq: Sequence, k: int) -> int:
        return k  # the draft can always guess

    def describe(self, seq: Sequence, piece: Callable[[int], str]) -> dict:
        return {"method": self.method}

    def propose(self, items: list[ScheduledSeq]) -> None:
        """Fill each item's draft_tokens/draft_probs with up to item.num_draft proposals.
        An item whose draft cannot get KV blocks verifies nothing this step. The draft's
        pool is larger than the target's, so that happens only when the draft's prefix
        cache shares fewer blocks than the target's does."""
        active: list[tuple[ScheduledSeq, DraftView]] = []
        for item in items:
            view = self._view(item.seq)
            # catch up on every real token, then room for the proposals fed back in
            needed = len(item.seq) - view.num_computed_tokens + item.num_draft - 1
            if self.bm.blocks_needed(view, needed) > self.bm.num_free_blocks:
                self.drop_proposals(item)
                continue
            self.bm.allocate(view, needed)
            active.append((item, view))
        self._catch_up([view for _, view in active])
        while active:  # one token each: the last real one, then each proposal fed back in
            steps = [ScheduledSeq(view, view.num_computed_tokens, 1, draft_tokens=item.draft_tokens)
                     for item, view in active]
            batch = self.runner.prepare(steps)
            logits = self.runner.run(batch, [e - 1 for e in batch.query_starts[1:]])
            for (item, view), step, row in zip(active, steps, logits):
                view.num_computed_tokens += step.num_tokens
                q = distribution(row, item.seq.params)
                x = int(row.argmax()) if item.seq.params.greedy else draw(q, item.seq.generator)
                item.draft_tokens.append(x)
                item.draft_probs.append(q)
            active = [(item, view) for item, view in active if len(item.draft_tokens) < item.num_draft]

    def _catch_up(self, views: list[DraftView]) -> None:
        """Feed the draft every real token but the last (a new prompt, or tokens the target
        produced), in passes no bigger than the step budget, as the target's prefill is."""
        while True:
            steps, room = [], self.max_tokens_per_pass
            for view in views:
                n = min(len(view) - 1 - view.num_computed_tokens, room)
                if n > 0:
                    steps.append(ScheduledSeq(view, view.num_computed_tokens, n))
                    room -= n
            if not steps:
                return
            self.runner.run(self.runner.prepare(steps), [])
            for step in steps:
                step.seq.num_computed_tokens += step.num_tokens

    @staticmethod
    def drop_proposals(item: ScheduledSeq) -> None:
        item.num_tokens -= item.num_draft
        item.num_draft = 0

    def accept(self, seq: Sequence, real_len: int, accepted: int, token_ids: list[int]) -> None:
        """Roll the draft's cache back to the tokens that survived verification."""
        view = self.views.get(seq.request_id)
        if view is None:
            return
        view.num_computed_tokens = min(view.num_computed_tokens, real_len + accepted)
        self.bm.truncate(view, view.num_computed_tokens)
        self.bm.commit_full_blocks(view, view.hashed_upto, token_ids)
        view.hashed_upto = view.num_computed_tokens

    def free(self, seq: Sequence) -> None:
        view = self.views.pop(seq.request_id, None)
        if view is not None:
            self.bm.free_seq(view)

    def _view(self, seq: Sequence) -> DraftView:
        view = self.views.get(seq.request_id)
        if view is None:
            view = self.views[seq.request_id] = DraftView(seq)
            self.bm.admit(view, self.bm.match_prefix(view))
            view.hashed_upto = view.num_computed_tokens
        return view


def check_same_vocabulary(tok: Tokenizer, cfg: ModelConfig, draft_tok: Tokenizer, draft_cfg: ModelConfig,
                          draft_path: Path) -> None:
    if draft_cfg.vocab_size != cfg.vocab_size or draft_tok.hf.get_vocab() != tok.hf.get_vocab():
        raise ValueError(
            f"the draft model in {draft_path} does not share the target's vocabulary "
            f"(draft: {draft_cfg.vocab_size} logits, {draft_tok.vocab_size} tokens; "
            f"target: {cfg.vocab_size} logits, {tok.vocab_size} tokens); speculative decoding needs the same tokenizer")
