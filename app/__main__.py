"""python -m app: load the model (and its draft), start the engine thread, serve the page."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from app.limits import MAX_BODY_BYTES, PUBLIC_MAX_CONCURRENT, PUBLIC_MAX_TOKENS, ServeLimits  # noqa: E402

ASSETS = Path(__file__).resolve().parent.parent / "assets" / "models"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m app", description="TokenTrace: watch one request travel "
                                "through a real LLM serving engine.")
    p.add_argument("--model", default=None, help="checkpoint directory or hub id (default: the embedded model)")
    p.add_argument("--draft", default=None, help="draft model for speculative decoding ('none' to turn off; "
                   "default: the embedded draft when the embedded model is served)")
    p.add_argument("--num-speculative-tokens", type=int, default=4, help="largest k the page can pick")
    p.add_argument("--replay", default=None, metavar="FILE",
                   help="serve the page on a recorded trace (exported from the page or GET /v1/traces/ID); "
                        "no model is loaded")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--share", action="store_true", help="ask Gradio for a public link (needs internet)")
    p.add_argument("--served-model-name", default=None,
                   help="the model name the API answers to (default: the model directory's name)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    kv = p.add_argument_group("KV cache and batching")
    kv.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    kv.add_argument("--num-kv-blocks", type=int, default=None, help="blocks in the KV pool")
    kv.add_argument("--kv-cache-memory-fraction", type=float, default=None,
                    help="size the pool as this fraction of free device memory")
    kv.add_argument("--max-num-seqs", type=int, default=16)
    kv.add_argument("--max-num-batched-tokens", type=int, default=512)
    kv.add_argument("--max-model-len", type=int, default=None)
    kv.add_argument("--no-prefix-caching", action="store_true")
    cap = p.add_argument_group("capture (level 'full')")
    cap.add_argument("--capture-max-keys", type=int, default=64, help="attention rows/keys kept per matrix")
    cap.add_argument("--capture-heads", default=None, help="comma-separated query heads to capture (default all)")
    pub = p.add_argument_group("access and limits (public mode: --share, --public, or a --host other than loopback)")
    pub.add_argument("--public", action="store_true",
                     help="public mode on a loopback host (behind a reverse proxy on this machine)")
    pub.add_argument("--api-key", default=os.environ.get("TOKENTRACE_API_KEY"),
                     help="require 'Authorization: Bearer KEY' on /v1, /ws (or ?api_key=KEY) and /metrics, and "
                     "KEY as the page's password (default: $TOKENTRACE_API_KEY)")
    pub.add_argument("--auth", action="append", default=[], metavar="USER:PASSWORD",
                     help="a login for the page (repeatable)")
    pub.add_argument("--max-tokens-cap", type=int, default=None,
                     help=f"largest max_tokens a request may ask for (public default {PUBLIC_MAX_TOKENS}, "
                     "local: none)")
    pub.add_argument("--max-concurrent-per-client", type=int, default=None,
                     help=f"requests in flight per client address (public default {PUBLIC_MAX_CONCURRENT}, "
                     "local: none)")
    pub.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES, help="largest request body")
    return p.parse_args(argv)


def default_draft(args: argparse.Namespace) -> str | None:
    if args.draft is not None:
        return None if args.draft.lower() == "none" else args.draft
    if args.model is None and (ASSETS / "draft" / "config.json").is_file():
        return str(ASSETS / "draft")
    return None


def build_service(args: argparse.Namespace):
    from app.engine_service import EngineService
    from engine import CaptureConfig, EngineConfig, LLMEngine, Tracer

    limits = serve_limits(args)  # before the model loads: a bad --auth fails at once
    config = EngineConfig(block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
                          kv_cache_memory_fraction=args.kv_cache_memory_fraction, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                          enable_prefix_caching=not args.no_prefix_caching)
    heads = [int(h) for h in args.capture_heads.split(",")] if args.capture_heads else None
    capture = CaptureConfig(max_keys=args.capture_max_keys, heads=heads)

    def progress(done: int, total: int, what: str) -> None:
        if done == total:
            print(f"  loaded {what}: {total} tensors", flush=True)

    engine = LLMEngine(args.model, device=args.device, dtype=args.dtype, config=config, tracer=Tracer(),
                       trace_level="basic", capture=capture, progress=progress, draft=default_draft(args),
                       num_speculative_tokens=args.num_speculative_tokens)
    return EngineService(engine, model_name=args.served_model_name, limits=limits)


def serve_limits(args: argparse.Namespace) -> ServeLimits:
    pairs = []
    for item in args.auth:
        user, sep, password = item.partition(":")
        if not sep or not user or not password:
            raise ValueError(f"--auth takes USER:PASSWORD, got {item!r}")
        pairs.append((user, password))
    for name in ("max_tokens_cap", "max_concurrent_per_client", "max_body_bytes"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    return ServeLimits.for_server(args.host, args.share or args.public, args.max_tokens_cap,
                                  args.max_concurrent_per_client,
                                  args.max_body_bytes, args.api_key, tuple(pairs))


def serve_replay(args: argparse.Namespace) -> None:
    """--replay FILE: the page, replay controls and classroom on one recording; no engine."""
    from app.recording import Recording, TraceFileError
    try:
        rec = Recording.loads(Path(args.replay).read_bytes())
        limits = serve_limits(args)
    except (TraceFileError, OSError, ValueError) as e:
        sys.exit(f"cannot replay {args.replay}: {e}")
    import uvicorn

    from app.server import create_app

    app = create_app(None, replay=rec, limits=limits)
    print(f"TokenTrace replay: {rec.request_id} ({rec.model['name']}, {len(rec.steps())} engine steps) on "
          f"http://{args.host}:{args.port}", flush=True)
    if args.share:
        from app.share import open_share_link
        open_share_link(args.port, lambda line: print(line, flush=True))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.replay:
        return serve_replay(args)
    t0 = time.perf_counter()
    try:
        service = build_service(args)
    except Exception as e:  # one clear line: a corrupt checkpoint, an unsupported architecture, a draft...
        if os.environ.get("TOKENTRACE_DEBUG"):
            raise
        sys.exit(f"cannot start: {' '.join(str(e).split()) or type(e).__name__}")
    import uvicorn

    from app.server import create_app

    app = create_app(service.start())
    info = service.model_info()
    print(f"TokenTrace: {info['name']} ({info['num_layers']} layers"
          f"{', draft on' if info['has_draft'] else ''}) ready in {time.perf_counter() - t0:.1f} s "
          f"on http://{args.host}:{args.port}", flush=True)
    limits = service.limits
    if limits.public:
        print(f"public mode: max_tokens <= {limits.max_tokens_cap}, {limits.max_concurrent_per_client} requests "
              f"in flight per client; " + ("access token required" if limits.api_key else
                                            "no access token (set --api-key or TOKENTRACE_API_KEY)"), flush=True)
    if args.share:
        from app.share import open_share_link
        open_share_link(args.port, lambda line: print(line, flush=True))
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        service.stop()


if __name__ == "__main__":
    main()
