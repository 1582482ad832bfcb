"""What each kind of trace work has cost the engine's thread, by the engine's own clock: the
schedule and KV-fill events of a pass, a token's sampling stats, its logit lens (live, past
the byte bound, and after the answer), a `full` trace's embedding rows, attention and MoE
routing (the runner's collect() after the forward, then their events), and the pool's
`kv.pool` event. The watching benchmark reads it (a variant's seconds over its tokens)
beside its toggled variants, which also see what a capture costs inside the pass; the
timeline's `schedule.traced` says a step's total."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

KINDS = ("schedule", "kv fills", "sampling", "logit lens", "embedding rows", "attention", "moe routing",
         "speculation", "kv.pool")


@dataclass
class TraceCosts:
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(KINDS, 0.0))

    def since(self, kind: str, t: float) -> float:
        """Adds the time since perf_counter() was t to `kind`; returns the time now."""
        now = time.perf_counter()
        self.seconds[kind] += now - t
        return now

    def add(self, other: "TraceCosts") -> float:
        """other's seconds added kind by kind (a pass's collect() costs into the engine's) -> their sum."""
        for kind, seconds in other.seconds.items():
            self.seconds[kind] += seconds
        return sum(other.seconds.values())

    def take(self) -> dict[str, float]:
        """The seconds so far, by kind; from zero again."""
        out, self.seconds = self.seconds, dict.fromkeys(KINDS, 0.0)
        return out
