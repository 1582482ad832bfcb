"""Stage 8: sampling: the top candidates before and after each stage of the chain (a
structured output's grammar mask, min_tokens, the logit bias, the repetition, frequency and
presence penalties, then temperature, top-k, top-p and min-p), how many tokens survive each
cut, what each stage before temperature changed (which tokens' logits moved, by how much),
and the token drawn. A click on a candidate's token biases it in the next request (the page's
logit-bias control)."""
from __future__ import annotations

from typing import Mapping, Sequence

from visualizers._html import bar, empty, esc, panel, piece_text, prob, said_html, show_piece
from visualizers.i18n import N_, gettext, ngettext, number
from visualizers.selection import Selection, header_html

STAGE_LABELS = {"logits": "softmax(logits)", "grammar": N_("grammar mask"), "min_tokens": "min_tokens",
                "logit_bias": N_("logit bias"), "repetition_penalty": N_("repetition penalty"),
                "frequency_penalty": N_("frequency penalty"), "presence_penalty": N_("presence penalty"),
                "temperature": N_("÷ temperature"), "top_k": "top-k", "top_p": "top-p", "min_p": "min-p"}
# what each stage before temperature does to the logits (engine/penalties.py), for its row of changes
DOES = {"grammar": N_("sets every token the grammar forbids next to −∞"),
        "min_tokens": N_("masks the stop tokens until the answer has its minimum length"),
        "logit_bias": N_("adds the request's bias to those tokens' logits"),
        "repetition_penalty": N_("divides a positive logit (multiplies a negative one) of every token already in "
                                 "the prompt or the answer"),
        "frequency_penalty": N_("subtracts the penalty × how often the token is already in the answer"),
        "presence_penalty": N_("subtracts the penalty once from every token already in the answer")}


# Where a token came from (speculative decoding gives every kept token a source).
SOURCES = {
    "target": N_("drawn from the target's final distribution"),
    "draft": N_("proposed by the draft model and kept by the target's check (the target's distribution is shown)"),
    "corrected": N_("the draft's proposal was rejected here: drawn from max(0, p − q), the target minus the draft"),
    "bonus": N_("every proposal was kept: one more token drawn from the target"),
}
PLAIN_SOURCE = N_("drawn from the final distribution")  # a request no draft proposed for
# The same with n-gram prompt lookup, whose proposal is a copy (q is 1 on the copied token).
NGRAM_SOURCES = {
    **SOURCES,
    "draft": N_("copied from earlier in the context by n-gram lookup and kept by the target's check "
                "(the target's distribution is shown)"),
    "corrected": N_("the copied proposal was rejected here: drawn from the target with that token removed"),
}


def label(lang: str, stage: str) -> str:
    """A stage of the chain by its name in `lang` (top-k and the like stay as written)."""
    return gettext(lang, STAGE_LABELS.get(stage, stage))


OFF = N_("off")


def _knob(stage: str, params: dict, lang: str = "en") -> str:
    off = gettext(lang, OFF)
    if stage == "temperature":
        return f"T={params['temperature']:g}"
    if stage == "top_k":
        return f"k={params['top_k']}" if params["top_k"] else off
    if stage == "top_p":
        return f"p={params['top_p']:g}" if params["top_p"] < 1 else off
    if stage == "min_p":
        return f"min_p={params['min_p']:g}" if params["min_p"] else off
    if stage == "grammar":
        return str(params.get("structured", "")).replace("_", " ")
    if stage == "min_tokens":
        return f"≥{params.get('min_tokens', 0)}"
    if stage == "logit_bias":
        bias = params.get("logit_bias") or {}
        if len(bias) <= 3:
            return ", ".join(f"id {t} {float(b):+g}" for t, b in bias.items())
        return ngettext(lang, "{n} token", "{n} tokens", len(bias))
    if stage in ("repetition_penalty", "frequency_penalty", "presence_penalty"):
        return f"{'×' if stage == 'repetition_penalty' else ''}{params.get(stage, 0):g}"
    return ""


def changes_html(ev: dict, pieces: Mapping[int, str] | None, vocab_size: int | None, lang: str = "en") -> str:
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
            parts.append(esc(gettext(lang, "allowed {kept} of {vocab} tokens next", kept=number(lang, st["kept"]),
                                     vocab=number(lang, vocab_size)) if vocab_size else
                             gettext(lang, "allowed {kept} tokens next", kept=number(lang, st["kept"]))))
        if removed:
            codes = ", ".join(f"<code>{show_piece(piece_text(t, pieces))}</code>" for t in removed)
            first = esc(gettext(lang, "(the most likely first)")) if len(removed) > 1 else ""
            parts.append(esc(gettext(lang, "removed")) + " " + codes + (" " + first if first else ""))
        if shifted:
            parts.append(", ".join(f"<code>{show_piece(piece_text(t, pieces))}</code> {d:+.2f}" for t, d in shifted))
        what = esc(ngettext(lang, "moved {n} token's logit", "moved {n} tokens' logits", moved) if moved
                   else gettext(lang, "moved no logit at this step"))
        rows.append(f"<div class='tt-sample-change' data-stage='{esc(name)}'><b>{esc(label(lang, name))}</b> "
                    f"({esc(_knob(name, ev['params'], lang))}) {esc(gettext(lang, DOES[name]))}: {what}"
                    + (": " + "; ".join(parts) if parts else "") + "</div>")
    if not rows:
        return ""
    said = gettext(lang, "before temperature: what each stage changed (logit change; removed: set to −∞)")
    return f"<div class='tt-sample-changes'><div class='tt-subtitle'>{esc(said)}</div>" + "".join(rows) + "</div>"


def drawn_by(events: Sequence[dict], selection: Selection | None, what: str = "draw",
             lang: str = "en") -> tuple[int | None, str]:
    """The index of the event the selected pass drew (sample and lens events are keyed by the
    position of the token they produced: the pass that read p drew p + 1), or None and why not
    (HTML). No selection: the newest. what: "draw" or "lens"."""
    if selection is None or selection.read is None:  # (by position: a live step's come before those between)
        return max(range(len(events)), key=lambda i: events[i]["position"]), ""
    want = selection.read + 1
    for i in range(len(events) - 1, -1, -1):
        if events[i]["position"] == want:
            return i, ""
    if not selection.drew:
        return None, said_html(lang, "the selected pass read {read} inside the prompt: its next token {next} was the "
                                "prompt's own, so nothing was drawn there (click a later token)",
                          read=selection.token(selection.read), next=selection.token(want))
    newest = max(e["position"] for e in events)
    if what == "lens":
        return None, esc(gettext(lang, "no lens of position {want} was recorded (the newest recorded: position "
                                       "{newest})", want=want, newest=newest))
    return None, esc(gettext(lang, "no draw of position {want} was recorded (the newest recorded: position "
                                   "{newest})", want=want, newest=newest))


def _mode(ev: dict, samples: Sequence[dict], lang: str) -> tuple[str, bool]:
    """How the shown token was drawn (in words), and whether any draft proposed in this request."""
    source, ngram = ev.get("source", "target"), ev.get("method") == "ngram"
    speculated = any(e.get("source", "target") != "target" or e.get("method") for e in samples)
    if ev["params"].get("greedy"):
        if source != "draft":
            return gettext(lang, "greedy (argmax)"), speculated
        return (gettext(lang, "greedy: n-gram lookup copied the target's argmax") if ngram else
                gettext(lang, "greedy: the draft proposed the target's argmax")), speculated
    if not speculated:  # no draft proposed anything: there is no "target" to speak of
        return gettext(lang, PLAIN_SOURCE), speculated
    return gettext(lang, (NGRAM_SOURCES if ngram else SOURCES).get(source, SOURCES["target"])), speculated


def _table(ev: dict, pieces: Mapping[int, str] | None, lang: str) -> str:
    """The candidates (rows) through each stage of the chain (columns), the drawn one marked."""
    stages, params = list(ev["stages"]), ev["params"]
    head = [gettext(lang, "token"), "id"] + [f"{label(lang, s)} {_knob(s, params, lang)}".strip() for s in stages]
    # a knob that is off repeats the column before it: a narrow screen (CSS) hides those columns
    off = {i for i, s in enumerate(stages) if _knob(s, params) == "off"}
    col = [" class='tt-off-col'" if i in off else "" for i in range(len(stages))]
    hint = esc(gettext(lang, "click: bias this token in the next request (Logit bias)"))
    rows = []
    for j, cid in enumerate(ev["candidates"]):
        drawn = cid == ev["token_id"]
        cells = []
        for s in stages:
            p = ev["stages"][s]["probs"][j]
            # struck through: the number only (a struck space before it would read as a minus sign)
            cells.append(f'{bar(p)} <span class="{"tt-cut" if p == 0 else ""}">{prob(p)}</span>')
        cls = " class='tt-drawn'" if drawn else ""
        # data-bias-id: a click puts this token in the page's logit-bias control (app/page/hover.js)
        rows.append(f"<tr{cls}><td data-bias-id='{esc(cid)}' class='tt-biasable' title='{hint}'>"
                    f"{'▶ ' if drawn else ''}<code>{show_piece(piece_text(cid, pieces))}</code>"
                    f"<sub class='tt-id-sub'>{esc(cid)}</sub></td><td class='tt-id'>{esc(cid)}</td>"
                    + "".join(f"<td{col[i]}>{c}</td>" for i, c in enumerate(cells)) + "</tr>")
    # a narrow screen (CSS) folds the id column into the token cell; "softmax(logits)" may break at its "("
    heads = [f"<th{' class=tt-id' if i == 1 else (col[i - 2] if i >= 2 else '')}>"
             f"{esc(h).replace('(', '<wbr>(')}</th>" for i, h in enumerate(head)]
    hidden = [label(lang, stages[i]) for i in sorted(off)]
    narrow = ("<div class='tt-note tt-narrow-only'>" + said_html(lang, "on this narrow screen the columns of the knobs "
                                                                  "that are off ({knobs}) are hidden: they change "
                                                                  "nothing", knobs=esc(", ".join(hidden)))
              + "</div>" if hidden else "")
    return (narrow + "<table class='tt-table tt-sample'><thead><tr>" + "".join(heads)
            + "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _history(samples: Sequence[dict], pieces: Mapping[int, str] | None, speculated: bool, lang: str) -> str:
    """Every token drawn so far as a chip (the newest 48), with its probability."""
    def title(e: dict) -> str:
        words = gettext(lang, "position {position} · p={p} · entropy {entropy}", position=e["position"],
                        p=prob(e["token_prob"]), entropy=number(lang, max(0.0, e["entropy"]), 2))
        if e.get("source") == "draft":
            words += " · " + (gettext(lang, "copied by n-gram lookup") if e.get("method") == "ngram"
                              else gettext(lang, "from the draft"))
        return esc(words)
    chips = "".join(
        f'<span class="tt-chip{" tt-chip-draft" if e.get("source") == "draft" else ""}" title="{title(e)}">'
        f'{show_piece(piece_text(e["token_id"], pieces))}<sub>{prob(e["token_prob"])}</sub></span>'
        for e in samples[-48:])
    legend = ""
    if any(e.get("source") == "draft" for e in samples):
        legend = " " + (gettext(lang, "(underlined: copied by n-gram lookup, kept by the target)")
                        if any(e.get("method") == "ngram" for e in samples)
                        else gettext(lang, "(underlined: proposed by the draft, kept by the target)"))
    head = gettext(lang, "every token (p under the target)") if speculated else \
        gettext(lang, "every token (the probability it was drawn with)")
    return (f"<div class='tt-sample-history'><div class='tt-subtitle'>{esc(head + legend)}</div>"
            f"<div class='tt-chips'>{chips}</div></div>")


def sampling_html(samples: Sequence[dict], pieces: Mapping[int, str] | None = None, step: int | None = None,
                  vocab_size: int | None = None, selection: Selection | None = None, lang: str = "en") -> str:
    """samples: this request's `sample` events; step: which one to detail (default: the
    selected pass's draw, else the newest); vocab_size: the model's (the LM head scores every
    one of them); lang: the language of its words."""
    title = gettext(lang, "Sampling")
    if not samples:
        return panel(title, empty(gettext(lang, "no token sampled yet (the LM head will score over {n} vocabulary "
                                                "entries)", n=number(lang, vocab_size)) if vocab_size else
                                  gettext(lang, "no token sampled yet (the LM head will score the vocabulary)")))
    if step is None:
        step, why = drawn_by(samples, selection, lang=lang)
        if step is None:
            return '<div class="tt-panel">' + header_html(title, selection) + f"<div class='tt-empty'>{why}</div></div>"
    ev = samples[step if -len(samples) <= step < len(samples) else -1]
    kept = " → ".join(f"{label(lang, s)}: {number(lang, ev['stages'][s]['kept'])}" for s in ev["stages"])
    mode, speculated = _mode(ev, samples, lang)
    logits = gettext(lang, "logits over {n} vocabulary entries", n=number(lang, vocab_size)) if vocab_size else "logits"
    token = f"<code>{show_piece(piece_text(ev['token_id'], pieces))}</code>"
    line = said_html(lang, "token {i} of {n} · position {position} · {mode} · drawn: {token} (id {id}, p={p}) · "
                      "entropy {entropy} nats", i=str(step % len(samples) + 1), n=str(len(samples)),
                position=str(ev["position"]), mode=esc(mode), token=token, id=esc(ev["token_id"]),
                p=prob(ev["token_prob"]), entropy=number(lang, max(0.0, ev["entropy"]), 2))
    kept = said_html(lang, "tokens kept after each stage: {kept}", kept=esc(kept))
    info = f"<div class='tt-lines'><div>{line}</div><div>{esc(logits)} · {kept}</div></div>"
    # the table and the history side by side where the panel is wide (a dense model's full row), else stacked
    return ('<div class="tt-panel">' + header_html(title, selection) + info + changes_html(ev, pieces, vocab_size, lang)
            + f"<div class='tt-sample-wrap'><div class='tt-sample-main'>{_table(ev, pieces, lang)}</div>"
            + _history(samples, pieces, speculated, lang) + "</div></div>")
