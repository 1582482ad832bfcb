"""Stages 9-10: the streamed answer with per-token timing; the stop reason and usage."""
from __future__ import annotations

from typing import Callable, Sequence

from visualizers._html import esc, fmt_ms, panel, show_piece
from visualizers.char_runs import label_title, piece_text, run_html
from visualizers.token_chars import group

MAX_TIMED = 64  # newest tokens drawn with their latency bar (the text above is always whole): the answer is
# redrawn ten times a second, so its size must not grow with the answer's length
# what the answer panel says next to the text, by the request's state
STATE_BADGES = {"streaming": "<span class='tt-live'>● streaming</span>",
                "replay": "<span class='tt-live tt-replay'>◷ not finished at this step</span>",
                "idle": "", "done": ""}


def no_text(token: dict, last_of_a_stop: bool, piece: Callable[[int], str] | None = None) -> str:
    """A streamed token with no text of its own: the end-of-turn token that stopped the answer
    (the model's special token: not part of the text), or a byte of a character still incomplete,
    shown as its bytes (<0xF0>: piece gives a token's label). Named, never a bare dot a learner
    cannot read."""
    label = piece(token["token_id"]) if piece and not last_of_a_stop and token.get("token_id") is not None else ""
    if "<0x" in label:
        return (f"<i class='tt-notext' title='id {esc(token['token_id'])}: a piece of a character, whose text "
                f"comes with the token that completes it'>{esc(label)}</i>")
    what = "end of turn" if last_of_a_stop else "no text"
    return f"<i class='tt-notext'>({what}, id {esc(token.get('token_id'))})</i>"


def answer_html(tokens: Sequence[dict], finish: dict | None = None, error: str | None = None,
                state: str | None = None, note: str = "", piece: Callable[[int], str] | None = None) -> str:
    """tokens: {"index", "token_id", "text", "t" (s since arrival), "latency"} per streamed token;
    finish: the `finish` event, or what the request's last output says ({"reason", "usage"});
    state: "idle" (nothing sent yet), "streaming", "replay" (a recording before its end) or
    "done"; by default "done" once there is a finish or an error, else "streaming";
    note: a line under the stats (e.g. what the capture level left out); piece: a token id's label
    (its bytes where it is a piece of a character)."""
    state = state or ("done" if finish is not None or error else "streaming")
    text = "".join(t["text"] for t in tokens)
    if finish is not None and finish.get("text") is not None:
        text = finish["text"]
    lat = [t["latency"] for t in tokens]
    # bar heights are relative to the slowest token after the first (the first one's wait, its TTFT,
    # would flatten every other bar: it is capped at full height)
    peak = max(lat[1:], default=0) or (lat[0] if lat and lat[0] > 0 else 1.0)
    ended_by_eos = finish is not None and finish.get("reason") == "stop"
    chips = _timed_chips(tokens[-MAX_TIMED:], peak, ended_by_eos, piece)
    stats = []
    if tokens:
        stats.append(f"tokens: <b>{len(tokens)}</b>")
        stats.append(f"first token at <b>{fmt_ms(tokens[0]['t'])}</b>")
        if len(tokens) > 1:
            span = tokens[-1]["t"] - tokens[0]["t"]
            rate = f" ({(len(tokens) - 1) / span:.1f} tokens/s)" if span > 0 else ""
            stats.append(f"then {fmt_ms(span / (len(tokens) - 1))} per token{rate}")
    if finish is not None:
        reason = esc(finish.get("reason") or "unknown")
        u = finish.get("usage")
        usage = (f" · usage: {u['prompt_tokens']} prompt + {u['completion_tokens']} completion "
                 f"({u['cached_tokens']} cached)" if u else " · usage: not known")
        stats.append(f"finished: <b>{reason}</b>{usage}")
    if state == "idle":
        stats.append("no request yet: press Send, or Watch API requests")
    err = f"<div class='tt-err'>{esc(error)}</div>" if error else ""
    legend = ""
    if tokens:
        shown = f"the newest {MAX_TIMED} of {len(tokens)} tokens" if len(tokens) > MAX_TIMED else "each token"
        legend = (f"<div class='tt-lat-legend'><span class='tt-lat-key'></span> orange bar: the time "
                  f"since the previous token (full height = {esc(fmt_ms(peak))}"
                  f"{', the slowest after the first' if len(lat) > 1 else ''}); {shown}; hover a token for its "
                  "timing</div>")
    note_html = f"<div class='tt-note tt-level-note'>{esc(note)}</div>" if note else ""
    return panel("Answer", f"{err}<div class='tt-answer'>{esc(text)}{STATE_BADGES.get(state, '')}</div>"
                 f"<div class='tt-lines'><div>{' · '.join(stats)}</div>{note_html}</div>"
                 f"{legend}<div class='tt-chips tt-timing'>{chips}</div>")


def _timed_chip(t: dict, peak: float, text: str, more: str = "") -> str:
    return (f'<span class="tt-chip tt-timed" title="token {t["index"]} · id {t["token_id"]} · at {t["t"] * 1000:.0f} ms'
            f' · +{t["latency"] * 1000:.1f} ms{esc(more)}"><span class="tt-lat" '
            f'style="height:{min(1, t["latency"] / peak) * 100:.0f}%"></span>{text}</span>')


def _timed_chips(shown: Sequence[dict], peak: float, ended_by_eos: bool,
                 piece: Callable[[int], str] | None) -> str:
    """Each token with its latency bar; the pieces of a character split into byte pieces under
    that character's box, each with its bytes (char_runs)."""
    def plain(t: dict) -> str:
        last_stop = ended_by_eos and t is shown[-1]
        return _timed_chip(t, peak, show_piece(t["text"]) if t["text"] else no_text(t, last_stop, piece))
    if piece is None or not any("<0x" in piece(t["token_id"]) for t in shown if t.get("token_id") is not None):
        return "".join(plain(t) for t in shown)
    labels = [piece(t["token_id"]) if t.get("token_id") is not None else t["text"] for t in shown]
    runs, run_of = group(labels, [ended_by_eos and i == len(shown) - 1 for i in range(len(shown))])
    out = []
    for run in runs:
        if not run.joined and all(c.valid for c in run.chars):
            out.append(plain(shown[run.first]))
            continue
        out.append(run_html(run, [_timed_chip(shown[j], peak, piece_text(run, j), " · " + label_title(labels, j))
                                  for j in range(run.first, run.last + 1)]))
    return "".join(out)
