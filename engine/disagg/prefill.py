"""The prefill side: an engine that computes prompts and draws each request's first token,
then holds the request's KV blocks until the decode side pulls them (transfer).

PrefillEngine holds an LLMEngine (its core, built with CoreHooks; no subclass) whose
requests all end after their first token: with the
finish reason HANDOVER when nothing else ended them (its blocks are held, not freed), or
their own (a stop token, max_tokens 1: nothing to hand over but the token). Its prefix
cache works as on any engine: a held request's full blocks are in it, and stay cached
after they are sent and freed.

prefill_main is the spawned process (one per prefill engine: prefill k is rank k + 1, with its
own model copy, pool and prefix cache): it builds the engine, answers the start-up, joins the
process group and serves the decode side's messages (protocol):
a PULL at once, on the Sender's thread (the send overlaps the engine's step), the others
between its steps. Like a parallel engine's worker it watches its parent and ends with
os._exit: a decode side that vanished leaves nothing behind.
"""
from __future__ import annotations

import os
import queue
import signal
import threading
import traceback

import torch
from tqdm.std import tqdm

from engine.lane import CoreHooks
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.output_processor import OutputProcessor
from engine.outputs import TokenOutput
from engine.scheduler import Scheduler, SchedulerOutput
from engine.parallel.comm import Comm
from engine.parallel.protocol import READY as STARTED, error_text
from engine.parallel.worker import _watch_parent
from engine.sequence import Sequence, Status
from engine.trace import EventList, Tracer
from engine.disagg import transfer
from engine.disagg.protocol import (ADD, DECODE_RANK, DROP, DROPPED_EVENTS, EVENTS, FAILED, HANDOVER,
                                    PREFILL_POOL_EVENT, PULL, READY, SENT, SHUTDOWN, STATS,
                                    STOP_CAPTURES, Handover, PrefillSpec, Wire, prefill_rank)


class PrefillScheduler(Scheduler):
    """Held requests' blocks come back once the decode side pulls them: a request that does
    not fit beside them waits for that, rather than end as too big for the pool."""

    def __init__(self, config, bm, held: dict) -> None:
        super().__init__(config, bm)
        self.held = held

    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        if out.out_of_memory and self.held:
            out.out_of_memory = []
        return out

    def holding(self) -> list[Sequence]:  # the held requests' blocks are still theirs
        return super().holding() + list(self.held.values())


class HandoverOutputs(OutputProcessor):
    """Every request stops after its first token: HANDOVER when nothing else ended it."""

    def stop_reason(self, seq: Sequence, token: int) -> str | None:
        reason = super().stop_reason(seq, token)
        return HANDOVER if reason is None else reason


class PrefillEngine:
    """A prefill engine: an LLMEngine it holds (its core), built so that every request stops
    after its first token; those that go on are held (their blocks kept) until pulled."""

    def __init__(self, model, *, config: EngineConfig | None = None, **kwargs) -> None:
        """LLMEngine's arguments."""
        config = config or EngineConfig()
        self.held: dict[str, Sequence] = {}  # handed over, blocks kept until the decode side pulls them
        hooks = CoreHooks(new_scheduler=lambda bm: PrefillScheduler(config, bm, self.held),
                          output_processor=HandoverOutputs, hold=self._hold)
        self.core = LLMEngine(model, config=config, hooks=hooks, **kwargs)

    def _hold(self, seq: Sequence, reason: str, token: int | None) -> TokenOutput | None:
        """CoreHooks.hold: a request handed over is out of the batch, its blocks kept (None: any other finish)."""
        if reason != HANDOVER:
            return None
        core = self.core
        core.scheduler.running.remove(seq)  # out of the batch; its blocks stay referenced
        seq.status, seq.finish_reason = Status.FINISHED, reason
        self.held[seq.request_id] = seq
        return core.output.token_output(seq, token, len(seq.text), core.step_count)

    def handover(self, seq: Sequence, logprobs) -> Handover:
        return Handover(token=seq.token_ids[-1], num_tokens=seq.num_prompt_tokens, blocks=list(seq.block_table),
                        finished=seq.finish_reason != HANDOVER,
                        generator_state=None if seq.generator is None else seq.generator.get_state(),
                        logprobs=logprobs, prompt_logprobs=dict(seq.prompt_logprobs),
                        num_cached_tokens=seq.num_cached_tokens, first_scheduled_time=seq.first_scheduled_time,
                        prefill_done_time=seq.prefill_done_time, first_token_time=seq.first_token_time)

    def sent(self, request_id: str, nbytes: int, start: float, ms: float, backend: str) -> Wire:
        """The held request's pages left (the Sender's thread sent them): free its blocks here."""
        seq = self.held.pop(request_id)
        self._forget(seq)
        bm = self.core.block_manager
        return Wire(nbytes, (start - seq.first_token_time) * 1e3, ms, start, backend,
                    bm.num_blocks, bm.num_free_blocks, bm.num_cached_blocks)

    def drop(self, request_id: str) -> None:
        """The decode side ended the request (abort, disconnect): free what it holds here."""
        seq = self.held.pop(request_id, None)
        if seq is not None:
            self._forget(seq)
        elif self.core.abort(request_id):  # still prefilling: the next step reports it, then it is released
            pass

    def _forget(self, seq: Sequence) -> None:
        core = self.core
        core.block_manager.free_seq(seq)
        core.requests.pop(seq.request_id, None)
        if core.tracer is not None:  # kv.pool with the held requests among the live ones (PrefillScheduler.holding)
            core.trace_pool(core.lane)

    def pool_stats(self) -> dict:
        core, bm = self.core, self.core.block_manager
        live = [s for s in core.requests.values() if not s.is_finished] + list(self.held.values())
        bm.check_invariants(live)
        return {"num_blocks": bm.num_blocks, "free_blocks": bm.num_free_blocks, "held": sorted(self.held),
                "live": core.live_requests(), "cached_blocks": bm.num_cached_blocks}


def prefill_main(spec: PrefillSpec, parent: int, conn) -> None:
    """The prefill process (torch.multiprocessing, spawn). Every end is os._exit, as a
    parallel worker's (_watch_parent says why)."""
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the decode side decides
    tqdm.set_lock(threading.RLock())  # no named semaphore left behind by os._exit
    torch.set_num_threads(spec.threads)
    sink = EventList()
    try:
        engine = PrefillEngine(spec.model, device=spec.device, dtype=spec.dtype, config=spec.config,
                               tracer=Tracer(sink) if spec.trace else None, capture=spec.capture,
                               kv_pool_events=spec.kv_pool_events, progress=lambda *_: None)  # the decode side shows it
        conn.send((STARTED, {"num_blocks": engine.core.block_manager.num_blocks}))
        comm = Comm.connect("127.0.0.1", spec.port, prefill_rank(spec.index), spec.world_size,
                            torch.device(spec.device))
    except BaseException as e:  # noqa: BLE001 - reported to the decode side, which raises it
        try:
            conn.send(("error", error_text(e)))
        finally:
            os._exit(1)
    try:
        _serve(engine, comm, conn, sink, spec.index)
    except (EOFError, OSError):  # the decode side is gone
        os._exit(2)
    except Exception:
        traceback.print_exc()
        os._exit(1)
    conn.close()
    os._exit(0)


class Sender:
    """The decode side's messages, read on a thread of their own: a PULL is served at once, its
    send overlapping the engine's step (the held blocks are written by no one until they are
    freed, after the send); every other message waits in `inbox` for the engine's loop."""

    def __init__(self, conn, comm: Comm, kv: torch.Tensor) -> None:
        self.conn, self.comm, self.kv = conn, comm, kv
        self.inbox: queue.Queue = queue.Queue()
        self.pages: dict[str, list[int]] = {}  # held requests' blocks, offered by the loop before READY
        self.lock = threading.Lock()
        threading.Thread(target=self._read, name="tokentrace-prefill-sender", daemon=True).start()

    def offer(self, request_id: str, blocks: list[int]) -> None:
        with self.lock:
            self.pages[request_id] = list(blocks)

    def forget(self, request_id: str) -> None:
        with self.lock:
            self.pages.pop(request_id, None)

    def _read(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                if msg is not SHUTDOWN and msg[0] == PULL:
                    _, rid, tag = msg
                    with self.lock:
                        blocks = self.pages.pop(rid)
                    nbytes, start, ms = transfer.send(self.comm, self.kv, blocks, DECODE_RANK, tag)
                    msg = (_SENT, rid, tag, nbytes, start, ms)
                self.inbox.put(msg)
                if msg is SHUTDOWN:
                    return
        except BaseException as e:  # noqa: BLE001 - the loop exits on it (EOFError: the decode side is gone)
            self.inbox.put((_GONE, e))


_SENT, _GONE = "_sent", "_gone"  # the Sender's own notes to the loop
_NOTHING = ("_nothing",)


def _serve(engine: PrefillEngine, comm: Comm, conn, sink: EventList, index: int) -> None:
    """Messages first (all that are waiting), then one step; idle, wait for a message."""
    core = engine.core  # the loop's calls (step, add_request...) are the core's; the handover's, the engine's
    sender = Sender(conn, comm, core.runner.kv_cache)
    ran = True  # the last step computed something (else it waits for held blocks: no busy loop)
    with torch.inference_mode():
        while True:
            busy = core.has_unfinished_requests()
            try:
                msg = sender.inbox.get_nowait() if busy and ran else sender.inbox.get(timeout=0.01 if busy else 0.05)
            except queue.Empty:
                msg = _NOTHING
            if msg is SHUTDOWN:
                return
            if msg is not _NOTHING:
                if msg[0] == _GONE:
                    raise msg[1]
                reply = _handle(engine, sender, msg)
                _flush(sink, conn, index)
                if reply is not None:
                    conn.send(reply)
                continue
            if busy:
                passes = core.stats.target_passes
                replies = _after_step(engine, core.step(), sender)
                ran = core.stats.target_passes > passes or bool(replies)
                _flush(sink, conn, index)
                for reply in replies:
                    conn.send(reply)


def _handle(engine: PrefillEngine, sender: Sender, msg: tuple):
    kind = msg[0]
    if kind == ADD:
        _, rid, ids, params, level = msg
        try:
            engine.core.add_request(ids, params, request_id=rid, trace_level=level)
        except ValueError as e:
            return FAILED, rid, str(e)
    elif kind == _SENT:
        _, rid, tag, nbytes, start, ms = msg
        return SENT, rid, tag, engine.sent(rid, nbytes, start, ms, transfer.backend(engine.core.runner.kv_cache))
    elif kind == DROP:
        sender.forget(msg[1])
        engine.drop(msg[1])
    elif kind == STOP_CAPTURES:
        engine.core.stop_captures(msg[1], msg[2])
    elif kind == STATS:
        return STATS, engine.pool_stats()
    else:
        raise ValueError(f"unknown message {kind!r}")
    return None


def _after_step(engine: PrefillEngine, outputs, sender: Sender) -> list[tuple]:
    """The step's finished requests: a handover (or a first token that ended it) for each that
    drew its token; a failure for one that ended without (no room in the pool); aborts released."""
    replies = []
    for out in outputs:
        seq = engine.core.requests.get(out.request_id)
        if not out.finished or seq is None:
            continue
        if out.token_id >= 0 and seq.num_output_tokens == 1:
            if seq.finish_reason == HANDOVER:  # its pages may be pulled from now on
                sender.offer(out.request_id, seq.block_table)
            replies.append((READY, out.request_id, engine.handover(seq, out.logprobs)))
        elif out.finish_reason != "abort":
            replies.append((FAILED, out.request_id, out.finish_reason))
        if seq.finish_reason != HANDOVER:
            engine.core.release(out.request_id)
    return replies


def _flush(sink: EventList, conn, index: int) -> None:
    """The engine's events since the last flush, for the decode side's tracer (named: prefill `index`)."""
    events, sink.events = sink.events, []
    out = []
    for e in events:
        if e.type in DROPPED_EVENTS:
            continue
        data = dict(e.data)
        data["engine"], data["engine_index"] = "prefill", index
        out.append((PREFILL_POOL_EVENT if e.type == "kv.pool" else e.type, e.request_id, e.step, data, e.ts))
    if out:
        conn.send((EVENTS, out))
