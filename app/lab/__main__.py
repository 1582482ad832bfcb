"""python -m app.lab NAME [--model M] [--size ci|full] [--json OUT] [--html OUT]

Runs one experiment on the real engine, with a progress bar on the terminal, and prints
its headline table and sentences. `python -m app.lab --list` names the experiments."""
from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


class Bar:
    """One line on stderr, redrawn: [#####.....] 42% setting: what."""

    def __init__(self, stream=sys.stderr, width: int = 30) -> None:
        self.stream, self.width, self.last = stream, width, ""

    def __call__(self, p) -> None:
        filled = int(round(p.fraction * self.width))
        line = (f"\r[{'#' * filled}{'.' * (self.width - filled)}] {p.fraction:4.0%} "
                f"{p.setting_index + 1}/{p.num_settings} {p.setting}: {p.what}")[:160]
        if line != self.last:
            self.stream.write(line.ljust(len(self.last)))
            self.stream.flush()
            self.last = line

    def close(self) -> None:
        if self.last:
            self.stream.write("\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.lab", description=__doc__.split("\n\n")[1])
    ap.add_argument("name", nargs="?", help="the experiment")
    ap.add_argument("--list", action="store_true", help="name the experiments and stop")
    ap.add_argument("--model", default=None, help="a model name, path or GGUF (default: the embedded model)")
    ap.add_argument("--size", choices=("ci", "full"), default="full")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--repeats", type=int, default=None,
                    help="runs of every setting, interleaved (default: 5 at --size full, 3 at ci; "
                         "disaggregation 3)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: as set, 1 while the machine is busier than its cores)")
    ap.add_argument("--json", dest="json_out", default=None, help="write the result as JSON here")
    ap.add_argument("--html", dest="html_out", default=None, help="write a self-contained HTML page here")
    args = ap.parse_args(argv)
    from app.lab import experiments, get, run  # lazy: torch (the engine), so --help answers at once
    from app.lab.export import headline_rows, write_html, write_json  # lazy: torch
    if args.list or not args.name:
        for e in experiments():
            print(f"{e.name:16} {e.what}")
        return 0 if args.list else 2
    try:
        get(args.name)
    except KeyError as e:
        print(f"error: {e.args[0]}", file=sys.stderr)
        return 2
    bar = Bar()
    try:
        result = run(args.name, model=args.model, size=args.size, progress=bar, device=args.device,
                     repeats=args.repeats, threads=args.threads).to_json()
    except KeyboardInterrupt:
        bar.close()
        print("cancelled", file=sys.stderr)
        return 130
    bar.close()
    if result["error"]:
        print(f"error: {result['error']}", file=sys.stderr)
        return 1
    header, rows = headline_rows(result)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    for row in [header] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)))
    for s in result["sentences"]:
        print(s)
    if args.json_out:
        write_json(result, args.json_out)
    if args.html_out:
        write_html(result, args.html_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
