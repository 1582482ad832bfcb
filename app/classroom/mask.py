"""What a class may see before it has guessed: the recording as it stood before the engine drew
the token the question asks about.

Every stage (its words, its panels, the map's chips) is rendered from this cut recording, so
no panel can show the hidden token or its rank, whatever it draws: the tokens list, the
answer, the lens, the sampling table, the attention axes all end before it. The cut is an
engine step (a step's tensors belong to all the tokens it produced); of the step that drew
the hidden token, its inputs' captures are kept when they all came before it, and the streamed
tokens before it (a verify step releases several).

The cut recording ends with a note of the cut (CUT, a "trace.cut" event) that the stage
functions read (visualizers/stages/facts.py): what the class sees is the request up to the
hidden token, not a request still running, so the words say "the answer from position N is
hidden until the reveal" (once a question is set), "the stream ended" (the request had), and
count steps and speculative rounds up to the cut."""
from __future__ import annotations

from dataclasses import replace

from app.serving.recording import Recording


def prompt_tokens(rec: Recording) -> int:
    tok = next((e for e in rec.events if e["type"] == "tokenize"), None)
    if tok is not None:
        return int(tok["count"])
    usage = next((o.get("usage") for o in reversed(rec.outputs) if o.get("usage")), None) or {}
    return int(usage.get("prompt_tokens") or 0)


def generated(rec: Recording) -> list[dict]:
    return [o for o in rec.outputs if o.get("token_id", -1) >= 0]


def first_answer_position(rec: Recording) -> int:
    """The position of the first generated token (the question's default)."""
    return prompt_tokens(rec)


CUT = "trace.cut"  # the note a cut recording ends with
REVEALING = ("sample", "logit_lens", "spec", "finish")  # a pass's outputs: what it drew and how sure it was


def ended(rec: Recording) -> bool:
    """Had the request finished when the room read it?"""
    return any(e["type"] == "finish" for e in rec.events) or bool(rec.outputs and rec.outputs[-1].get("finished"))


def hide_from(rec: Recording, position: int, asked: bool = False) -> Recording:
    """rec cut before the engine drew the token at `position` (a position past the answer, or
    one the request has not reached: rec unchanged). The pass that drew it keeps its inputs'
    captures (embedding rows, attention, routing, KV) when every input came before it (a
    prefill, a plain decode step); a verify pass also read the draft's proposals, the hidden
    token among them when it was kept, so only the streamed tokens before it stay of that step.
    asked: a question set that position (the note says so; else the cut is the default one,
    before the first answer token)."""
    index = position - prompt_tokens(rec)  # its index in the answer
    gen = generated(rec)
    if not 0 <= index < len(gen):
        return rec
    step = gen[index]["step"]
    inputs = [x for e in rec.events if e["type"] == "schedule.step" and e["step"] == step
              for x in e["batch"] if x["request_id"] == rec.request_id]
    reads_before = bool(inputs) and all(x["start"] + x["num_tokens"] <= position for x in inputs)

    def shown(item: dict) -> bool:
        if item["step"] != step:
            return item["step"] < step
        t = item.get("type")
        if t in ("token", "output"):
            return item.get("token_id", -1) >= 0 and item.get("index", index) < index
        if t in REVEALING:
            return reads_before and t in ("sample", "logit_lens") and item["position"] < position
        return reads_before
    # an n > 1 request's other choices: only their tokens drawn before that step, at earlier answer
    # indices (a greedy or same-seeded choice draws the hidden token too, at the same index)
    choices = [[o for o in outs if o["step"] < step and (o.get("token_id", -1) < 0 or o.get("index", index) < index)]
               for outs in rec.choices]
    events, outputs = [e for e in rec.events if shown(e)], [o for o in rec.outputs if shown(o)]
    # the note's step: the last one kept (a step of its own would add a replay frame with nothing in it)
    last = max((i["step"] for i in events + outputs), default=step)
    note = {"type": CUT, "request_id": rec.request_id, "step": last, "position": position, "asked": asked,
            "ended": ended(rec), "drawn_at": step}  # drawn_at: the step that drew the hidden token
    return replace(rec, events=events + [note], outputs=outputs, choices=choices)
