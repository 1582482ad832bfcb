"""Stage 8: sampling: the top candidates before and after temperature, top-k, top-p
and min-p, how many tokens survive each cut, and the token drawn."""
from __future__ import annotations

from typing import Mapping, Sequence

from visualizers._html import bar, empty, esc, panel, piece_text, show_piece
from visualizers.selection import Selection, header_html

STAGE_LABELS = {"logits": "softmax(logits)", "temperature": "÷ temperature", "top_k": "top-k",
                "top_p": "top-p", "min_p": "min-p"}


# Where a token came from (speculative decoding gives every kept token a source).
SOURCES = {
    "target": "drawn from the target's final distribution",
    "draft": "proposed by the draft model and kept by the target's check (the target's distribution is shown)",
    "corrected": "the draft's proposal was rejected here: drawn from max(0, p − q), the target minus the draft",
    "bonus": "every proposal was kept: one more token drawn from the target",
}
# The same with n-gram prompt lookup, whose proposal is a copy (q is 1 on the copied token).
NGRAM_SOURCES = {
    **SOURCES,
    "draft": "copied from earlier in the context by n-gram lookup and kept by the target's check "
             "(the target's distribution is shown)",
    "corrected": "the copied proposal was rejected here: drawn from the target with that token removed",
}


def prob(p: float, digits: int = 3) -> str:
    """A probability that stays readable when it is tiny: over a vocabulary of 262,144 a
    flat distribution gives every candidate about 4e-6, which 3 decimals would show as 0."""
    if p <= 0 or p >= 10 ** -digits:
        return f"{max(0.0, p):.{digits}f}"  # max(0.0, -0.0) is 0.0: a cut-off token shows no minus
    return f"{p:.1e}".replace("e-0", "e-")


def _knob(stage: str, params: dict) -> str:
    if stage == "temperature":
        return f"T={params['temperature']:g}"
    if stage == "top_k":
        return f"k={params['top_k']}" if params["top_k"] else "off"
    if stage == "top_p":
        return f"p={params['top_p']:g}" if params["top_p"] < 1 else "off"
    if stage == "min_p":
        return f"min_p={params['min_p']:g}" if params["min_p"] else "off"
    return ""


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
        rows.append(f"<tr{cls}><td>{'▶ ' if drawn else ''}<code>{show_piece(piece_text(cid, pieces))}</code>"
                    f"<sub class='tt-id-sub'>{esc(cid)}</sub></td><td class='tt-id'>{esc(cid)}</td>"
                    + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    kept = " → ".join(f"{STAGE_LABELS.get(s, s)}: {ev['stages'][s]['kept']:,}" for s in stages)
    # a narrow screen (CSS) folds the id column into the token cell; "softmax(logits)" may break at its "("
    heads = [f"<th{' class=tt-id' if h == 'id' else ''}>{esc(h).replace('(', '<wbr>(')}</th>" for h in head]
    table = ("<table class='tt-table tt-sample'><thead><tr>" + "".join(heads)
             + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    source, ngram = ev.get("source", "target"), ev.get("method") == "ngram"
    proposer = "n-gram lookup copied" if ngram else "the draft proposed"
    if params.get("greedy"):
        mode = f"greedy: {proposer} the target's argmax" if source == "draft" else "greedy (argmax)"
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
        f'<sub>{prob(e["token_prob"], 2)}</sub></span>' for e in samples[-48:])
    legend = (" (underlined: copied by n-gram lookup, kept by the target)" if any(e.get("method") == "ngram" for e in samples)
              else " (underlined: proposed by the draft, kept by the target)") if any(
        e.get("source") == "draft" for e in samples) else ""
    # the table and the history side by side where the panel is wide (a dense model's full row), else stacked
    return ('<div class="tt-panel">' + header_html("Sampling", selection) + info + f"<div class='tt-sample-wrap'><div class='tt-sample-main'>{table}</div>"
                 f"<div class='tt-sample-history'><div class='tt-subtitle'>every token (p under the target){legend}"
                 f"</div><div class='tt-chips'>{history}</div></div></div></div>")
