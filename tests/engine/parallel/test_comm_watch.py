"""A collective that waits on a rank which will not come: the Comm's watch decides (gloo's
own wait is 10 minutes and, for a peer killed mid-step, has been seen to wait all of it)."""
import datetime
import threading
import time

import pytest
import torch
import torch.distributed as dist

from engine.parallel.comm import Comm


class RankGone(Exception):
    pass


def _pair(watch) -> tuple[Comm, Comm]:
    """Two ranks of one gloo group, each on a thread of this process."""
    store = dist.HashStore()
    comms: dict[int, Comm] = {}

    def join(rank: int) -> None:
        group = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=60))
        comms[rank] = Comm(rank, 2, group, torch.device("cpu"))
    threads = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    comms[0].watch = watch
    return comms[0], comms[1]


def test_a_collective_waiting_on_a_silent_rank_ends_when_the_watch_raises():
    calls = []

    def watch() -> None:
        calls.append(time.monotonic())
        if len(calls) == 2:
            raise RankGone("rank 1 exited")
    rank0, rank1 = _pair(watch)  # rank 1 has not entered the collective
    t = time.monotonic()
    with pytest.raises(RankGone):
        rank0.all_reduce(torch.ones(4), 0, "mlp")
    assert len(calls) == 2 and time.monotonic() - t < 5
    rank1.all_reduce(torch.ones(4), 0, "mlp")  # ends gloo's half of it: the group can be freed


def test_a_slow_rank_is_waited_for_and_the_sum_is_right():
    calls = []
    rank0, rank1 = _pair(lambda: calls.append(1))
    late = threading.Timer(1.2, lambda: rank1.all_reduce(torch.full((4,), 2.0), 0, "mlp"))
    late.start()
    out = rank0.all_reduce(torch.ones(4), 0, "mlp")
    late.join()
    assert out.tolist() == [3.0] * 4 and len(calls) >= 2  # watched while it waited, then done
