"""Stages 9-10: the streamed answer with per-token timing; the stop reason and usage."""
from __future__ import annotations

from typing import Callable, Sequence

from visualizers import i18n
from visualizers._html import bold, esc, fmt_ms, panel, said_html, show_piece
from visualizers.char_runs import label_title, piece_text, run_html
from visualizers.own_times import own_times
from visualizers.token_chars import group

MAX_TIMED = 64  # newest tokens drawn with their latency bar (the text above is always whole): the answer is
# redrawn ten times a second, so its size must not grow with the answer's length
# what the answer panel says next to the text, by the request's state
STATE_BADGES = {"streaming": ("tt-live", i18n.N_("● streaming")),
                "replay": ("tt-live tt-replay", i18n.N_("◷ not finished at this step"))}


def _badge(state: str, lang: str) -> str:
    if state not in STATE_BADGES:
        return ""
    cls, words = STATE_BADGES[state]
    return f"<span class='{cls}'>{said_html(lang, words)}</span>"


def no_text(token: dict, last_of_a_stop: bool, piece: Callable[[int], str] | None = None,
            lang: str = i18n.DEFAULT) -> str:
    """A streamed token with no text of its own: the end-of-turn token that stopped the answer
    (the model's special token: not part of the text), or a byte of a character still incomplete,
    shown as its bytes (<0xF0>: piece gives a token's label). Named, never a bare dot a learner
    cannot read."""
    label = piece(token["token_id"]) if piece and not last_of_a_stop and token.get("token_id") is not None else ""
    if "<0x" in label:
        title = i18n.gettext(lang, "id {id}: a piece of a character, whose text comes with the token that completes "
                                   "it", id=str(token['token_id']))
        return f"<i class='tt-notext' title='{esc(title)}'>{esc(label)}</i>"
    tid = esc(token.get('token_id'))
    what = said_html(lang, "(end of turn, id {id})", id=tid) if last_of_a_stop else \
        said_html(lang, "(no text, id {id})", id=tid)
    return f"<i class='tt-notext'>{what}</i>"


def answer_html(tokens: Sequence[dict], finish: dict | None = None, error: str | None = None,
                state: str | None = None, note: str = "", piece: Callable[[int], str] | None = None,
                lang: str = i18n.DEFAULT) -> str:
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
    peak = max(lat[1:], default=0) or (lat[0] if lat and lat[0] > 0 else 1.0)
    ended_by_eos = finish is not None and finish.get("reason") == "stop"
    chips = _timed_chips(tokens[-MAX_TIMED:], peak, ended_by_eos, piece, lang)
    stats = _stats(tokens, finish, lang)
    if state == "idle":
        stats.append(said_html(lang, "no request yet: press Send, or Watch API requests"))
    err = f"<div class='tt-err'>{esc(error)}</div>" if error else ""  # the API's words, as it gave them
    legend = ""
    if tokens:
        shown = said_html(lang, "the newest {k} of {n} tokens", k=str(MAX_TIMED), n=str(len(tokens))) \
            if len(tokens) > MAX_TIMED else said_html(lang, "each token")
        slowest = said_html(lang, ", the slowest after the first") if len(lat) > 1 else ""
        legend = ("<div class='tt-lat-legend'><span class='tt-lat-key'></span> " + said_html(
            lang, "orange bar: the time since the previous token (full height = {peak}{slowest}); {shown}; hover a "
                  "token for its timing", peak=esc(fmt_ms(peak)), slowest=slowest, shown=shown) + "</div>")
    note_html = f"<div class='tt-note tt-level-note'>{esc(note)}</div>" if note else ""
    return panel(i18n.gettext(lang, "Answer"), f"{err}<div class='tt-answer'>{esc(text)}{_badge(state, lang)}</div>"
                 f"<div class='tt-lines'><div>{' · '.join(stats)}</div>{note_html}</div>"
                 f"{legend}<div class='tt-chips tt-timing'>{chips}</div>")


def _stats(tokens: Sequence[dict], finish: dict | None, lang: str) -> list[str]:
    """The answer's numbers: tokens, the first token's time, the pace after it, how it ended."""
    stats = []
    if tokens:
        stats.append(said_html(lang, "tokens: {n}", n=bold(len(tokens))))
        stats.append(said_html(lang, "first token at {t}", t=bold(fmt_ms(tokens[0]['t']))))
        if len(tokens) > 1:
            span = tokens[-1]["t"] - tokens[0]["t"]
            rate = said_html(lang, " ({rate} tokens/s)", rate=format((len(tokens) - 1) / span, ".1f")) if span > 0 else ""
            stats.append(said_html(lang, "then {t} per token{rate}", t=fmt_ms(span / (len(tokens) - 1)), rate=rate))
    own = own_times(finish)
    if own is not None:  # the times above are the stream's; watching's share said apart
        added = fmt_ms(own.added)
        stats.append(said_html(lang, "the engine's own: first token at {t}, then {per} per token (tracing added {added})",
                               t=fmt_ms(own.ttft), per=fmt_ms(own.per_token), added=added) if own.per_token is not None
                     else said_html(lang, "the engine's own: first token at {t} (tracing added {added})",
                                    t=fmt_ms(own.ttft), added=added))
    if finish is not None:
        reason = esc(finish.get("reason") or "unknown")  # the API's finish_reason: stop, length, abort
        u = finish.get("usage")
        usage = said_html(lang, " · usage: {prompt} prompt + {completion} completion ({cached} cached)",
                          prompt=str(u['prompt_tokens']), completion=str(u['completion_tokens']),
                          cached=str(u['cached_tokens'])) if u else said_html(lang, " · usage: not known")
        stats.append(said_html(lang, "finished: {reason}{usage}", reason=bold(reason), usage=usage))
    return stats


def _timed_chip(t: dict, peak: float, text: str, more: str = "", lang: str = i18n.DEFAULT) -> str:
    title = i18n.gettext(lang, "token {index} · id {id} · at {t} ms · +{latency} ms", index=str(t["index"]),
                         id=str(t["token_id"]), t=format(t["t"] * 1000, ".0f"),
                         latency=format(t["latency"] * 1000, ".1f"))
    return (f'<span class="tt-chip tt-timed" title="{esc(title)}{esc(more)}"><span class="tt-lat" '
            f'style="height:{min(1, t["latency"] / peak) * 100:.0f}%"></span>{text}</span>')


def _timed_chips(shown: Sequence[dict], peak: float, ended_by_eos: bool,
                 piece: Callable[[int], str] | None, lang: str = i18n.DEFAULT) -> str:
    """Each token with its latency bar; the pieces of a character split into byte pieces under
    that character's box, each with its bytes (char_runs)."""
    def plain(t: dict) -> str:
        last_stop = ended_by_eos and t is shown[-1]
        return _timed_chip(t, peak, show_piece(t["text"]) if t["text"] else no_text(t, last_stop, piece, lang),
                           lang=lang)
    if piece is None or not any("<0x" in piece(t["token_id"]) for t in shown if t.get("token_id") is not None):
        return "".join(plain(t) for t in shown)
    labels = [piece(t["token_id"]) if t.get("token_id") is not None else t["text"] for t in shown]
    runs, run_of = group(labels, [ended_by_eos and i == len(shown) - 1 for i in range(len(shown))])
    out = []
    for run in runs:
        if not run.joined and all(c.valid for c in run.chars):
            out.append(plain(shown[run.first]))
            continue
        out.append(run_html(run, [_timed_chip(shown[j], peak, piece_text(run, j),
                                              " · " + label_title(labels, j, lang=lang), lang)
                                  for j in range(run.first, run.last + 1)], lang))
    return "".join(out)
