"""The one thread that writes to the database, fed by a queue: the engine thread and the
event loop only put a job in (a request id and what to do), never wait on a disk or a socket.

A job that fails on the database (a PostgreSQL stopped, a disk full) stays first in the queue
and is tried again every RETRY_S seconds; meanwhile the server serves from memory and says so
(one log line, and /healthz's "database"), and when the database answers again the queued
writes go in, in order, with one more line. Past MAX_PENDING jobs the oldest are dropped (and
counted): memory is what the server keeps while the database is gone."""
from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable

from sqlalchemy.exc import DBAPIError, OperationalError

from app.store.repository import TraceRepository

log = logging.getLogger("tokentrace.db")
RETRY_S = 1.0
MAX_PENDING = 10_000
Job = Callable[[TraceRepository], None]


class TraceWriter:
    def __init__(self, repo: TraceRepository, where: str, retry_s: float = RETRY_S) -> None:
        self.repo, self.where, self.retry_s = repo, where, retry_s
        self.error: str | None = None  # the database's last failure while it is down; None when up
        self.down_since: float | None = None
        self.lost = 0  # jobs dropped past MAX_PENDING while it was down
        self.failed = 0  # jobs that failed for another reason (a bug): logged, dropped
        self._jobs: deque[Job] = deque()
        self._cv = threading.Condition()
        self._busy = False
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="trace-db-writer", daemon=True)
        self._thread.start()

    def put(self, job: Job) -> None:
        with self._cv:
            self._jobs.append(job)
            if len(self._jobs) > MAX_PENDING:
                self._jobs.popleft()
                self.lost += 1
            self._cv.notify_all()

    @property
    def pending(self) -> int:
        with self._cv:
            return len(self._jobs) + self._busy

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every job put so far is written (False: not within timeout, e.g. it is down)."""
        end = time.monotonic() + timeout
        with self._cv:
            while self._jobs or self._busy:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.05))
            return True

    def close(self, timeout: float = 5.0) -> None:
        self.flush(timeout)
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._stop:
                    self._cv.wait()
                if not self._jobs:
                    return
                job, self._busy = self._jobs[0], True
            ok = self._run(job)
            with self._cv:
                if ok and self._jobs and self._jobs[0] is job:
                    self._jobs.popleft()
                self._busy = False
                self._cv.notify_all()
                if not ok:
                    self._cv.wait(self.retry_s)  # the database is down: try again soon (or at close)
                    if self._stop:
                        return

    def _run(self, job: Job) -> bool:
        """True when the job is done with (written, or dropped as a bug); False: try again."""
        try:
            job(self.repo)
        except (OperationalError, DBAPIError) as e:
            if getattr(e, "connection_invalidated", False) or isinstance(e, OperationalError):
                self._down(e)
                return False
            self.failed += 1
            log.exception("trace database: a write failed and was dropped")
            return True
        except Exception:  # noqa: BLE001 - a bug in one job must not stop the writes after it
            self.failed += 1
            log.exception("trace database: a write failed and was dropped")
            return True
        if self.error is not None:
            log.warning("trace database %s is back after %.0f s: writes resumed (%d queued)", self.where,
                        time.time() - (self.down_since or time.time()), len(self._jobs))
            self.error, self.down_since = None, None
        return True

    def _down(self, e: Exception) -> None:
        first = self.error is None
        self.error = " ".join(str(getattr(e, "orig", None) or e).split())[:300]
        if first:
            self.down_since = time.time()
            log.warning("trace database %s is unreachable: serving from memory, writes queued until it is back "
                        "(%s)", self.where, self.error)
