"""When the logit lens is computed: after the pass, not in it (logit_lens), and mostly off
the stream's path.

Each lens-traced token leaves its residual stream here ([L, hidden], a copy: 69 KB a
SmolLM2 token) with the stats of the model's own output row (one row's softmax: the token's
`sample` event fills them from its own pass over the row when it is built, at the step or
after it, capture_queue; else the lens takes them from the kept logits row). The lens itself, L rows a token through the final norm and the LM head, costs
more arithmetic than the model's step (SmolLM2: 0.85 G multiply-adds a token against
0.135 G), so a running request computes only what a watcher sees:
  - live: its NEWEST token's lens, right after its step, when its last live one is
    `live_seconds` old (CaptureConfig.lens_live_seconds: the page's 0.2 s keeps the lens
    panel within its 0.5 s update bound; 0: every token's; None: none while it runs), and
    at least LIVE_SHARE times what a lens takes, times the requests that have live lenses
    (a slow machine's stream, or a batch's, keeps its speed; its lens panels lag more); the
    tokens in between wait here;
  - when more than MAX_PENDING_BYTES of rows wait, the oldest ones (memory stays bounded).
At its finish the client gets its last token at once; the request's `finish` event waits
(`ended`) until the rest of its lenses are out, computed between later steps (StepTrace.drain:
a slice a step while others run, all of it when the engine is idle), so a finished trace
still holds every token's lens. Batched over tokens and points, in position order; on the
engine's thread: on a machine whose cores the engine's threads fill, a worker thread would
take them from the step it is meant to spare.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from engine.kernels import cpu as cpu_kernels
from engine.sequence import Sequence
from engine.trace import logit_lens
from engine.trace.events import Event
from engine.trace.live_clock import LiveClock
from engine.trace.softmax_stats import SoftmaxStats, softmax_stats

MAX_PENDING_BYTES = 64 * 2**20  # rows a request may have waiting (SmolLM2: ~970 tokens)
# a live lens at most every LIVE_SHARE x what one took: on a slow (or loaded) machine the live lens
# stays within a tenth of the stream's time, and the page's lens falls further behind instead
LIVE_SHARE = 9.0


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
    own: SoftmaxStats | None  # the model's own output row (one row); None: computed with the lens, from logits
    logits: torch.Tensor | None = None  # the model's own logits row [vocab], where own is None
    where: tuple[int, int] = (0, 0)  # its pass's first position and the answer tokens made (a cap's note)


@dataclass(slots=True)
class Ended:
    """A finished request whose lenses still wait: its `finish` event, emitted after them."""
    event: Event
    step: int  # the step it finished in (its event is stamped with it)


@dataclass
class LensQueue:
    model: torch.nn.Module
    max_pending_bytes: int = MAX_PENDING_BYTES
    call_rows: int = 0  # rows a drain's kernel call takes (0: the CPU kernel's MAX_ROWS)
    pending: dict[str, list[LensWork]] = field(default_factory=dict)  # request id -> its tokens, in order
    live: LiveClock = field(default_factory=LiveClock)  # when each request's last live lens was computed
    ended: dict[str, Ended] = field(default_factory=dict)  # finished, lenses waiting: oldest first
    seconds: float = 0.0  # time spent computing lenses since last read (take_seconds)
    token_seconds: float = 0.0  # what the last computed token's lens took

    def keep(self, work: LensWork, live_seconds: float | None, live: bool | None = None) -> list[LensWork]:
        """A token's lens: returns what is due now (this newest token alone, when its request's
        last live lens is live_seconds old, or `live` says so: due() asked already; the oldest
        waiting ones past the byte bound), and queues it otherwise."""
        rid = work.seq.request_id
        if live is None:
            live = self.due(rid, live_seconds)
        if live:
            return [work]
        queue = self.pending.setdefault(rid, [])
        queue.append(work)
        if len(queue) * work.rows.nbytes > self.max_pending_bytes:
            return self.slice(rid, self.one_call(rid))  # the oldest: one kernel call's
        return []

    def due(self, request_id: str, live_seconds: float | None) -> bool:
        """Whether the request's newest token's lens is computed live: its last live one is
        live_seconds old, and LIVE_SHARE times what a lens takes (0: every token's; None: none)."""
        if live_seconds is None:
            return False
        # (0: every token's); the running requests' live lenses share one tenth: each waits the longer
        period = live_seconds and max(live_seconds, LIVE_SHARE * self.token_seconds * max(1, len(self.live)))
        return self.live.due(request_id, period)

    def end(self, request_id: str, event: Event, step: int) -> bool:
        """The request finished: True where its `finish` event must wait for its lenses (held)."""
        self.live.forget(request_id)
        if not self.pending.get(request_id):
            self.pending.pop(request_id, None)
            return False
        self.ended[request_id] = Ended(event, step)
        return True

    def slice(self, request_id: str, tokens: int) -> list[LensWork]:
        """The oldest `tokens` of a request's waiting lenses, taken from its queue."""
        queue = self.pending.get(request_id, [])
        out, self.pending[request_id] = queue[:tokens], queue[tokens:]
        return out

    def one_call(self, request_id: str) -> int:
        """How many of this request's tokens one kernel call takes (MAX_ROWS rows: its head's
        weight streamed once)."""
        queue = self.pending.get(request_id)
        return max(1, (self.call_rows or cpu_kernels.MAX_ROWS) // queue[0].rows.shape[0]) if queue else 1

    def compute(self, works: list[LensWork]) -> list[SoftmaxStats]:
        """The lenses of these tokens: all their rows through the norm and the head together
        (a call takes the kernel's MAX_ROWS rows, streaming the head's weight once); per token,
        its L rows' stats and its own row's last, as one SoftmaxStats of L + 1 rows."""
        if not works:
            return []
        t = time.perf_counter()
        for w in works:  # the own row's stats, where the step left them to the lens
            if w.own is None:
                w.own, w.logits = softmax_stats(w.logits[None], w.top, [w.token]), None
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
        spent = time.perf_counter() - t
        self.seconds += spent
        self.token_seconds = spent / len(works)
        return out

    def take_seconds(self) -> float:
        s, self.seconds = self.seconds, 0.0
        return s
