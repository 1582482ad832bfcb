"""Stage 8: sampling: the top candidates before and after each stage of the chain (a
structured output's grammar mask, min_tokens, the logit bias, the repetition, frequency and
presence penalties, then temperature, top-k, top-p and min-p), how many tokens survive each
cut, what each stage before temperature changed (which tokens' logits moved, by how much),
and the token drawn. A click on a candidate's token biases it in the next request (the page's
logit-bias control)."""
from __future__ import annotations

from typing import Mapping, Sequence

from visualizers._html import bar, empty, esc, panel, piece_text, prob, show_piece
from visualizers.selection import Selection, header_html

STAGE_LABELS = {"logits": "softmax(logits)", "grammar": "grammar mask", "min_tokens": "min_tokens",
                "logit_bias": "logit bias", "repetition_penalty": "repetition penalty",
                "frequency_penalty": "frequency penalty", "presence_penalty": "presence penalty",
                "temperature": "÷ temperature", "top_k": "top-k", "top_p": "top-p", "min_p": "min-p"}
# what each stage before temperature does to the logits (engine/penalties.py), for its row of changes
DOES = {"grammar": "sets every token the grammar forbids next to −∞",
        "min_tokens": "masks the stop tokens until the answer has its minimum length",
        "logit_bias": "adds the request's bias to those tokens' logits",
        "repetition_penalty": "divides a positive logit (multiplies a negative one) of every token already in the "
                              "prompt or the answer",
        "frequency_penalty": "subtracts the penalty × how often the token is already in the answer",
        "presence_penalty": "subtracts the penalty once from every token already in the answer"}


# Where a token came from (speculative decoding gives every kept token a source).
SOURCES = {
    "target": "drawn from the target's final distribution",
    "draft": "proposed by the draft model and kept by the target's check (the target's distribution is shown)",
    "corrected": "the draft's proposal was rejected here: drawn from max(0, p − q), the target minus the draft",
    "bonus": "every proposal was kept: one more token drawn from the target",
}
PLAIN_SOURCE = "drawn from the final distribution"  # a request no draft proposed for
# The same with n-gram prompt lookup, whose proposal is a copy (q is 1 on the copied token).
NGRAM_SOURCES = {
    **SOURCES,
    "draft": "copied from earlier in the context by n-gram lookup and kept by the target's check "
             "(the target's distribution is shown)",
    "corrected": "the copied proposal was rejected here: drawn from the target with that token removed",
}


def _knob(stage: str, params: dict) -> str:
    if stage == "temperature":
        return f"T={params['temperature']:g}"
    if stage == "top_k":
        return f"k={params['top_k']}" if params["top_k"] else "off"
    if stage == "top_p":
        return f"p={params['top_p']:g}" if params["top_p"] < 1 else "off"
    if stage == "min_p":
        return f"min_p={params['min_p']:g}" if params["min_p"] else "off"
    if stage == "grammar":
        return str(params.get("structured", "")).replace("_", " ")
    if stage == "min_tokens":
        return f"≥{params.get('min_tokens', 0)}"
    if stage == "logit_bias":
        bias = params.get("logit_bias") or {}
        if len(bias) <= 3:
            return ", ".join(f"id {t} {float(b):+g}" for t, b in bias.items())
        return f"{len(bias)} tokens"
    if stage in ("repetition_penalty", "frequency_penalty", "presence_penalty"):
        return f"{'×' if stage == 'repetition_penalty' else ''}{params.get(stage, 0):g}"
    return ""


def changes_html(ev: dict, pieces: Mapping[int, str] | None, vocab_size: int | None) -> str:
    """One line per stage before temperature: what it does, how many tokens' logits it moved,
    and the largest moves (a grammar's: how many tokens it allowed, the top candidates it removed)."""
    rows = []
    for name, st in ev["stages"].items():
        if name not in DOES:
            continue
        moved, changed = int(st.get("moved", 0)), st.get("changes") or []
        removed = [c[0] for c in changed if c[1] is None]
        shifted = [c for c in changed if c[1] is not None]
        parts = []
        if name == "grammar":
            allowed = f"allowed {st['kept']:,}" + (f" of {vocab_size:,}" if vocab_size else "")
            parts.append(f"{allowed} tokens next")
        if removed:
            parts.append("removed " + ", ".join(f"<code>{show_piece(piece_text(t, pieces))}</code>" for t in removed)
                         + (" (the most likely first)" if len(removed) > 1 else ""))
        if shifted:
            parts.append(", ".join(f"<code>{show_piece(piece_text(t, pieces))}</code> {d:+.2f}" for t, d in shifted))
        what = (f"moved {moved:,} {'token' + chr(39) + 's logit' if moved == 1 else 'tokens' + chr(39) + ' logits'}"
                if moved else "moved no logit at this step")
        rows.append(f"<div class='tt-sample-change' data-stage='{esc(name)}'><b>{esc(STAGE_LABELS[name])}</b> "
                    f"({esc(_knob(name, ev['params']))}) {esc(DOES[name])}: {what}"
                    + (": " + "; ".join(parts) if parts else "") + "</div>")
    if not rows:
        return ""
    return ("<div class='tt-sample-changes'><div class='tt-subtitle'>before temperature: what each stage changed "
            "(logit change; removed: set to −∞)</div>" + "".join(rows) + "</div>")


def drawn_by(events: Sequence[dict], selection: Selection | None, what: str = "draw") -> tuple[int | None, str]:
    """The index of the event the selected pass drew (sample and lens events are keyed by the
    position of the token they produced: the pass that read p drew p + 1), or None and why not
    (HTML). No selection: the newest."""
    if selection is None or selection.read is None:
        return len(events) - 1, ""
    want = selection.read + 1
    for i in range(len(events) - 1, -1, -1):
        if events[i]["position"] == want:
            return i, ""
    if not selection.drew:
        return None, (f"the selected pass read {selection.token(selection.read)} inside the prompt: its next token "
                      f"{selection.token(want)} was the prompt's own, so nothing was drawn there (click a later token)")
    return None, f"no {what} of position {want} was recorded (the newest recorded: position {events[-1]['position']})"


def sampling_html(samples: Sequence[dict], pieces: Mapping[int, str] | None = None, step: int | None = None,
                  vocab_size: int | None = None, selection: Selection | None = None) -> str:
    """samples: this request's `sample` events; step: which one to detail (default: the
    selected pass's draw, else the newest); vocab_size: the model's (the LM head scores every
    one of them)."""
    over = f" over {vocab_size:,} vocabulary entries" if vocab_size else ""
    if not samples:
        return panel("Sampling", empty(f"no token sampled yet (the LM head will score{over or ' the vocabulary'})"))
    if step is None:
        step, why = drawn_by(samples, selection)
        if step is None:
            return ('<div class="tt-panel">' + header_html("Sampling", selection)
                    + f"<div class='tt-empty'>{why}</div></div>")
    ev = samples[step if -len(samples) <= step < len(samples) else -1]
    stages = list(ev["stages"])
    params = ev["params"]
    head = ["token", "id"] + [f"{STAGE_LABELS.get(s, s)} {_knob(s, params)}".strip() for s in stages]
    # a knob that is off repeats the column before it: a narrow screen (CSS) hides those columns
    off = {i for i, s in enumerate(stages) if _knob(s, params) == "off"}
    col = [" class='tt-off-col'" if i in off else "" for i in range(len(stages))]
    rows = []
    for j, cid in enumerate(ev["candidates"]):
        drawn = cid == ev["token_id"]
        cells = []
        for s in stages:
            p = ev["stages"][s]["probs"][j]
            cut = p == 0
            # struck through: the number only (a struck space before it would read as a minus sign)
            cells.append(f'{bar(p)} <span class="{"tt-cut" if cut else ""}">{prob(p)}</span>')
        cls = " class='tt-drawn'" if drawn else ""
        # data-bias-id: a click puts this token in the page's logit-bias control (app/page/hover.js)
        rows.append(f"<tr{cls}><td data-bias-id='{esc(cid)}' class='tt-biasable' title='click: bias this token "
                    f"in the next request (Logit bias)'>{'▶ ' if drawn else ''}"
                    f"<code>{show_piece(piece_text(cid, pieces))}</code>"
                    f"<sub class='tt-id-sub'>{esc(cid)}</sub></td><td class='tt-id'>{esc(cid)}</td>"
                    + "".join(f"<td{col[i]}>{c}</td>" for i, c in enumerate(cells)) + "</tr>")
    kept = " → ".join(f"{STAGE_LABELS.get(s, s)}: {ev['stages'][s]['kept']:,}" for s in stages)
    # a narrow screen (CSS) folds the id column into the token cell; "softmax(logits)" may break at its "("
    heads = [f"<th{' class=tt-id' if h == 'id' else (col[i - 2] if i >= 2 else '')}>"
             f"{esc(h).replace('(', '<wbr>(')}</th>" for i, h in enumerate(head)]
    hidden = [STAGE_LABELS.get(stages[i], stages[i]) for i in sorted(off)]
    narrow = (f"<div class='tt-note tt-narrow-only'>on this narrow screen the columns of the knobs that are off "
              f"({esc(', '.join(hidden))}) are hidden: they change nothing</div>" if hidden else "")
    table = (narrow + "<table class='tt-table tt-sample'><thead><tr>" + "".join(heads)
             + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    source, ngram = ev.get("source", "target"), ev.get("method") == "ngram"
    speculated = any(e.get("source", "target") != "target" or e.get("method") for e in samples)
    proposer = "n-gram lookup copied" if ngram else "the draft proposed"
    if params.get("greedy"):
        mode = f"greedy: {proposer} the target's argmax" if source == "draft" else "greedy (argmax)"
    elif not speculated:  # no draft proposed anything: there is no "target" to speak of
        mode = PLAIN_SOURCE
    else:
        mode = (NGRAM_SOURCES if ngram else SOURCES).get(source, SOURCES["target"])
    info = (f"<div class='tt-lines'><div>token {step % len(samples) + 1} of "
            f"{len(samples)} · position {ev['position']} · {esc(mode)} · drawn: "
            f"<code>{show_piece(piece_text(ev['token_id'], pieces))}</code> (id {ev['token_id']}, "
            f"p={prob(ev['token_prob'])}) · entropy {max(0.0, ev['entropy']):.2f} nats</div>"
            f"<div>logits{esc(over)} · tokens kept after each stage: {esc(kept)}</div></div>")
    history = "".join(
        f'<span class="tt-chip{" tt-chip-draft" if e.get("source") == "draft" else ""}" '
        f'title="position {e["position"]} · p={prob(e["token_prob"])} · entropy {max(0.0, e["entropy"]):.2f}'
        f'{(" · copied by n-gram lookup" if e.get("method") == "ngram" else " · from the draft") if e.get("source") == "draft" else ""}">{show_piece(piece_text(e["token_id"], pieces))}'
        f'<sub>{prob(e["token_prob"])}</sub></span>' for e in samples[-48:])
    legend = (" (underlined: copied by n-gram lookup, kept by the target)" if any(e.get("method") == "ngram" for e in samples)
              else " (underlined: proposed by the draft, kept by the target)") if any(
        e.get("source") == "draft" for e in samples) else ""
    # the table and the history side by side where the panel is wide (a dense model's full row), else stacked
    return ('<div class="tt-panel">' + header_html("Sampling", selection) + info
            + changes_html(ev, pieces, vocab_size) + f"<div class='tt-sample-wrap'><div class='tt-sample-main'>{table}</div>"
                 f"<div class='tt-sample-history'><div class='tt-subtitle'>every token "
                 f"{'(p under the target)' if speculated else '(the probability it was drawn with)'}{legend}"
                 f"</div><div class='tt-chips'>{history}</div></div></div></div>")
