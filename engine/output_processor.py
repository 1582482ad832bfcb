"""Output processing: what a new token does to its request, and what the client is told.

A token is appended and detokenized, then checked against the stop conditions (a stop or
EOS token, a stop string, the grammar's end, max_tokens, the context); while the request
goes on it is streamed as a TokenOutput whose text holds back the characters that might
begin a stop string; at the end the text is flushed and the request's metrics (TTFT and
its split, per-token latencies) are read from its times.

vLLM v1 splits the same way: its output processor detokenizes, checks stop strings and
builds the outputs, and the engine core frees what a finished request held. Here too the
engine does that part (LLMEngine._finish: blocks, proposer state, the request table, the
`finish` event), since it owns those parts; nothing here changes a scheduler or a pool.
"""
from __future__ import annotations

import time
from typing import Callable

from engine.outputs import RequestOutput, TokenOutput, Usage
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.trace import events
from engine.trace.events import Event


class OutputProcessor:
    """One engine's: its end-of-sequence tokens and context, and the engine's emit (called
    for traced requests only). A prefill engine's stops every request after its first token
    (engine/disagg/prefill.py)."""

    def __init__(self, eos_token_ids: list[int], max_model_len: int, emit: Callable[[Event], None]) -> None:
        self.eos_token_ids, self.max_model_len, self.emit = eos_token_ids, max_model_len, emit

    def append(self, seq: Sequence, token: int, now: float) -> str | None:
        """The token appended (the grammar advanced, its time kept, its text decoded) -> why
        the request stops here, or None."""
        seq.token_ids.append(token)
        if seq.grammar is not None:
            seq.grammar.accept(token)
        seq.token_times.append(now)
        seq.text += seq.detokenizer.push(token)
        return self.stop_reason(seq, token)

    def stop_reason(self, seq: Sequence, token: int) -> str | None:
        p = seq.params
        if self._stop_token(p, token):
            return "stop"
        for stop in p.stop:
            idx = seq.text.find(stop)
            if idx != -1:
                seq.text = seq.text[: idx + (len(stop) if p.include_stop_str_in_output else 0)]
                seq.stopped_by_string = True
                return "stop"
        if seq.grammar is not None and seq.grammar.finished:  # the grammar took its end (ignore_eos included)
            return "stop"
        if self._full(seq, 0):
            return "length"
        return None

    def _stop_token(self, p: SamplingParams, token: int) -> bool:
        return (not p.ignore_eos and token in self.eos_token_ids) or token in p.stop_token_ids

    def _full(self, seq: Sequence, more: int) -> bool:
        """max_tokens or the context reached with `more` tokens after those appended."""
        return seq.num_output_tokens + more >= seq.params.max_tokens or len(seq) + more >= self.max_model_len

    def surely_ends(self, seq: Sequence, tokens: list[int]) -> bool:
        """Whether appending these tokens ends the request for a reason known before their text
        (an end-of-sequence or stop token, max_tokens, the context): a stop string or a grammar's end
        is found only as they are appended."""
        return any(self._stop_token(seq.params, t) for t in tokens) or self._full(seq, len(tokens))

    def stream(self, seq: Sequence, token: int, step: int) -> TokenOutput:
        """A token of a request that goes on: its text less what might begin a stop string."""
        return self.token_output(seq, token, len(seq.text) - holdback(seq), step)

    def token_output(self, seq: Sequence, token: int, visible: int, step: int) -> TokenOutput:
        """The new text up to `visible` characters (what was not streamed yet), as a TokenOutput."""
        delta = seq.text[seq.streamed_chars:max(visible, seq.streamed_chars)]
        seq.streamed_chars += len(delta)
        out = TokenOutput(seq.request_id, token, delta, seq.num_output_tokens - 1,
                          seq.token_times[-1] - seq.arrival_time, seq.finish_reason is not None, seq.finish_reason,
                          step=step)
        if seq.traced:
            self.emit(events.token(seq, out))
        return out

    @staticmethod
    def end(seq: Sequence, reason: str) -> None:
        """The request ends: the detokenizer's last characters (unless a stop string cut the
        text) and its finish reason."""
        if not seq.stopped_by_string:
            seq.text += seq.detokenizer.flush()
        seq.finish_reason = reason

    def last_output(self, seq: Sequence, token: int | None, step: int) -> TokenOutput:
        """An ended request's last output: its last token with the rest of its text, or, when
        it ended without one (an abort, no room), an output with no token."""
        if token is not None:
            return self.token_output(seq, token, len(seq.text), step)
        return TokenOutput(seq.request_id, -1, "", seq.num_output_tokens, time.perf_counter() - seq.arrival_time,
                           True, seq.finish_reason, step=step)


def holdback(seq: Sequence) -> int:
    """Characters not streamed yet because they might begin a stop string."""
    return max((len(s) - 1 for s in seq.params.stop), default=0)


def request_metrics(seq: Sequence) -> dict:
    """TTFT and its split (tokenize, queue, prefill, first sample, and a handed-over first
    token's kv_transfer), each token's latency; a traced request's share of these that was
    the trace's own work (trace_seconds)."""
    if not seq.first_token_time:
        return {"preemptions": seq.num_preemptions}
    times = [seq.first_token_time] + seq.token_times[1:]
    split = {"tokenize": seq.tokenized_time - seq.arrival_time, "queue": seq.first_scheduled_time - seq.tokenized_time,
             "prefill": seq.prefill_done_time - seq.first_scheduled_time,
             "first_sample": seq.first_token_time - seq.prefill_done_time}
    if seq.first_token_drawn_time:  # drawn by a prefill engine, then handed over here
        split["first_sample"] = seq.first_token_drawn_time - seq.prefill_done_time
        split["kv_transfer"] = seq.first_token_time - seq.first_token_drawn_time
    out = {"ttft": seq.first_token_time - seq.arrival_time, "ttft_split": split,
           "token_latencies": [b - a for a, b in zip(times, times[1:])], "preemptions": seq.num_preemptions}
    clock = seq.trace_clock  # a traced request's (a first token drawn elsewhere has none here)
    if len(clock) == len(times) + 1:  # of each time above, the engine's tracing work: what watching added
        out["trace_seconds"] = {"ttft": clock[1] - clock[0],
                                "token_latencies": [b - a for a, b in zip(clock[1:], clock[2:])]}
    return out


def request_output(seq: Sequence, metrics: dict) -> RequestOutput:
    """A request as get_output reads it: its prompt, tokens, text, finish reason and usage."""
    return RequestOutput(
        request_id=seq.request_id, prompt=seq.prompt, prompt_token_ids=list(seq.prompt_token_ids),
        token_ids=list(seq.output_token_ids), text=seq.text, finish_reason=seq.finish_reason,
        usage=Usage(seq.num_prompt_tokens, seq.num_output_tokens, seq.num_cached_tokens), metrics=metrics)
