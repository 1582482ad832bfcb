"""Static batching: the policy continuous batching replaced, kept to measure against.

A batch forms when the engine holds no running request: the first `max_num_seqs` waiting
requests become its members. Members are admitted (their prefills may take several steps
under the token budget) and run until the longest of them ends; no other request joins,
so a member that finishes early leaves its slot idle until the whole batch is done.
"""
from __future__ import annotations

from collections import deque

from engine.sequence import Sequence


class StaticBatch:
    """Which waiting requests the scheduler may admit under static batching."""

    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.members: set[str] = set()  # the batch now running: request ids

    def may_admit(self, seq: Sequence, running: list[Sequence], waiting: deque[Sequence]) -> bool:
        live = any(s.request_id in self.members for s in running) or \
            any(s.request_id in self.members for s in waiting)
        if not live:  # the last batch has ended (or none began): the next one forms now
            self.members = {s.request_id for s in list(waiting)[:self.max_num_seqs]}
        return seq.request_id in self.members
