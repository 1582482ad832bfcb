"""How many bytes a `full` trace costs per generated token, and how long its captures last
under the page's per-request cap (not a test: it prints figures).

    python -m benchmarks.trace_bytes [--models embedded,smollm2,gemma3-270m] [--tokens 120]
                                     [--cap-tokens 500] [--encodings]

For each model: one chat request at capture level full (temperature 0.8, seed 1, end of
text ignored, so it runs --tokens tokens), its events fed to a TraceStore with the app's
default caps the way the app's engine service feeds it (a capture past the cap stops the
engine's captures). Prints the bytes of each event type as JSON, per generated token, the
prefill's one-off bytes, the answer length whose captures fit the default 8 MiB cap
(measured when --tokens reaches it, else projected from the decode steps' bytes), and
whether this run was truncated and at which answer token.

--encodings: the attention encodings compared on SmolLM2's real decode steps (sizes as
base64 text, and how far each one's picture and numbers are from the exact ones: CIE76
dE of the page's colouring of sqrt(p), and the largest error in p).
"""
from __future__ import annotations

import argparse
import base64
import json
import time
import zlib
from collections import Counter

import numpy as np
import torch

from app.serving.trace_store import MAX_BYTES_PER_REQUEST, TraceStore
from engine import CaptureConfig, EventList, LLMEngine, SamplingParams, Tracer
from engine.trace import compact
from visualizers._html import colormap

PROMPT = [{"role": "user", "content": "Tell me a long story about a fox who lives in a forest and meets a bear."}]
SEP = (",", ":")
MODELS = {"embedded": None, "smollm2": "smollm2", "gemma3-270m": "gemma3-270m"}


def run(model: str, tokens: int, capture: CaptureConfig | None = None) -> dict:
    """One request at full: its events as dicts, and what the store did with them."""
    events = EventList()
    store = TraceStore()
    engine = LLMEngine(MODELS.get(model, model), tracer=Tracer(events), trace_level="full", capture=capture)

    def feed(event) -> None:  # as app/serving/engine_service.py's sink: a capture past the cap stops them
        d = event.to_dict()
        if d["request_id"] is not None:
            if store.add(d["request_id"], d):
                engine.stop_captures(d["request_id"], store.max_bytes)
        else:  # a step's events, kept with each request they concern (the only one here)
            for rid in [b["request_id"] for b in d.get("batch", [])] or d.get("request_ids", []):
                store.add(rid, d)
    engine.tracer.add_sink(feed)
    t0 = time.perf_counter()
    params = SamplingParams(temperature=0.8, seed=1, max_tokens=tokens, ignore_eos=True)
    try:
        rid = engine.add_request(messages=PROMPT, params=params)
    except ValueError:  # a base model without a chat template (Gemma 3 270M): the same words as a plain prompt
        rid = engine.add_request(PROMPT[0]["content"], params)
    while engine.has_unfinished_requests():
        engine.step()
    seconds = time.perf_counter() - t0
    evs = [e.to_dict() for e in events.events if e.request_id in (rid, None)]  # the step's events: this one's
    return {"model": model, "events": evs, "seconds": seconds, "truncated": store.trace(rid).truncated,
            "prompt_tokens": engine.get_output(rid).usage.prompt_tokens}


def report(r: dict, tokens: int, cap_tokens: int) -> None:
    evs = r["events"]
    size, count = Counter(), Counter()
    for e in evs:
        size[e["type"]] += len(json.dumps(e, separators=SEP))
        count[e["type"]] += 1
    total = sum(size.values())
    first = min(e["step"] for e in evs if e["type"] == "token")  # the prefill's step: its captures are one-off
    prefill = sum(len(json.dumps(e, separators=SEP)) for e in evs if e["step"] <= first)
    decode = (total - prefill) / max(tokens - 1, 1)
    fit = 1 + int((MAX_BYTES_PER_REQUEST - prefill) // decode)
    cut = r["truncated"]
    made = None
    if cut is not None:
        made = len([e for e in evs if e["type"] == "token" and e["step"] < cut["step"]])
    print(f"\n{r['model']}: {tokens} tokens (prompt {r['prompt_tokens']}) in {r['seconds']:.1f} s: "
          f"{total / tokens:,.0f} bytes per generated token in all; the prefill step {prefill:,} bytes once, "
          f"then {decode:,.0f} bytes a token")
    for t, b in size.most_common():
        print(f"  {t:20s} {count[t]:5d} events {b:12,d} bytes {b / tokens:10,.0f} per token")
    measured = "" if tokens >= cap_tokens else " (projected from this run's decode steps)"
    print(f"  captures under the {MAX_BYTES_PER_REQUEST / 2**20:.0f} MiB cap: "
          + (f"stopped at answer token {made} (engine step {cut['step']})" if cut else
             f"all {tokens} tokens kept") + f"; about {fit:,} tokens would fit{measured}: "
          + f"{cap_tokens} tokens {'fit' if fit >= cap_tokens else 'do NOT fit'}")


def encodings(tokens: int) -> None:
    """Attention encodings on SmolLM2's decode steps (exact captures: compact=False)."""
    r = run("smollm2", tokens, CaptureConfig(compact=False))
    steps: dict[int, list[np.ndarray]] = {}
    for e in r["events"]:
        if e["type"] == "attention" and e["kind"] == "decode":
            steps[e["step"]] = np.asarray(e["probs"], dtype=np.float64)  # [layers, heads, 1, keys]
    full = [a for a in steps.values() if a.shape[-1] == max(x.shape[-1] for x in steps.values())]
    print(f"\nattention encodings, SmolLM2 decode steps of {full[0].shape} (layers, heads, rows, keys), "
          f"{len(full)} steps; one-byte codes as base64 of Huffman-coded deflate")
    grid = np.linspace(0, 1, 20001) ** 2  # every p the colouring can tell apart, for the picture's error
    levels = lambda bits: (lambda a: (np.round(np.sqrt(a) * (2 ** bits - 1)) / (2 ** bits - 1)) ** 2)  # noqa: E731
    p8 = lambda a: compact.decode(compact.encode_probs(torch.from_numpy(a)))  # noqa: E731
    cases = {
        "JSON, 4 decimals (before)": (lambda a: len(json.dumps(np.round(a, 4).tolist(), separators=SEP)), None),
        "float16": (lambda a: len(base64.b64encode(zlib.compress(a.astype(np.float16).tobytes()))),
                    lambda a: a.astype(np.float16).astype(float)),
        "8-bit p": (lambda a: _z(np.round(a * 255).astype(np.uint8).tobytes()), lambda a: np.round(a * 255) / 255),
        "8-bit sqrt(p)": (lambda a: _z(np.round(np.sqrt(a) * 255).astype(np.uint8).tobytes()), levels(8)),
        "7-bit sqrt(p)": (lambda a: _z(np.round(np.sqrt(a) * 127).astype(np.uint8).tobytes()), levels(7)),
        "6-bit sqrt(p)": (lambda a: _z(np.round(np.sqrt(a) * 63).astype(np.uint8).tobytes()), levels(6)),
        "p8 (chosen)": (lambda a: len(compact.encode_probs(torch.from_numpy(a))["data"]), p8),
    }
    for name, (nbytes, quant) in cases.items():
        b = sum(nbytes(a) for a in full) / len(full)
        if quant is None:
            print(f"  {name:28s} {b:8,.0f} bytes a step")
            continue
        q = np.asarray(quant(grid), dtype=np.float64)
        de = np.linalg.norm(_lab(colormap(np.sqrt(grid))) - _lab(colormap(np.sqrt(np.clip(q, 0, 1)))), axis=-1).max()
        print(f"  {name:28s} {b:8,.0f} bytes a step · picture max dE {de:5.2f} · max |error in p| "
              f"{np.abs(q - grid).max():.4f}")
    print("  (dE 2.3: about the least difference a viewer can tell; the colour map itself rounds to 8 bits)")


def _z(raw: bytes) -> int:
    """Bytes of one-byte codes as the compact form stores them: Huffman-coded deflate, base64."""
    z = zlib.compressobj(compact.ZLIB_LEVEL, zlib.DEFLATED, 15, 9, zlib.Z_HUFFMAN_ONLY)
    return len(base64.b64encode(z.compress(raw) + z.flush()))


def _lab(rgb: np.ndarray) -> np.ndarray:
    """sRGB (uint8) -> CIE L*a*b* (D65)."""
    c = rgb.astype(float) / 255.0
    c = np.where(c > 0.04045, ((c + 0.055) / 1.055) ** 2.4, c / 12.92)
    m = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = c @ m.T / np.array([0.9505, 1.0, 1.089])
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], -1)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.trace_bytes", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="embedded,smollm2,gemma3-270m")
    ap.add_argument("--tokens", type=int, default=120, help="answer length of each run")
    ap.add_argument("--cap-tokens", type=int, default=500, help="the answer length that must fit the cap")
    ap.add_argument("--encodings", action="store_true", help="compare the attention encodings on SmolLM2")
    args = ap.parse_args()
    if args.encodings:
        encodings(args.tokens)
        return
    for model in args.models.split(","):
        report(run(model, args.tokens), args.tokens, args.cap_tokens)


if __name__ == "__main__":
    main()
