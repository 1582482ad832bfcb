"""python -m app: load the models (each with its draft), start one engine thread per model,
serve the page.

    python -m app --model A --draft DA --model B --draft ngram --model C

`--model` may be given more than once; `--draft` and `--served-model-name` apply to the
`--model` before them (given before any `--model`, to the first one). With no `--model`,
the embedded target is served with its embedded draft.
"""
from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Only light modules at the top: the engine (torch) and the server (gradio) are imported
# lazily inside the functions that need them, so --help and a bad argument answer at once.
from app.embedded import EMBEDDED_DRAFT  # noqa: E402
from app.serving.limits import API_TRACE_LEVEL, MAX_BODY_BYTES, PUBLIC_MAX_CONCURRENT, PUBLIC_MAX_TOKENS, \
    ClientSlots, ServeLimits  # noqa: E402
from app.serving.share import open_share_link  # noqa: E402
from app.serving.trace_store import MAX_BYTES_PER_REQUEST, MAX_TOTAL_BYTES, TraceStore  # noqa: E402
from app.store.defaults import DB_MAX_BYTES  # noqa: E402

PER_MODEL = {"model": "--model", "draft": "--draft", "served_model_name": "--served-model-name"}


@dataclass
class ModelSpec:
    """One served model as given on the command line."""
    model: str | None = None  # None: the embedded target
    draft: str | None = None  # "none", "ngram", a path or hub id; None: the default
    served_model_name: str | None = None


class _PerModel(argparse.Action):
    """--model / --draft / --served-model-name, kept in command-line order."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        order = getattr(namespace, "_per_model", None) or []
        namespace._per_model = order + [(self.dest, value)]


def model_specs(order: list[tuple[str, str]]) -> list[ModelSpec]:
    """Pair each --draft / --served-model-name with the --model before it (the first
    model's when given before any --model; the embedded model's when there is none)."""
    specs: list[ModelSpec] = []
    pending: dict[str, str] = {}
    for dest, value in order:
        if dest == "model":
            specs.append(ModelSpec(value))
            if len(specs) == 1:
                for key, v in pending.items():
                    setattr(specs[0], key, v)
                pending = {}
            continue
        target = specs[-1] if specs else None
        if (getattr(target, dest) if target else pending.get(dest)) is not None:
            which = f"--model {target.model}" if target else "the first model"
            raise ValueError(f"{PER_MODEL[dest]} was given twice for {which}; each --model takes one")
        if target is None:
            pending[dest] = value
        else:
            setattr(target, dest, value)
    if not specs:
        specs.append(ModelSpec(None, pending.get("draft"), pending.get("served_model_name")))
    return specs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m app", description="TokenTrace: watch one request travel "
                                "through a real LLM serving engine.")
    p.add_argument("--model", action=_PerModel, default=None,
                   help="checkpoint directory, .gguf file, catalog name (smollm2, gemma3-270m) or hub id "
                   "(default: the embedded model); repeat it to serve several models, each on its own engine")
    p.add_argument("--draft", action=_PerModel, default=None,
                   help="for the --model before it: a draft model for speculative decoding, 'ngram' (n-gram "
                   "prompt lookup, no draft model) or 'none' (default: the embedded draft for the embedded model)")
    p.add_argument("--num-speculative-tokens", type=int, default=4, help="largest k the page can pick")
    p.add_argument("--replay", default=None, metavar="FILE|ID",
                   help="serve the page on a recorded trace: a file (exported from the page or GET "
                        "/v1/traces/ID) or the id of one in the database (--db); no model is loaded")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--share", action="store_true", help="ask Gradio for a public link (needs internet)")
    p.add_argument("--served-model-name", action=_PerModel, default=None,
                   help="for the --model before it: the name the API and the page use (default: the "
                   "directory's name, a .gguf file's stem, or the catalog name / hub id as given)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    p.add_argument("--quantization", choices=("int8", "int4"), default=None,
                   help="weight-only int8 / int4 linear layers on the CPU (a GGUF's Q4_0 / Q4_1 blocks used as they are)")
    p.add_argument("--no-cuda-graphs", action="store_true",
                   help="CUDA: run every decode step eagerly (by default they replay CUDA graphs captured at start-up)")
    _add_engine_groups(p)
    _add_serving_groups(p)
    args = p.parse_args(argv)
    _check(p, args)
    first = args.models[0]  # the one-model view older callers read
    args.model, args.draft, args.served_model_name = first.model, first.draft, first.served_model_name
    return args


def _add_engine_groups(p: argparse.ArgumentParser) -> None:
    """The KV pool and batching, replicas, parallelism and capture."""
    kv = p.add_argument_group("KV cache and batching")
    kv.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    kv.add_argument("--num-kv-blocks", type=int, default=None, help="blocks in the KV pool")
    kv.add_argument("--kv-cache-memory-fraction", type=float, default=None,
                    help="size the pool as this fraction of free device memory")
    kv.add_argument("--max-num-seqs", type=int, default=16)
    kv.add_argument("--max-num-batched-tokens", type=int, default=512)
    kv.add_argument("--max-model-len", type=int, default=None)
    kv.add_argument("--no-prefix-caching", action="store_true")
    rep = p.add_argument_group("replicas (app/serving/replicas.py)")
    rep.add_argument("--replicas", type=int, default=1, metavar="N",
                     help="serve each model from N engines (2 to 4), each its own KV pool and engine thread, "
                          "behind one name and a router")
    rep.add_argument("--router", choices=("round-robin", "least-loaded", "prefix-aware"), default=None,
                     help="which replica gets a request (default prefix-aware: the one holding the longest "
                          "cached prefix of its prompt, else the least loaded)")
    par = p.add_argument_group("parallelism (engine/parallel)")
    par.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                     help="split each model over N ranks (processes; one GPU each on CUDA): attention by "
                          "KV-head groups, MLP by columns")
    par.add_argument("--expert-parallel", action="store_true",
                     help="MoE models: whole experts on ranks instead of every expert split")
    par.add_argument("--disaggregate", action="store_true",
                     help="prefill and decode on separate engines, each in its own process with its own KV pool, "
                          "the pages handed over on torch.distributed (engine/disagg; no speculation)")
    par.add_argument("--prefill-ranks", type=int, default=1, metavar="P",
                     help="with --disaggregate: prefill engines, a process each with its own model copy, KV pool and "
                          "prefix cache; a request goes to the one that would compute it soonest, its cached prefix "
                          "counted (default 1)")
    par.add_argument("--decode-ranks", type=int, default=1, metavar="D",
                     help="with --disaggregate: decode engines, a KV pool and batch each, in the serving process, "
                          "stepped in turn; a request's pages go to the one with the most free blocks (default 1)")
    cap = p.add_argument_group("capture (level 'full')")
    cap.add_argument("--capture-max-keys", type=int, default=64, help="attention rows/keys kept per matrix")
    cap.add_argument("--capture-heads", default=None, help="comma-separated query heads to capture (default all)")


def _add_serving_groups(p: argparse.ArgumentParser) -> None:
    """The traces kept, and access and limits."""
    kept = p.add_argument_group("traces kept (export, replay, classroom, /v1/traces)")
    kept.add_argument("--api-trace-level", choices=("full", "basic", "off"), default=API_TRACE_LEVEL,
                      help="capture level of API and /ws requests whose body has no trace_level (default "
                      f"{API_TRACE_LEVEL}: every stage and token, no tensors; a body may ask for \"full\")")
    kept.add_argument("--trace-max-bytes-per-request", type=int, default=MAX_BYTES_PER_REQUEST, metavar="BYTES",
                      help="past this much JSON a request's tensor captures stop and its trace is marked "
                      f"truncated (default {MAX_BYTES_PER_REQUEST // 2**20} MiB)")
    kept.add_argument("--trace-store-bytes", type=int, default=MAX_TOTAL_BYTES, metavar="BYTES",
                      help="all kept traces together; the oldest are dropped first (default "
                      f"{MAX_TOTAL_BYTES // 2**20} MiB; at least twice the per-request cap)")
    kept.add_argument("--db", default=None, metavar="PATH|URL|none",
                      help="where traces and classrooms last: an SQLite file (default "
                      "~/.cache/tokentrace/traces.db, or $TOKENTRACE_DB), a postgresql:// URL, or 'none' (memory "
                      "only: gone at exit)")
    kept.add_argument("--db-max-bytes", type=int, default=DB_MAX_BYTES, metavar="BYTES",
                      help="all traces in the database together (JSON size); the oldest unpinned go first "
                      f"(default {DB_MAX_BYTES // 2**30} GiB)")
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
    pub.add_argument("--lab", action="store_true",
                     help="public mode: let the page's Experiments tab run experiments (each builds engines of "
                          "its own; one at a time). A local server runs them without it")
    pub.add_argument("--ignore-unknown-fields", action="store_true",
                     help="drop request body fields this server does not implement (default: a 400 naming the field)")


def _check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The models in command-line order, and the combinations not built (exits with the parser's error)."""
    try:
        args.models = model_specs(getattr(args, "_per_model", None) or [])
    except ValueError as e:
        p.error(str(e))
    if not 1 <= args.replicas <= 4:
        p.error(f"--replicas takes 1 to 4, not {args.replicas}")
    if args.router is not None and args.replicas == 1:
        p.error("--router chooses among replicas: give --replicas 2 or more")
    if args.replicas > 1 and args.tensor_parallel_size > 1:
        p.error("--replicas and --tensor-parallel-size cannot be combined yet")
    if args.replicas > 1 and args.disaggregate:
        p.error("--replicas and --disaggregate cannot be combined yet")


def default_draft(spec: ModelSpec) -> str | None:
    """The engine's draft argument: None (no speculation), "ngram", or a draft checkpoint."""
    if spec.draft is not None:
        return None if spec.draft.lower() == "none" else "ngram" if spec.draft.lower() == "ngram" else spec.draft
    if spec.model is None and (EMBEDDED_DRAFT / "config.json").is_file():
        return str(EMBEDDED_DRAFT)
    return None


def served_name(spec: ModelSpec, engine) -> str:
    """--served-model-name, else the directory's name, a .gguf file's stem, or the name as
    given (a catalog name like smollm2, a hub id)."""
    if spec.served_model_name:
        return spec.served_model_name
    if spec.model is None:
        return engine.model_path.name
    path = Path(spec.model).expanduser()
    if path.suffix.lower() == ".gguf":
        return path.stem
    if path.is_dir():
        return path.resolve().name
    return spec.model


def draft_label(draft: str | None) -> str | None:
    if draft is None or draft == "ngram":
        return draft
    path = Path(draft).expanduser()
    return path.stem if path.suffix.lower() == ".gguf" else path.resolve().name if path.is_dir() else draft


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 10e6 else f"{n / 1e6:,.1f} MB"


def memory_line(service) -> str:
    """e.g. "smollm2: weights 540 MB, KV pool 90 MB (5,760 tokens)"."""
    info = service.engine.describe()
    line = (f"{service.model_name}: weights {_mb(info.model.weights_bytes)}, KV pool {_mb(info.kv_pool.bytes)} "
            f"({info.kv_pool.tokens:,} tokens)")
    if info.kv_pool.stores != "K and V":  # MLA: say what the pool keeps instead
        line += f" of {info.kv_pool.summary()}"
    kind, spec = service.draft_kind(), info.speculation
    if kind == "ngram":
        line += "; n-gram drafts (prompt lookup, no draft weights)"
    elif kind is not None:
        line += f"; draft model {kind}: weights {_mb(spec.draft.weights_bytes)}, KV pool {_mb(spec.draft_kv_bytes)}"
    if info.quantization is not None:
        line += f"; {info.quantization.summary}"
    if blocked := info.model.kernel_weight_bytes:  # engine/kernels/cpu_linear*.c: the weights' only copy
        line += f"; decode linears through the C kernels ({_mb(blocked)} of the weights in their layout, {info.model.dtype})"
    if info.cuda_graphs is not None:
        line += f"; decode steps replayed from CUDA graphs (batch sizes {', '.join(map(str, info.cuda_graphs))})"
    return line


def build_services(args: argparse.Namespace, say=None):
    """Every --model on its own engine (loaded one after another) -> ServedModels. Loaded on a
    thread that then ends: the main thread keeps no OpenMP workers to slow the engine threads'
    (on_own_thread says why)."""
    from engine import on_own_thread  # lazy: torch
    return on_own_thread(lambda: _load_services(args, say))


def _load_services(args: argparse.Namespace, say=None):
    from app.serving.engine_service import EngineService  # lazy: torch
    from app.serving.served_models import ServedModels  # lazy: torch
    from engine import CaptureConfig, DisaggEngine, EngineConfig, LLMEngine, Tracer  # lazy: torch

    say = say or (lambda line: print(line, flush=True))
    limits = serve_limits(args)  # before the model loads: a bad --auth fails at once
    config = EngineConfig(block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
                          kv_cache_memory_fraction=args.kv_cache_memory_fraction, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                          enable_prefix_caching=not args.no_prefix_caching, quantization=args.quantization,
                          cuda_graphs=False if args.no_cuda_graphs else None,
                          tensor_parallel_size=args.tensor_parallel_size, expert_parallel=args.expert_parallel)
    heads = [int(h) for h in args.capture_heads.split(",")] if args.capture_heads else None
    capture = CaptureConfig(max_keys=args.capture_max_keys, heads=heads)
    slots = ClientSlots(limits.max_concurrent_per_client)  # a client's cap counts its requests to every model
    store = trace_store(args)  # one byte budget for every model's traces
    specs = args.models
    names = [s.served_model_name for s in specs if s.served_model_name]
    if len(set(names)) < len(names):
        raise ValueError("two models have the same --served-model-name")

    def progress(done: int, total: int, what: str) -> None:
        if done == total:
            say(f"  captured {what}: {total} batch sizes" if what == "CUDA graphs" else f"  loaded {what}: {total} tensors")

    if not args.disaggregate and (args.prefill_ranks, args.decode_ranks) != (1, 1):
        raise ValueError("--prefill-ranks and --decode-ranks go with --disaggregate")
    services = []
    replicas = getattr(args, "replicas", 1)
    for i, spec in enumerate(specs, 1):
        # disaggregated: no speculation (the embedded model's default draft is left out; one asked for is refused)
        draft = spec.draft if args.disaggregate else default_draft(spec)
        options = dict(device=args.device, dtype=args.dtype, config=config, trace_level="basic",
                       capture=capture, progress=progress, draft=draft,
                       kv_pool_events="always")  # the page draws the pool for untraced requests too
        copies = []
        for j in range(replicas):
            if len(specs) > 1 or replicas > 1:
                say(f"[{i}/{len(specs)}] loading {spec.model or 'the embedded model'}"
                    f"{f' (draft: {draft_label(draft)})' if draft else ''}"
                    f"{f', replica {j + 1} of {replicas}' if replicas > 1 else ''}")
            if args.disaggregate:
                engine = DisaggEngine(spec.model, **options, tracer=Tracer(), prefill_ranks=args.prefill_ranks,
                                      decode_ranks=args.decode_ranks)
            else:
                engine = LLMEngine(spec.model, **options, tracer=Tracer(),
                                   num_speculative_tokens=args.num_speculative_tokens)
            service = EngineService(engine, store, model_name=served_name(spec, engine), limits=limits,
                                    slots=slots, draft_name=draft_label(draft))
            say("  " + memory_line(service))
            if args.disaggregate:
                say(f"  disaggregated: {engine.layout()}")
            copies.append(service)
        services.append(copies[0] if replicas == 1 else replicated(copies, args))
    return ServedModels(services)


def replicated(copies: list, args: argparse.Namespace):
    """One model's replicas behind its router."""
    from app.serving.replicas import ReplicaSet  # lazy: torch
    from app.serving.router import Router  # lazy: torch
    return ReplicaSet(copies, Router(args.router or "prefix-aware"))


def build_service(args: argparse.Namespace):
    """The first model's EngineService (tests and tools that drive one engine)."""
    return build_services(args).first


def trace_store(args: argparse.Namespace):
    """The store of recent requests' traces, with the byte bounds given (ValueError: bad bounds)."""
    if args.trace_max_bytes_per_request < 1:
        raise ValueError("--trace-max-bytes-per-request must be at least 1")
    try:
        return TraceStore(max_bytes_per_request=args.trace_max_bytes_per_request,
                          max_total_bytes=args.trace_store_bytes)
    except ValueError as e:
        raise ValueError(f"--trace-store-bytes: {e}") from None


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
    limits = ServeLimits.for_server(args.host, args.share or args.public, args.max_tokens_cap,
                                    args.max_concurrent_per_client,
                                    args.max_body_bytes, args.api_key, tuple(pairs),
                                    getattr(args, "api_trace_level", API_TRACE_LEVEL),
                                    getattr(args, "ignore_unknown_fields", False))
    return replace(limits, lab=getattr(args, "lab", False))


def library_of(store, args: argparse.Namespace):
    """The traces' library over the store, its database opened (exits with one line when it cannot be)."""
    from app.store.opening import DatabaseRefused, open_library  # lazy: sqlalchemy
    try:
        return open_library(store, args.db, lambda line: print(line, flush=True), args.db_max_bytes)
    except DatabaseRefused as e:
        sys.exit(f"cannot start: {e} (--db none serves from memory only)")


def replay_recording(name: str, library):
    """--replay's recording: a file, else the trace of that id in the database (ValueError: neither)."""
    from app.serving.recording import Recording  # lazy: torch
    if Path(name).is_file() or library.repo is None:
        return Recording.loads(Path(name).read_bytes())
    rec = library.recording(name)
    if rec is None:
        raise ValueError(f"no such file, and no trace of that id in {library.where}")
    return rec


def serve_replay(args: argparse.Namespace) -> None:
    """--replay FILE|ID: the page, replay controls and classroom on one recording; no engine."""
    from app.serving.recording import TraceFileError  # lazy: torch
    library = library_of(None, args)
    try:
        rec = replay_recording(args.replay, library)
        limits = serve_limits(args)
    except (TraceFileError, OSError, ValueError) as e:
        sys.exit(f"cannot replay {args.replay}: {e}")
    import uvicorn

    from app.server import create_app  # lazy: gradio

    app = create_app(None, replay=rec, limits=limits, library=library, classrooms=classrooms_of(library, args))
    print(f"TokenTrace replay: {rec.request_id} ({rec.model['name']}, {len(rec.steps())} engine steps) on "
          f"http://{args.host}:{args.port}", flush=True)
    if args.share:
        open_share_link(args.port, lambda line: print(line, flush=True))
    # open event streams (a classroom's audience) end 3 s after Ctrl-C instead of holding the exit
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=3)
    finally:
        library.close()  # the rooms' last changes go in before the process ends


def classrooms_of(library, args: argparse.Namespace):
    """The server's rooms, loaded back from the library's database (this host and port's)."""
    from app.classroom.lasting import lasting_classrooms  # lazy: torch (the rooms' recordings)
    return lasting_classrooms(library, f"{socket.gethostname()}:{args.port}", lambda line: print(line, flush=True))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.replay:
        return serve_replay(args)
    t0 = time.perf_counter()
    try:
        models = build_services(args)
    except Exception as e:  # one clear line: a corrupt checkpoint, an unsupported architecture, a draft...
        if os.environ.get("TOKENTRACE_DEBUG"):
            raise
        sys.exit(f"cannot start: {' '.join(str(e).split()) or type(e).__name__}")
    library = library_of(models.first.store, args)
    import uvicorn

    from app.server import create_app  # lazy: gradio

    app = create_app(models.start(), library=library, classrooms=classrooms_of(library, args))
    shown = []
    for service in models:
        info = service.model_info()
        draft = {None: "", "ngram": ", n-gram draft"}.get(info["draft"], ", draft on")
        reps = f", {info['replicas']} replicas, {info['router']} routing" if info.get("replicas") else ""
        shown.append(f"{info['name']} ({info['num_layers']} layers{draft}{reps})")
    print(f"TokenTrace: {', '.join(shown)} ready in {time.perf_counter() - t0:.1f} s "
          f"on http://{args.host}:{args.port}", flush=True)
    limits = models.limits
    if limits.public:
        print(f"public mode: max_tokens <= {limits.max_tokens_cap}, {limits.max_concurrent_per_client} requests "
              f"in flight per client; " + ("access token required" if limits.api_key else
                                            "no access token (set --api-key or TOKENTRACE_API_KEY)"), flush=True)
    if args.share:
        open_share_link(args.port, lambda line: print(line, flush=True))
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=3)
    finally:
        models.stop()
        library.close()  # the writes queued go in before the process ends


if __name__ == "__main__":
    main()
