"""The ranks' process group and the collectives the sharded model calls.

Each engine gets a private group (its own TCPStore and ProcessGroupGloo / ProcessGroupNCCL)
rather than torch.distributed's default group, so a process can hold several sharded
engines one after another (tests, the app's model switch) and the default group stays
free for whoever else uses it. Every collective is timed and logged with its layer, so
the trace can show what crossed between ranks in a step and how long each rank waited.
"""
from __future__ import annotations

import datetime
import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

WATCH_S = datetime.timedelta(seconds=0.5)


@dataclass
class Collective:
    kind: str  # "all_reduce" | "broadcast" | "all_gather"
    layer: int | None  # None: not inside a layer (the step's batch broadcast)
    what: str  # "attention" (after o_proj) | "mlp" (after down_proj) | "moe" | "batch"
    bytes: int  # payload of one rank
    ms: float
    start: float = 0.0  # perf_counter when this rank entered it


@dataclass
class Comm:
    rank: int
    world_size: int
    group: object  # ProcessGroupGloo | ProcessGroupNCCL
    device: torch.device
    log: list[Collective] = field(default_factory=list)  # this step's collectives
    record: bool = True
    # called every WATCH_S while a gloo collective waits; raises when a rank's process is gone.
    # gloo alone may wait out its whole timeout (10 minutes) for a peer killed mid-step
    watch: Callable[[], None] | None = None

    @classmethod
    def connect(cls, host: str, port: int, rank: int, world_size: int, device: torch.device,
                timeout_s: float = 300.0) -> "Comm":
        """rank 0 hosts the store (port 0: pick a free one, read it back as comm.port)."""
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout)
        return cls.connect_with_store(store, rank, world_size, device, timeout_s)

    @classmethod
    def connect_with_store(cls, store, rank: int, world_size: int, device: torch.device,
                           timeout_s: float = 300.0, prefix: str = "tokentrace") -> "Comm":
        """`prefix`: the group's keys in the store (torchrun: one store, a prefix per engine)."""
        timeout = datetime.timedelta(seconds=timeout_s)
        if device.type == "cuda":
            group = dist.ProcessGroupNCCL(dist.PrefixStore(prefix, store), rank, world_size)
        else:
            group = dist.ProcessGroupGloo(dist.PrefixStore(prefix, store), rank, world_size, timeout)
        comm = cls(rank, world_size, group, device)
        comm.store, comm.port = store, getattr(store, "port", None)  # a PrefixStore has none
        return comm

    @classmethod
    def connect_watching(cls, store, rank: int, world_size: int, device: torch.device, timeout_s: float,
                         check: Callable[[], None]) -> "Comm":
        """connect_with_store, while `check` (raises when a rank's process is gone) is called
        every 0.1 s. gloo's connect blocks in C++ until every rank joined or timeout_s passed
        (10 minutes at start-up), and a Ctrl-C is only seen after it: a rank that died before
        joining (Ctrl-C during its start-up, a crash) would hold this process that long. So
        the connect runs on a thread of its own; this one watches. On a failure the thread is
        left to its timeout (daemon: the caller stops the ranks; its error goes nowhere)."""
        done: list = []

        def connect() -> None:
            try:
                done.append(cls.connect_with_store(store, rank, world_size, device, timeout_s))
            except BaseException as e:  # noqa: BLE001 - raised on the caller's thread below
                done.append(e)
        t = threading.Thread(target=connect, name="tokentrace-connect", daemon=True)
        t.start()
        while t.is_alive():
            check()
            t.join(0.1)
        if isinstance(done[0], BaseException):
            raise done[0]
        return done[0]

    def _wait(self, work) -> None:
        if self.watch is None or self.device.type == "cuda":
            work.wait()
            return
        while True:
            try:
                work.wait(WATCH_S)
                return
            except RuntimeError as e:
                if "Operation timed out" not in str(e):  # gloo's own error (a peer's socket closed)
                    raise
                self.watch()

    def _timed(self, kind: str, layer: int | None, what: str, nbytes: int, work) -> None:
        t = time.perf_counter()
        self._wait(work())
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self.record:
            self.log.append(Collective(kind, layer, what, nbytes, (time.perf_counter() - t) * 1e3, t))

    def all_reduce(self, x: torch.Tensor, layer: int | None = None, what: str = "") -> torch.Tensor:
        """Sum x over the ranks, in place (every rank ends with the sum)."""
        x = x.contiguous()
        self._timed("all_reduce", layer, what, x.numel() * x.element_size(), lambda: self.group.allreduce([x]))
        return x

    def broadcast_object(self, obj) -> object:
        """rank 0's obj on every rank (others pass None): its pickled length, then the bytes."""
        if self.rank == 0:
            data = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
            size = torch.tensor([data.numel()], dtype=torch.long)
        else:
            size = torch.zeros(1, dtype=torch.long)
        size = size.to(self.device)
        self._wait(self.group.broadcast(size, 0))
        if self.rank != 0:
            data = torch.empty(int(size.item()), dtype=torch.uint8)
        data = data.to(self.device)
        self._timed("broadcast", None, "batch", data.numel() + 8, lambda: self.group.broadcast(data, 0))
        return obj if self.rank == 0 else pickle.loads(data.cpu().numpy().tobytes())

    def gather_floats(self, values: list[float]) -> list[list[float]]:
        """Every rank's list (same length on each) on every rank: [rank][i]."""
        x = torch.tensor(values, dtype=torch.float64, device=self.device)
        out = [torch.empty_like(x) for _ in range(self.world_size)]
        self._wait(self.group.allgather([out], [x]))
        return [o.tolist() for o in out]

    def gather_timings(self, log: list[Collective]) -> tuple[list[list[float]], list[list[float]]]:
        """Every rank's milliseconds in each collective of the step, and when it entered each
        (ms after it left the first: the batch broadcast, which all ranks leave together, so the
        ranks' times line up): ([rank][i], [rank][i]). Every rank calls it with its log of the
        same collectives."""
        n = len(log)
        t0 = log[0].start + log[0].ms / 1e3 if log else 0.0
        both = self.gather_floats([c.ms for c in log] + [(c.start - t0) * 1e3 for c in log])
        return [r[:n] for r in both], [r[n:] for r in both]

    def take_log(self) -> list[Collective]:
        log, self.log = self.log, []
        return log
