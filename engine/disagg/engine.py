"""DisaggEngine: the decode side of a disaggregated engine, and the owner of its prefill side.

An LLMEngine (the serving process's: requests, outputs, trace and the decode KV pool are
here) whose new requests go to the prefill process instead of its own queue. Each one
comes back as a Handover (its first token, drawn there); the decode side then allocates
blocks in its own pool, posts a receive, asks for the pages (PULL) and, once they are in
(SENT), appends the first token and decodes the rest as any running sequence. Its prefix
cache is off: its blocks are the received pages, its block tables its own.

A request's path: decode add_request -> ADD -> prefill steps (its prefix cache, its pool)
-> READY -> decode blocks allocated, recv posted -> PULL -> send on torch.distributed ->
SENT -> kv.transfer event, first token, decode steps. Aborts and disconnects on the way
free the blocks on both sides (DROP); a prefill process that dies stops the engine with one
DisaggFailedError, its requests ended and its blocks freed.
"""
from __future__ import annotations

import datetime
import itertools
import os
import time
import weakref
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.checkpoint.resolve import resolve_model_path
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine, resolve_device
from engine.outputs import TokenOutput
from engine.parallel.comm import Comm
from engine.parallel.protocol import READY as STARTED, STARTUP_TIMEOUT_S
from engine.parallel.runner import RankFailedError, _stop_workers
from engine.scheduler import Scheduler, SchedulerOutput
from engine.sequence import Sequence, Status
from engine.trace import CaptureConfig
from engine.disagg import transfer
from engine.disagg.prefill import prefill_main
from engine.disagg.protocol import (ADD, DECODE_RANK, DROP, EVENTS, FAILED, PREFILL_RANK, PULL, READY, SENT,
                                    SHUTDOWN, STATS, STOP_CAPTURES, Handover, PrefillSpec, Wire)


class DisaggFailedError(RankFailedError):
    """The prefill process died or failed: the disaggregated engine cannot continue."""


def check_layout(prefill_ranks: int, decode_ranks: int, config: EngineConfig, draft) -> None:
    """The refusals, before any process starts."""
    if prefill_ranks != 1 or decode_ranks != 1:
        raise ValueError(f"--prefill-ranks {prefill_ranks} --decode-ranks {decode_ranks}: only 1 and 1 are built "
                         "(one prefill engine and one decode engine, one process and one device each); "
                         "several ranks a side would shard each engine (engine/parallel) and split its pages by "
                         "KV head, which the handover does not do yet")
    if config.tensor_parallel_size > 1 or config.expert_parallel:
        raise ValueError("disaggregate with tensor or expert parallelism is not built: use one or the other")
    if draft is not None:
        raise ValueError("disaggregate with speculative decoding (a draft or ngram) is not built: use one or the other")


@dataclass
class _InFlight:
    seq: Sequence
    handover: Handover
    pages: torch.Tensor  # the posted receive's staging tensor
    work: object  # its torch.distributed Work
    pulled: float  # perf_counter when the PULL went out


class DecodeScheduler(Scheduler):
    """The decode side's scheduler: a new request goes to the prefill side (`remote`), not
    into the queue; only preempted sequences (recomputed here) ever wait in it."""

    def __init__(self, config: EngineConfig, bm, remote, receiving) -> None:
        super().__init__(config, bm)
        self.remote = remote
        self.receiving = receiving  # () -> whether blocks are held for pages on the way

    def add(self, seq: Sequence) -> None:
        self.remote(seq)

    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        if out.out_of_memory and self.receiving():  # those blocks come back (as running requests' or free)
            out.out_of_memory = []
        return out

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.status == Status.WAITING and seq not in self.waiting:  # on the prefill side or its pages on the way
            seq.status, seq.finish_reason = Status.FINISHED, reason
            return
        super().finish(seq, reason)


class DisaggEngine(LLMEngine):
    """LLMEngine's interface; prefill in a process of its own. See the module's docstring."""

    def __init__(self, model: str | Path | None = None, *, device: str = "auto", dtype="auto",
                 config: EngineConfig | None = None, tracer=None, trace_level: str = "basic",
                 capture: CaptureConfig | None = None, progress=None, draft=None, kv_pool_events: str = "traced",
                 prefill_ranks: int = 1, decode_ranks: int = 1, num_speculative_tokens: int = 4,
                 prompt_lookup_max: int = 4, prompt_lookup_min: int = 2) -> None:
        """LLMEngine's arguments; speculation's are accepted and unused (a draft is refused)."""
        config = config or EngineConfig()
        check_layout(prefill_ranks, decode_ranks, config, draft)
        dev = resolve_device(device)
        if dev.type == "cuda" and torch.cuda.device_count() < 2:
            raise ValueError(f"disaggregate on CUDA needs 2 GPUs (NCCL: one a rank); this machine has "
                             f"{torch.cuda.device_count()}")
        decode_dev, prefill_dev = ("cuda:0", "cuda:1") if dev.type == "cuda" else ("cpu", "cpu")
        path = resolve_model_path(model if model is not None else Path(__file__).resolve().parents[2]
                                  / "assets" / "models" / "target")
        self.failed: str | None = None
        self.proc = None
        self._state = {"in_step": False}
        self.procs, self.conns, self.comm = [], [], None
        self._finalizer = weakref.finalize(self, _stop_workers, self.procs, self.conns, None, self._state)
        store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S),
                              wait_for_workers=False)
        threads = max(1, (os.cpu_count() or 1) // 2)
        spec = PrefillSpec(path, prefill_dev, dtype, config, capture or CaptureConfig(), tracer is not None,
                           kv_pool_events, store.port, threads)
        self._start_prefill(spec)  # it loads while this process loads the decode side
        try:
            torch.set_num_threads(threads)  # this process's share of the cores: the prefill process has the rest
            super().__init__(path, device=decode_dev, dtype=dtype, config=replace(config, enable_prefix_caching=False),
                             tracer=tracer, trace_level=trace_level, capture=capture, progress=progress,
                             kv_pool_events=kv_pool_events)
            self.prefill_num_blocks = self._wait_started()
            self.comm = Comm.connect_with_store(store, DECODE_RANK, 2, self.device, STARTUP_TIMEOUT_S)
        except BaseException:
            self.shutdown()
            raise
        self.prefix_caching = config.enable_prefix_caching  # the prefill side's (describe() says so)
        self.scheduler = DecodeScheduler(self.config, self.block_manager, self._to_prefill, lambda: bool(self.inflight))
        self.remote: dict[str, Sequence] = {}  # at the prefill side: added, pages not pulled yet
        self.ready: deque[tuple[Sequence, Handover]] = deque()  # prefilled, waiting for blocks here
        self.inflight: dict[int, _InFlight] = {}  # by tag: pages on the way
        self._tags = itertools.count(1)
        self._drawn: dict[str, float] = {}  # when the prefill side drew the first token (the TTFT split)
        self._stats: dict | None = None

    # --- start and stop --------------------------------------------------------------
    def _start_prefill(self, spec: PrefillSpec) -> None:
        ctx = mp.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe()
        p = ctx.Process(target=prefill_main, args=(spec, os.getpid(), child_conn), daemon=True,
                        name="tokentrace-prefill")
        p.start()
        child_conn.close()
        self.procs.append(p)
        self.conns.append(parent_conn)
        self.conn, self.proc = parent_conn, p

    def _wait_started(self) -> int:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.conn.poll(0.1):
            if not self.proc.is_alive() or time.monotonic() > deadline:
                raise DisaggFailedError(f"the prefill engine's process exited while loading (exit code "
                                        f"{self.proc.exitcode})")
        status, info = self.conn.recv()
        if status != STARTED:
            raise DisaggFailedError(f"the prefill engine failed to load: {info}")
        return info["num_blocks"]

    def shutdown(self) -> None:
        """Stop the prefill process (its shutdown message, then terminate what is left)."""
        self._finalizer.detach()
        if self.proc is not None and self.proc.is_alive() and not self._state.get("stopped"):
            try:
                self.conn.send(SHUTDOWN)
                self.proc.join(timeout=10)
            except (OSError, EOFError):
                pass
        _stop_workers(self.procs, self.conns, None, self._state)
        self.failed = self.failed or "this disaggregated engine was shut down (its prefill process is stopped)"

    # --- requests --------------------------------------------------------------------
    def add_request(self, prompt=None, params=None, **kwargs) -> str:
        if self.failed:
            raise DisaggFailedError(self.failed)
        if params is not None and params.n > 1:
            raise ValueError("n > 1 with disaggregate=True is not built: ask for one choice per request")
        return super().add_request(prompt, params, **kwargs)

    def _to_prefill(self, seq: Sequence) -> None:
        """DecodeScheduler.add: the request goes to the prefill side (under the engine's lock)."""
        self.remote[seq.request_id] = seq
        self._send((ADD, seq.request_id, list(seq.prompt_token_ids), seq.params, seq.trace_level))

    def abort(self, request_id: str) -> bool:
        with self.lock:
            done = super().abort(request_id)
            if done and self.remote.pop(request_id, None) is not None and not self.failed:
                self._send((DROP, request_id))  # its pages are not on the way: free them there
            return done

    def has_unfinished_requests(self) -> bool:
        return super().has_unfinished_requests() or bool(self.remote or self.ready or self.inflight)

    def stop_captures(self, request_id: str, limit_bytes: int) -> bool:
        with self.lock:
            if request_id in self.remote and not self.failed:
                self._send((STOP_CAPTURES, request_id, limit_bytes))
            return super().stop_captures(request_id, limit_bytes)

    # --- the loop --------------------------------------------------------------------
    def step(self) -> list[TokenOutput]:
        if not self.failed and not (self.scheduler.has_unfinished() or self._pending):
            try:  # nothing to decode: wait for the prefill side, without the lock (add and abort go on)
                self.conn.poll(0.05)
            except (EOFError, OSError):
                pass  # _poll below says why
        with self.lock:
            if self.failed:
                raise DisaggFailedError(self.failed)
            self._poll(0)
            if not (self.scheduler.has_unfinished() or self._pending):
                return []
            return super().step()

    def _poll(self, wait: float) -> None:
        """The prefill side's messages; then blocks for what is ready, as far as they go."""
        try:
            while self.conn.poll(wait):
                self._handle(self.conn.recv())
                wait = 0
        except (EOFError, OSError) as e:
            self._fail(e)
        if not self.proc.is_alive():
            self._fail(None)
        self._pull()

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == EVENTS:
            if self.tracer is not None:
                for type_, rid, step, data, ts in msg[1]:
                    self.tracer.emit_plain(type_, rid, step, data, ts)
        elif kind == READY:
            _, rid, h = msg
            seq = self.remote.get(rid)
            if seq is None or seq.is_finished:
                self._send((DROP, rid))
            elif h.finished:  # its first token ended it: no pages
                del self.remote[rid]
                self._first_token(seq, h)
            else:
                self.ready.append((seq, h))
        elif kind == SENT:
            _, rid, tag, wire = msg
            self._received(self.inflight.pop(tag), wire)
        elif kind == FAILED:
            _, rid, why = msg
            seq = self.remote.pop(rid, None)
            if seq is not None and not seq.is_finished:
                self._pending.append(self._finish(seq, "length" if why == "length" else "abort"))
        elif kind == STATS:
            self._stats = msg[1]

    def _pull(self) -> None:
        """Blocks here for the prefilled requests, in order, while the pool has them; a receive
        posted for each, then the PULL (the send never waits for this side's step)."""
        bm = self.block_manager
        while self.ready:
            seq, h = self.ready[0]
            if seq.is_finished:  # aborted while waiting: free its blocks there
                self.ready.popleft()
                self._send((DROP, seq.request_id))
                continue
            if bm.blocks_for(h.num_tokens) > bm.num_free_blocks:
                return  # the decode pool is full: wait for running requests to finish
            self.ready.popleft()
            del self.remote[seq.request_id]
            bm.allocate(seq, h.num_tokens)
            tag = next(self._tags)
            try:
                pages, work = transfer.post_recv(self.comm, self.runner.kv_cache, len(h.blocks), PREFILL_RANK, tag)
            except Exception as e:  # noqa: BLE001
                bm.free_seq(seq)
                self._fail(e)
            self.inflight[tag] = _InFlight(seq, h, pages, work, time.perf_counter())
            self._send((PULL, seq.request_id, tag))

    def _received(self, f: _InFlight, wire: Wire) -> None:
        """The pages are in: into this side's blocks, the first token appended, decoding on."""
        seq, h = f.seq, f.handover
        try:
            f.work.wait()
        except Exception as e:  # noqa: BLE001 - the prefill side died mid-transfer
            self.block_manager.free_seq(seq)
            self._fail(e)
        if seq.is_finished:  # aborted while its pages were on the way
            self.block_manager.free_seq(seq)
            return
        transfer.scatter(self.runner.kv_cache, seq.block_table, f.pages)
        seq.num_computed_tokens, seq.num_cached_tokens = h.num_tokens, h.num_cached_tokens
        self.block_manager.commit_full_blocks(seq, 0)
        seq.status = Status.RUNNING
        self.scheduler.running.append(seq)
        if seq.traced:
            self._emit(kv_transfer_event(seq, h, wire, f, self.model_config.num_layers, self.block_manager))
        self._first_token(seq, h)

    def _first_token(self, seq: Sequence, h: Handover) -> None:
        """The prefill side's first token, appended here: streamed, stop-checked, timed."""
        if h.generator_state is not None and seq.generator is not None:
            seq.generator.set_state(h.generator_state)  # seeded draws go on where the prefill side left them
        now = time.perf_counter()
        seq.first_scheduled_time, seq.prefill_done_time = h.first_scheduled_time, h.prefill_done_time
        seq.first_token_time = now  # the client sees it now: after the handover
        self._drawn[seq.request_id] = h.first_token_time
        seq.prompt_logprobs = dict(h.prompt_logprobs)
        self.stats.prefix_queried_tokens += h.num_tokens
        self.stats.prefix_hit_tokens += h.num_cached_tokens
        seq.num_cached_tokens = h.num_cached_tokens
        out = self._append_token(seq, h.token, now)
        out.logprobs = h.logprobs
        if seq.params.prompt_logprobs is not None:
            out.prompt_logprobs = [None] + [seq.prompt_logprobs.get(i) for i in range(1, seq.num_prompt_tokens)]
        self.stats.generated_tokens += 1
        self._pending.append(out)

    def describe(self):
        """The decode engine's description; its prefix cache is the prefill side's (on there)."""
        if self._info is None:
            info = super().describe()
            self._info = replace(info, kv_pool=replace(info.kv_pool, prefix_caching=self.prefix_caching))
        return self._info

    def _metrics(self, seq: Sequence) -> dict:
        m = super()._metrics(seq)
        drawn = self._drawn.get(seq.request_id)
        if drawn is not None and "ttft_split" in m:  # the first token's draw, then its handover
            m["ttft_split"]["first_sample"] = drawn - seq.prefill_done_time
            m["ttft_split"]["kv_transfer"] = seq.first_token_time - drawn
        return m

    def release(self, request_id: str) -> None:
        with self.lock:
            super().release(request_id)
            if request_id not in self.requests:
                self._drawn.pop(request_id, None)

    def _trace_pool(self) -> None:
        """kv.pool with the requests whose pages are on the way among the live ones."""
        if self.tracer is not None:
            live = self.scheduler.running + list(self.scheduler.waiting) + [f.seq for f in self.inflight.values()]
            event = self._pool_trace.after_step(self.block_manager, live, self.step_count)
            if event is not None:
                self._emit(event)

    def _emit(self, event) -> None:
        event[2]["engine"] = "decode"  # the timeline's track (the prefill side's say "prefill")
        super()._emit(event)

    # --- failure, and what the tests read ------------------------------------------------
    def _send(self, msg) -> None:
        try:
            self.conn.send(msg)
        except (OSError, EOFError) as e:
            self._fail(e)

    def _fail(self, err: BaseException | None):
        """The prefill process is gone: end every live request, free every block, stop."""
        time.sleep(0.2)  # let its exit code land
        code = self.proc.exitcode
        self.failed = (f"the prefill engine's process (rank {PREFILL_RANK}) died (exit code {code}); the "
                       "disaggregated engine stopped: restart it") if not self.proc.is_alive() else \
            f"the link to the prefill engine failed ({type(err).__name__}: {err}); the disaggregated engine stopped"
        for f in self.inflight.values():
            self.block_manager.free_seq(f.seq)
        self.inflight.clear()
        self.ready.clear()
        self.remote.clear()
        for rid in self.live_requests():
            self._finish(self.requests[rid], "abort")
        self._pending.clear()
        self.shutdown()
        raise DisaggFailedError(self.failed) from err

    def prefill_stats(self, timeout_s: float = 30.0) -> dict:
        """The prefill pool's numbers, read from its process (tests: nothing leaked there)."""
        with self.lock:
            self._stats = None
            self._send((STATS,))
            deadline = time.monotonic() + timeout_s
            while self._stats is None and time.monotonic() < deadline:
                self._poll(0.05)
            if self._stats is None:
                raise DisaggFailedError("the prefill engine did not answer")
            return self._stats


def kv_transfer_event(seq: Sequence, h: Handover, wire: Wire, f: _InFlight, num_layers: int, bm):
    """kv.transfer: one request's pages, prefill pool -> decode pool, and both pools then
    (the page draws them from this event alone)."""
    now = time.perf_counter()
    return "kv.transfer", seq.request_id, {
        "src": "prefill", "dst": "decode", "backend": wire.backend, "tokens": h.num_tokens,
        "num_blocks": len(h.blocks), "src_blocks": list(h.blocks), "dst_blocks": list(seq.block_table),
        "bytes": wire.bytes, "bytes_per_token": f.pages[:, :, 0, 0].numel() * f.pages.element_size(),
        "layers": list(range(num_layers)), "queue_ms": wire.queue_ms, "wire_ms": wire.wire_ms,
        "start": wire.start, "handover_ms": (now - h.first_token_time) * 1e3,
        "prefill_ms": (h.prefill_done_time - h.first_scheduled_time) * 1e3, "cached_tokens": h.num_cached_tokens,
        "src_pool": {"num_blocks": wire.pool_blocks, "free": wire.pool_free, "cached": wire.pool_cached},
        "dst_pool": {"num_blocks": bm.num_blocks, "free": bm.num_free_blocks, "cached": bm.num_cached_blocks},
        "block_size": bm.block_size}
