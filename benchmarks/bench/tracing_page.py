"""Watching's cost for the request the page itself sends on this model: where the app serves the
model with a draft (the embedded model: its embedded draft), Send runs speculative decoding at
the page's k (the largest the app lets it pick, `--num-speculative-tokens`), so the learner's
stream is a speculative one, traced `full` or not. The plain-decode rows (tracing_watch.py) stay
beside these: a draft's rounds make more tokens a step, and each traced step's fixed cost is
spread over them, so this ratio is the page's and not the engine's at plain decode.

Only with a draft (b.draft); a model the app serves without one sends plain decode, which the
plain rows already are."""
from __future__ import annotations

import statistics

from app.__main__ import parse_args
from benchmarks.bench.context import Bench
from benchmarks.bench.tracing_watch import LIVE, rounds, watching as plain_watching
from engine.llm_engine import LLMEngine
from engine.trace import EventList, Tracer


def page_k() -> int:
    """The k the page sends by default: the largest the app lets it pick (the app's own default)."""
    return parse_args([]).num_speculative_tokens


def watching(b: Bench) -> None:
    """The watching rows alone (`--sections watching`; the tracing section runs them too)."""
    plain_watching(b)
    page_request(b, 2 * b.settings.new_tokens)


def page_request(b: Bench, n: int) -> None:
    """The page's request (its draft, k) traced `full` in the page's lens setting beside the
    same request untraced, at batch 1 and the settings' batch: stream rate, round by round."""
    if b.draft is None:
        return
    k = page_k()
    sink = EventList()
    tracer = Tracer(sink)
    engine = LLMEngine(b.model, device=b.device, tracer=tracer, draft=b.draft, num_speculative_tokens=k)
    base = engine.capture
    variants = {"untraced": (None, base), LIVE: ("full", base)}
    what = f"the page's request (its draft model, k={k}), {LIVE}"
    for batch in sorted({1, b.settings.batch}):
        stream, _, _ = rounds(b, engine, tracer, sink, variants, batch, n)
        s0, r = statistics.median(stream["untraced"]), statistics.median(stream[LIVE])
        paired = statistics.median(v / u for v, u in zip(stream[LIVE], stream["untraced"]))
        b.add("tracing cost", f"watching, batch {batch}, {what}: stream tok/s", r, "tok/s", s0,
              f"first to last token, ratio {r / s0:.3f} against the same request untraced ({paired:.3f} round by "
              f"round, the median over {len(stream[LIVE])} rounds)")
