"""Start-up as the README states it: `python -m app` from a cold process to serving.

    python -m benchmarks.startup [--repeats 3] [--models embedded smollm2]

For each model, `--repeats` times: a fresh `python -m app` process, the seconds until /healthz
answers (the model is loaded before the server listens) and until the first completion token
comes back through the API (serving). Each line gives the median and the range against the
README's bound (embedded: 15 s, SmolLM2: 25 s) and the ratio; exit 1 when a median misses it.
Run it on an idle machine: other work on the cores adds to every second of it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request

from benchmarks.app_process import start_server
from benchmarks.bench.report import machine

BOUNDS = {"embedded": 15.0, "smollm2": 25.0}  # seconds, as the README promises them
MODEL_ARGS = {"embedded": [], "smollm2": ["--model", "smollm2"]}


def first_token(url: str) -> None:
    body = json.dumps({"prompt": "Hello", "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200, r.status


def one_start(model: str) -> tuple[float, float]:
    """(seconds to /healthz, seconds to the first answered token) of one fresh server."""
    t0 = time.monotonic()
    proc, url = start_server(MODEL_ARGS[model], poll=0.05)
    try:
        ready = time.monotonic() - t0
        first_token(url)
        return ready, time.monotonic() - t0
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=list(BOUNDS), choices=list(BOUNDS))
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; {machine()['cpu']}", flush=True)
    failed = False
    for model in args.models:
        runs = []
        for i in range(args.repeats):
            print(f"  {model}: start {i + 1} of {args.repeats} ...", flush=True)
            runs.append(one_start(model))
        for k, name in ((0, "listening (/healthz)"), (1, "first token served")):
            xs = [r[k] for r in runs]
            med, bound = statistics.median(xs), BOUNDS[model]
            failed |= k == 1 and med > bound
            print(f"{model:<9} {name:<22} median {med:5.1f} s  range {min(xs):.1f}-{max(xs):.1f} s  "
                  f"bound {bound:.0f} s  ratio {med / bound:.2f}x", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
