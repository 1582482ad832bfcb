"""When the logit lens is computed: after the pass, not in it (logit_lens).

Each lens-traced token leaves its residual stream here ([L, hidden], a copy: 69 KB a
SmolLM2 token) with the stats of the model's own output row (one row's softmax, taken at
the step). The lens itself, L rows a token through the final norm and the LM head, is
computed for all of a request's waiting tokens at once, batched over tokens and points,
in position order:
  - when its last batch is `live_seconds` old (CaptureConfig.lens_live_seconds; its first
    token at once; 0, the default: every token after its step, as the live page draws
    every panel on the newest pass); None: not while it runs (a trace read when it is done: a replay
    file, an export, a bench), the stream then waits for none of it;
  - when the request finishes, before its `finish` event: a finished trace holds every
    token's lens;
  - when MAX_PENDING tokens wait (memory stays bounded).
On the engine's thread between its steps' parts: on a machine whose cores the engine's
threads fill, a worker thread would take them from the step it is meant to spare.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.sequence import Sequence
from engine.trace import logit_lens
from engine.trace.softmax_stats import SoftmaxStats

MAX_PENDING = 256  # tokens a request may have waiting (x L x hidden floats each)


@dataclass(slots=True)
class LensWork:
    """One token's lens, waiting: where it is, what was drawn there, its kept rows."""
    seq: Sequence
    step: int  # the engine step that drew the token: its lens event carries it
    position: int
    source: str
    token: int
    top: int
    rows: torch.Tensor  # [L, hidden]: after the embedding and after every layer but the last
    own: SoftmaxStats  # the model's own output row (one row)


@dataclass
class LensQueue:
    model: torch.nn.Module
    max_pending: int = MAX_PENDING
    pending: dict[str, list[LensWork]] = field(default_factory=dict)  # request id -> its tokens, in order
    last_live: dict[str, float] = field(default_factory=dict)  # request id -> when its last batch was computed
    seconds: float = 0.0  # time spent computing lenses since last read (take_seconds)

    def keep(self, work: LensWork, live_seconds: float | None) -> list[LensWork]:
        """Queue a token's lens; returns what is due now (its request's whole queue, this token
        last, or nothing), in position order."""
        rid = work.seq.request_id
        queue = self.pending.setdefault(rid, [])
        queue.append(work)
        now = time.perf_counter()
        live = live_seconds is not None and now - self.last_live.get(rid, -1e9) >= live_seconds
        if live or len(queue) >= self.max_pending:
            self.last_live[rid] = now
            return self.pending.pop(rid)
        return []

    def take(self, request_id: str) -> list[LensWork]:
        """Everything a request has waiting (at its finish), in position order."""
        self.last_live.pop(request_id, None)
        return self.pending.pop(request_id, [])

    def compute(self, works: list[LensWork]) -> list[SoftmaxStats]:
        """The lenses of these tokens: all their rows through the norm and the head together
        (a call takes the kernel's MAX_ROWS rows, streaming the head's weight once); per token,
        its L rows' stats and its own row's last, as one SoftmaxStats of L + 1 rows."""
        if not works:
            return []
        t = time.perf_counter()
        L = works[0].rows.shape[0]
        by_top: dict[int, list[int]] = {}
        for i, w in enumerate(works):
            by_top.setdefault(w.top, []).append(i)
        out: list[SoftmaxStats | None] = [None] * len(works)
        for top, idx in by_top.items():
            rows = torch.cat([works[i].rows for i in idx])  # [len(idx) * L, hidden], token-major
            chosen = [works[i].token for i in idx for _ in range(L)]
            s = logit_lens.lens_stats(self.model, rows, chosen, top)
            for k, i in enumerate(idx):
                part = slice(k * L, (k + 1) * L)
                out[i] = logit_lens.join([SoftmaxStats(s.top_ids[part], s.top_probs[part], s.lse[part],
                                                       s.entropy[part], s.kept[part], s.rank[part],
                                                       s.chosen_probs[part]), works[i].own])
        self.seconds += time.perf_counter() - t
        return out

    def take_seconds(self) -> float:
        s, self.seconds = self.seconds, 0.0
        return s
