"""DisaggEngine: the decode side of a disaggregated engine, and the owner of its prefill side.

It holds an LLMEngine as its decode core (the serving process's: requests, outputs, trace and
decode engine 0's KV pool are there), built with CoreHooks so that a new request goes to a
prefill engine's process instead of its queue; it derives from nothing. Each
one comes back as a Handover (its first token, drawn there); the decode side then picks a
decode engine, allocates blocks in that one's pool, posts a receive, asks for the pages
(PULL) and, once they are in (SENT), appends the first token and decodes the rest as any
running sequence. The decode pools' prefix caches are off: their blocks are the received
pages, their block tables their own.

Layout (xPyD, as vLLM's and Dynamo's disaggregated serving name it): P prefill engines,
each a spawned process with its own model copy, KV pool and prefix cache (prefill k is rank
k + 1), and D decode engines, all in this process on rank 0: each a lane (the core's, then
another_lane) with its own pool, block manager and batch over this process's one copy of the
weights, each step given the lane that steps (LLMEngine.step_lane). One torch.distributed group of 1 + P processes; which prefill
and which decode engine a request gets: PrefillRouter, pick_decode.

A request's path: decode add_request -> route -> ADD -> prefill steps (its prefix cache, its
pool) -> READY -> a decode engine picked, blocks allocated, recv posted -> PULL -> send on
torch.distributed -> SENT -> kv.transfer event, first token, decode steps there. Aborts and
disconnects on the way free the blocks on both sides (DROP); a prefill process that dies
stops the engine with one DisaggFailedError, every request ended and every block freed.
"""
from __future__ import annotations

import datetime
import itertools
import os
import time
import weakref
from collections import deque
from dataclasses import dataclass, replace
from functools import partial
from multiprocessing.connection import wait as wait_any
from pathlib import Path

import torch
import torch.distributed as dist

from engine.checkpoint.resolve import resolve_model_path
from engine.config import EngineConfig
from engine.info import EngineInfo, EngineLoad
from engine.lane import CoreHooks, Lane, lane_load
from engine.llm_engine import DEFAULT_MODEL, LLMEngine
from engine.startup import resolve_device
from engine.outputs import RequestOutput, TokenOutput
from engine.parallel.comm import Comm
from engine.parallel.protocol import STARTUP_TIMEOUT_S
from engine.parallel.runner import RankFailedError, _stop_workers
from engine.parallel.spawn import check_alive, start_process, wait_loaded
from engine.request_table import RequestTable
from engine.sequence import Sequence, Status
from engine.trace import CaptureConfig
from engine.trace.events import Event
from engine.disagg import transfer
from engine.disagg.lanes import DecodeScheduler, another_lane, pool_stats
from engine.disagg.prefill import prefill_main
from engine.disagg.protocol import (ADD, DECODE_POOL_EVENT, DECODE_RANK, DROP, EVENTS, FAILED, PULL, READY, SENT,
                                    SHUTDOWN, STATS, STOP_CAPTURES, Handover, PrefillSpec, Wire, engine_name,
                                    kv_transfer_event, prefill_rank)
from engine.disagg.routing import PrefillRouter, block_hashes, pick_decode

MAX_ENGINES = 8  # a side: each prefill engine is a process with a model copy


class DisaggFailedError(RankFailedError):
    """A prefill process died or failed: the disaggregated engine cannot continue."""


def check_layout(prefill_ranks: int, decode_ranks: int, config: EngineConfig, draft) -> None:
    """The refusals, before any process starts."""
    if not (1 <= prefill_ranks <= MAX_ENGINES and 1 <= decode_ranks <= MAX_ENGINES):
        raise ValueError(f"--prefill-ranks {prefill_ranks} --decode-ranks {decode_ranks}: each side takes 1 to "
                         f"{MAX_ENGINES} engines (each prefill engine is a process with a copy of the model)")
    if config.tensor_parallel_size > 1 or config.expert_parallel:
        raise ValueError("disaggregate with tensor or expert parallelism is not built: use one or the other")
    if draft is not None:
        raise ValueError("disaggregate with speculative decoding (a draft or ngram) is not built: use one or the other")
    if decode_ranks > 1 and config.cuda_graphs:
        raise ValueError("cuda_graphs=True with more than one decode engine is not built (a graph holds one pool's "
                         "addresses; the decode engines take turns on one device)")


@dataclass
class _InFlight:
    seq: Sequence
    handover: Handover
    pages: torch.Tensor  # the posted receive's staging tensor
    work: object  # its torch.distributed Work
    pulled: float  # perf_counter when the PULL went out
    lane: int  # the decode engine that receives them
    source: int  # the prefill engine that sends them


class DisaggEngine:
    """The Engine protocol (engine.engine_api) around a decode core, an LLMEngine it holds;
    prefill in processes of their own. See the module's docstring."""

    def __init__(self, model: str | Path | None = None, *, device: str = "auto", dtype="auto",
                 config: EngineConfig | None = None, tracer=None, trace_level: str = "basic",
                 capture: CaptureConfig | None = None, progress=None, draft=None, kv_pool_events: str = "traced",
                 prefill_ranks: int = 1, decode_ranks: int = 1, num_speculative_tokens: int = 4,
                 prompt_lookup_max: int = 4, prompt_lookup_min: int = 2) -> None:
        """LLMEngine's arguments; speculation's are accepted and unused (a draft is refused).
        prefill_ranks: prefill engines (processes); decode_ranks: decode engines (in this one)."""
        config = config or EngineConfig()
        check_layout(prefill_ranks, decode_ranks, config, draft)
        dev = resolve_device(device)
        world = 1 + prefill_ranks
        if dev.type == "cuda" and torch.cuda.device_count() < world:
            raise ValueError(f"disaggregate on CUDA with {prefill_ranks} prefill engine(s) needs {world} GPUs (NCCL: "
                             f"the decode engines on cuda:0, prefill k on cuda:k+1); this machine has "
                             f"{torch.cuda.device_count()}")
        path = resolve_model_path(model if model is not None else DEFAULT_MODEL)
        self.failed: str | None = None
        self._stepping: Lane | None = None  # the decode engine whose step runs (its events name it)
        self._lane_of: dict[str, int] = {}  # request id -> its decode engine, once its pages were pulled
        self.inflight: dict[int, _InFlight] = {}  # by tag: pages on the way
        self._state = {"in_step": False}
        self.procs, self.conns, self.comm = [], [], None
        self._finalizer = weakref.finalize(self, _stop_workers, self.procs, self.conns, None, self._state)
        store = dist.TCPStore("127.0.0.1", 0, world, True, timeout=datetime.timedelta(seconds=STARTUP_TIMEOUT_S),
                              wait_for_workers=False)
        threads = max(1, (os.cpu_count() or 1) // world)  # this process's share of the cores, and each prefill's
        for k in range(prefill_ranks):  # they load while this process loads the decode side
            spec = PrefillSpec(path, f"cuda:{k + 1}" if dev.type == "cuda" else "cpu", dtype, config,
                               capture or CaptureConfig(), tracer is not None, kv_pool_events, store.port, threads,
                               k, world)
            start_process(prefill_main, (spec, os.getpid()), f"tokentrace-prefill-{k}", self.procs, self.conns)
        try:
            torch.set_num_threads(threads)
            decode_config = replace(config, enable_prefix_caching=False)
            if decode_ranks > 1:
                decode_config = replace(decode_config, cuda_graphs=False)
            hooks = CoreHooks(new_scheduler=lambda bm: DecodeScheduler(decode_config, bm, self._to_prefill,
                                                                       self._arriving(0)),
                              lane_for=self._lane_for, stamp=self._stamp)
            self.core = LLMEngine(path, device="cuda:0" if dev.type == "cuda" else "cpu", dtype=dtype,
                                  config=decode_config, tracer=tracer, trace_level=trace_level, capture=capture,
                                  progress=progress, kv_pool_events=kv_pool_events, hooks=hooks)
            self.prefill_blocks = self._wait_started()
            self.comm = Comm.connect_watching(store, DECODE_RANK, world, self.core.device, STARTUP_TIMEOUT_S, partial(
                check_alive, self.procs, DisaggFailedError, "prefill engine {n}'s process exited before it joined "
                "the process group"))
        except BaseException:
            self.shutdown()
            raise
        core = self.core  # what the Engine protocol reads, the core's (and decode engine 0's pool: the tests')
        self.tokenizer, self.tracer, self.model_path = core.tokenizer, core.tracer, core.model_path
        self.max_model_len, self.num_speculative_tokens = core.max_model_len, core.num_speculative_tokens
        self.config, self.model_config, self.block_manager = core.config, core.model_config, core.block_manager
        self.lock = core.lock
        self.proc, self.conn = self.procs[0], self.conns[0]  # prefill engine 0's (one prefill engine: the one)
        self.prefix_caching = config.enable_prefix_caching  # the prefill side's (describe() says so)
        self._info = None  # describe(), built on first use
        self.router = PrefillRouter(prefill_ranks, min(self.prefill_blocks), self.config.block_size)
        emit = core.emit if tracer is not None else None
        self.lanes = [core.lane] + [another_lane(core.lane, self.config, j, self._to_prefill, self._arriving(j), emit,
                                                  kv_pool_events == "always") for j in range(1, decode_ranks)]
        self.remote: dict[str, Sequence] = {}  # at a prefill engine: added, pages not pulled yet
        self._prefill_of: dict[str, int] = {}  # ... at which one
        self.ready: deque[tuple[Sequence, Handover, int]] = deque()  # prefilled (by engine k), waiting for blocks
        self._tags = itertools.count(1)  # one sequence for every pair: a tag is never reused while posted
        self._stats: dict[int, dict] = {}
        # each prefill engine's pool as its last send left it (the kv.transfer event draws them all)
        self._prefill_pools = [{"num_blocks": n, "free": n, "cached": 0} for n in self.prefill_blocks]

    @property
    def requests(self) -> RequestTable:  # the core's: live, and finished ones until released
        return self.core.requests

    @property
    def step_count(self) -> int:  # the core's: every decode engine's step counts one
        return self.core.step_count

    def layout(self) -> str:
        """The layout and the routing, in words (the server prints it at start-up)."""
        pids = ", ".join(str(p.pid) for p in self.procs)
        pools = ", ".join(f"{n:,}" for n in self.prefill_blocks)
        return (f"{len(self.procs)} prefill engine(s) in process(es) {pids} (ranks 1-{len(self.procs)}), each with "
                f"its own KV pool ({pools} blocks) and prefix cache; {len(self.lanes)} decode engine(s) in this "
                f"process (rank 0), a pool of {self.block_manager.num_blocks:,} blocks each, stepped in turn; pages "
                f"sent on torch.distributed ({transfer.backend(self.core.runner.kv_cache)}). A request goes to the "
                f"prefill engine with the fewest prefill tokens to compute, its own included less the prefix that "
                f"engine holds cached; its pages to the decode engine with the most free blocks")

    def _arriving(self, j: int):  # decode engine j's DecodeScheduler: the requests whose pages are on the way there
        return lambda: [f.seq for f in self.inflight.values() if f.lane == j]

    def _lane_for(self, seq: Sequence) -> Lane:  # its decode engine's, once its pages were pulled
        return self.lanes[self._lane_of.get(seq.request_id, 0)]

    # --- start and stop --------------------------------------------------------------
    def _wait_started(self) -> list[int]:
        """Every prefill engine's start-up answer: the blocks of its pool (STARTUP_TIMEOUT_S for all)."""
        infos = wait_loaded(self.procs, self.conns, STARTUP_TIMEOUT_S, DisaggFailedError,
                            exited="prefill engine {n}'s process exited while loading",
                            failed="prefill engine {n} failed to load")
        return [info["num_blocks"] for info in infos]

    def shutdown(self) -> None:
        """Stop the prefill processes (their shutdown message, then terminate what is left)."""
        self._finalizer.detach()
        if not self._state.get("stopped") and self.comm is not None:  # serving (still loading: they read no message)
            for p, conn in zip(self.procs, self.conns):
                try:
                    if p.is_alive():
                        conn.send(SHUTDOWN)
                except (OSError, EOFError):
                    pass
            deadline = time.monotonic() + 10
            for p in self.procs:
                p.join(timeout=max(0.1, deadline - time.monotonic()))
        _stop_workers(self.procs, self.conns, None, self._state)
        self.failed = self.failed or "this disaggregated engine was shut down (its prefill processes are stopped)"

    # --- requests --------------------------------------------------------------------
    def add_request(self, prompt=None, params=None, **kwargs) -> str:
        if self.failed:
            raise DisaggFailedError(self.failed)
        if params is not None and params.n > 1:
            raise ValueError("n > 1 with disaggregate=True is not built: ask for one choice per request")
        return self.core.add_request(prompt, params, **kwargs)

    def _to_prefill(self, seq: Sequence) -> None:
        """DecodeScheduler.add: the request goes to the prefill engine the router picks (under the lock)."""
        k = self.router.route(seq.request_id, list(seq.prompt_token_ids)).index
        self.remote[seq.request_id], self._prefill_of[seq.request_id] = seq, k
        self._send(k, (ADD, seq.request_id, list(seq.prompt_token_ids), seq.params, seq.trace_level))

    def _unremote(self, request_id: str) -> int | None:
        """It left the prefill side (pulled, ended): which prefill engine it was at."""
        self.remote.pop(request_id, None)
        return self._prefill_of.pop(request_id, None)

    def abort(self, request_id: str) -> bool:
        with self.lock:
            done = self.core.abort(request_id)
            if done and request_id in self.remote:
                self.router.answered(request_id)
                k = self._unremote(request_id)
                if not self.failed:
                    self._send(k, (DROP, request_id))  # its pages are not on the way: free them there
            return done

    def cached_prefix_tokens(self, token_ids: list[int]) -> int:
        """The prefill side's prefix caches, as the router's record has them (the decode pools
        cache nothing): the most any prefill engine would skip of these ids. A hint, as on any engine."""
        ids = list(token_ids)
        hashes = block_hashes(ids, self.config.block_size)
        return max(e.cached_tokens(hashes, len(ids), self.config.block_size) for e in self.router.engines)

    def has_unfinished_requests(self) -> bool:  # the core's: decode engine 0's, and what the next step tells
        return self.core.has_unfinished_requests() or any(lane.scheduler.has_unfinished() for lane in self.lanes) \
            or bool(self.remote or self.ready or self.inflight)

    def get_output(self, request_id: str) -> RequestOutput:
        return self.core.get_output(request_id)

    def live_requests(self) -> list[str]:
        return self.core.live_requests()

    def stop_captures(self, request_id: str, limit_bytes: int) -> bool:
        with self.lock:
            if request_id in self.remote and not self.failed:
                self._send(self._prefill_of[request_id], (STOP_CAPTURES, request_id, limit_bytes))
            return self.core.stop_captures(request_id, limit_bytes)

    # --- the loop --------------------------------------------------------------------
    def step(self) -> list[TokenOutput]:
        """Every decode engine with work takes its step, in turn."""
        busy = lambda: [lane for lane in self.lanes if lane.scheduler.has_unfinished()]  # noqa: E731
        if not self.failed and not (busy() or self.core.has_unfinished_requests()):
            try:  # nothing to decode: wait for the prefill side, without the lock (add and abort go on)
                wait_any(self.conns, 0.05)
            except (EOFError, OSError):
                pass  # _poll below says why
        with self.lock:
            if self.failed:
                raise DisaggFailedError(self.failed)
            self._poll()
            # outputs made between steps (aborts, first tokens) are told by a step: decode engine 0's if none is busy
            lanes = busy() or (self.lanes[:1] if self.core.has_unfinished_requests() else [])
            outputs = []
            for lane in lanes:
                self._stepping = lane
                outputs.extend(self.core.step_lane(lane))
            return outputs

    def _poll(self) -> None:
        """The prefill engines' messages; then blocks for what is ready, as far as they go."""
        for k, conn in enumerate(self.conns):
            try:
                while conn.poll(0):
                    self._handle(k, conn.recv())
            except (EOFError, OSError) as e:
                self._fail(k, e)
        for k, p in enumerate(self.procs):
            if not p.is_alive():
                self._fail(k, None)
        self._pull()

    def _handle(self, k: int, msg: tuple) -> None:
        """A message from prefill engine k."""
        kind = msg[0]
        if kind == EVENTS:
            if self.tracer is not None:
                for type_, rid, step, data, ts in msg[1]:
                    self.tracer.emit_plain(type_, rid, step, data, ts)
        elif kind == READY:
            _, rid, h = msg
            self.router.answered(rid)
            seq = self.remote.get(rid)
            if seq is None or seq.is_finished:
                self._send(k, (DROP, rid))
            elif h.finished:  # its first token ended it: no pages (any decode engine's scheduler ends it)
                self._unremote(rid)
                self._first_token(self.lanes[0], seq, h)
            else:
                self.ready.append((seq, h, k))
        elif kind == SENT:
            _, rid, tag, wire = msg
            self._prefill_pools[k] = {"num_blocks": wire.pool_blocks, "free": wire.pool_free,
                                      "cached": wire.pool_cached}
            self._received(self.inflight.pop(tag), wire)
        elif kind == FAILED:
            _, rid, why = msg
            self.router.answered(rid)
            seq = self.remote.get(rid)
            self._unremote(rid)
            if seq is not None and not seq.is_finished:
                self.core.end(seq, "length" if why == "length" else "abort")
        elif kind == STATS:
            self._stats[k] = msg[1]

    def _pull(self) -> None:
        """Blocks for the prefilled requests, in order, in the decode engine with the most free
        blocks where they fit; a receive posted for each, then the PULL (the send never waits
        for this side's step). The head fits nowhere: it waits for running requests to finish."""
        while self.ready:
            seq, h, k = self.ready[0]
            if seq.is_finished:  # aborted while waiting: free its blocks there
                self.ready.popleft()
                self._send(k, (DROP, seq.request_id))
                continue
            j = pick_decode([lane.block_manager.num_free_blocks for lane in self.lanes],
                            self.block_manager.blocks_for(h.num_tokens))
            if j is None:
                return
            self.ready.popleft()
            self._unremote(seq.request_id)
            lane = self.lanes[j]
            self._lane_of[seq.request_id] = j
            lane.block_manager.allocate(seq, h.num_tokens)
            tag = next(self._tags)
            try:
                pages, work = transfer.post_recv(self.comm, lane.runner.kv_cache, len(h.blocks), prefill_rank(k), tag)
            except Exception as e:  # noqa: BLE001
                lane.block_manager.free_seq(seq)
                self._fail(k, e)
            self.inflight[tag] = _InFlight(seq, h, pages, work, time.perf_counter(), j, k)
            self._send(k, (PULL, seq.request_id, tag))

    def _received(self, f: _InFlight, wire: Wire) -> None:
        """The pages are in: into the decode engine's blocks, the first token appended, decoding on."""
        seq, h, lane = f.seq, f.handover, self.lanes[f.lane]
        try:
            f.work.wait()
        except Exception as e:  # noqa: BLE001 - the prefill side died mid-transfer
            lane.block_manager.free_seq(seq)
            self._fail(f.source, e)
        if seq.is_finished:  # aborted while its pages were on the way
            lane.block_manager.free_seq(seq)
            return
        transfer.scatter(lane.runner.kv_cache, seq.block_table, f.pages)
        seq.num_computed_tokens, seq.num_cached_tokens = h.num_tokens, h.num_cached_tokens
        lane.block_manager.commit_full_blocks(seq, 0)
        seq.status = Status.RUNNING
        lane.scheduler.running.append(seq)
        if seq.traced:
            self.core.emit(kv_transfer_event(seq, h, wire, f.source, f.lane, f.pages, self.model_config.num_layers,
                                         self._pools(), self.config.block_size))
        self._first_token(lane, seq, h)

    def _pools(self) -> list[dict]:
        """Every engine's pool: the prefill engines' as their last send left them, the decode engines' now."""
        pre = [{"engine": engine_name("prefill", k), **p} for k, p in enumerate(self._prefill_pools)]
        return pre + [{"engine": engine_name("decode", lane.index), "num_blocks": lane.block_manager.num_blocks,
                       "free": lane.block_manager.num_free_blocks, "cached": lane.block_manager.num_cached_blocks}
                      for lane in self.lanes]

    def _first_token(self, lane: Lane, seq: Sequence, h: Handover) -> None:
        """The prefill side's first token, appended here: streamed, stop-checked, timed."""
        if h.generator_state is not None and seq.generator is not None:
            seq.generator.set_state(h.generator_state)  # seeded draws go on where the prefill side left them
        now = time.perf_counter()
        seq.first_scheduled_time, seq.prefill_done_time = h.first_scheduled_time, h.prefill_done_time
        seq.first_token_time = now  # the client sees it now: after the handover
        seq.first_token_drawn_time = h.first_token_time  # its metrics split the handover out
        seq.prompt_logprobs = dict(h.prompt_logprobs)
        self.core.stats.prefix_queried_tokens += h.num_tokens
        self.core.stats.prefix_hit_tokens += h.num_cached_tokens
        seq.num_cached_tokens = h.num_cached_tokens
        self.core.append(lane, seq, h.token, now, h.logprobs, between_steps=True)

    def describe(self) -> EngineInfo:
        """The decode engine's description (each decode engine's pool is this size); its prefix
        cache is the prefill side's (on there)."""
        if self._info is None:
            info = self.core.describe()
            self._info = replace(info, kv_pool=replace(info.kv_pool, prefix_caching=self.prefix_caching))
        return self._info

    def load(self) -> EngineLoad:
        """Every decode engine's together; requests at the prefill side or on the wire count as waiting."""
        with self.lock:
            core = self.core
            loads = [lane_load(lane, core.step_count, core.stats, core.num_aborted) for lane in self.lanes]
            add = lambda name: sum(getattr(x, name) for x in loads)  # noqa: E731
            return replace(loads[0], running=add("running"), waiting=add("waiting") + len(self.remote) +
                           len(self.inflight), blocks_used=add("blocks_used"), blocks_cached=add("blocks_cached"),
                           blocks_free=add("blocks_free"))

    def release(self, request_id: str) -> None:
        with self.lock:
            self.core.release(request_id)
            if request_id not in self.requests:
                self._lane_of.pop(request_id, None)
            if len(self._lane_of) > len(self.requests) + 256:  # requests forgotten unreleased (max_finished)
                self._lane_of = {r: j for r, j in self._lane_of.items() if r in self.requests}

    def _stamp(self, event: Event) -> Event:
        """Every event of the decode side (CoreHooks.stamp) says engine="decode" (the prefill
        side's say "prefill") and, where it is known, the decode engine's index: the pool's
        events and steps of the one stepping, a request's once its pages were pulled (before
        that, its arrival, say, belongs to no decode engine yet)."""
        name, rid, data = event
        data["engine"] = "decode"
        j = self._stepping.index if rid is None and self._stepping is not None else self._lane_of.get(rid)
        if j is not None:
            data["engine_index"] = j
            if name == "kv.pool" and j > 0:
                return DECODE_POOL_EVENT, rid, data
        return event

    # --- failure, and what the tests read ------------------------------------------------
    def _send(self, k: int, msg) -> None:
        try:
            self.conns[k].send(msg)
        except (OSError, EOFError) as e:
            self._fail(k, e)

    def _fail(self, k: int, err: BaseException | None):
        """A prefill process is gone: end every live request, free every block, stop them all."""
        time.sleep(0.2)  # let its exit code land
        dead = [i for i, p in enumerate(self.procs) if not p.is_alive()]
        if dead:
            i = dead[0]
            self.failed = (f"prefill engine {i}'s process (rank {prefill_rank(i)}) died (exit code "
                           f"{self.procs[i].exitcode}); the disaggregated engine stopped: restart it")
        else:
            self.failed = (f"the link to prefill engine {k} failed ({type(err).__name__}: {err}); the disaggregated "
                           "engine stopped")
        for f in self.inflight.values():
            self.lanes[f.lane].block_manager.free_seq(f.seq)
        self.inflight.clear()
        self.ready.clear()
        self.remote.clear()
        self._prefill_of.clear()
        self.core.end_all("abort")
        self.shutdown()
        raise DisaggFailedError(self.failed) from err

    def prefill_stats(self, timeout_s: float = 30.0) -> dict:
        """The prefill pools' numbers, read from their processes (tests: nothing leaked there):
        summed, and each engine's under "engines"."""
        with self.lock:
            self._stats = {}
            for k in range(len(self.conns)):
                self._send(k, (STATS,))
            deadline = time.monotonic() + timeout_s
            while len(self._stats) < len(self.conns) and time.monotonic() < deadline:
                wait_any(self.conns, 0.05)
                self._poll()
            if len(self._stats) < len(self.conns):
                raise DisaggFailedError("a prefill engine did not answer")
            each = [self._stats[k] for k in range(len(self.conns))]
            total = lambda key: sum(s[key] for s in each)  # noqa: E731
            return {"num_blocks": total("num_blocks"), "free_blocks": total("free_blocks"),
                    "cached_blocks": total("cached_blocks"), "held": sorted(r for s in each for r in s["held"]),
                    "live": sorted(r for s in each for r in s["live"]), "engines": each}

    def decode_stats(self) -> list[dict]:
        """Each decode engine's pool (tests: nothing leaked there)."""
        with self.lock:
            return [pool_stats(lane) for lane in self.lanes]

