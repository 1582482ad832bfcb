"""The page's words about models and recorded requests: the picker's lines, the model
summary, the labels that change with plain-prompt mode, the replay slider's numbering, and
a recorded request's settings as the controls hold them."""
from __future__ import annotations

import visualizers as viz
from app.serving.recording import Recording
from app.serving.requests import parse_body
from visualizers.i18n import N_, gettext, ngettext, number, size


def trace_settings(rec: Recording, info: dict) -> dict:
    """A recorded request's settings, as the controls would hold them: the sampling numbers the
    engine recorded at arrival (else the body's, with the API's defaults), the prompts and
    speculation from the body, the capture level it ran at."""
    body = rec.body or {}
    arrive = next((e for e in rec.events if e["type"] == "request.arrive"), None) or {}
    try:
        sub = parse_body(body) if body else None
    except ValueError:  # a hand-edited file: what can be read
        sub = None
    p = dict(arrive.get("params") or {})
    if sub is not None:
        for name in ("temperature", "top_k", "top_p", "max_tokens", "seed"):
            p.setdefault(name, getattr(sub.params, name))
    messages = body.get("messages") or arrive.get("messages") or []
    texts = {m.get("role"): m.get("content") for m in messages if isinstance(m, dict)}  # the last of each role
    prompt = body.get("prompt") if isinstance(body.get("prompt"), str) else arrive.get("prompt")
    user = texts.get("user") if messages else prompt
    seed = p.get("seed")
    return {"system": texts.get("system") or "" if messages else "", "user": user if isinstance(user, str) else "",
            "temperature": float(p.get("temperature", 1.0)), "top_k": int(p.get("top_k") or 0),
            "top_p": float(p.get("top_p", 1.0)), "max_tokens": int(p.get("max_tokens") or 1),
            "seed": "" if seed is None else str(seed),
            "speculative": sub.speculative if sub is not None else bool(info.get("has_draft")),
            "k": (sub.num_speculative_tokens if sub is not None and sub.num_speculative_tokens else None)
            or int(info.get("num_speculative_tokens") or 1),
            "level": arrive.get("trace_level") or (sub.trace_level if sub is not None and "trace_level" in body
                                                   else None) or ("off" if not rec.events else "full"),
            **(more_settings(sub) if sub is not None else {})}


def more_settings(sub) -> dict:
    """The extra controls (penalties, min_p / min_tokens, a logit bias, JSON mode, n) as a parsed
    body set them (the page's logit bias holds one token: the body's first)."""
    prm = sub.params
    bias = next(iter(prm.logit_bias.items()), None)
    kind = prm.structured.kind if prm.structured is not None else None
    return {"presence_penalty": prm.presence_penalty, "frequency_penalty": prm.frequency_penalty,
            "repetition_penalty": prm.repetition_penalty, "min_p": prm.min_p, "min_tokens": prm.min_tokens,
            "bias_token": str(bias[0]) if bias else "", "bias": bias[1] if bias else 0.0,
            "json_mode": {"json_object": "JSON object", "json_schema": "JSON schema"}.get(kind, "off"),
            **({"schema": prm.structured.value} if kind == "json_schema" else {}), "n": min(4, prm.n)}


REAL_MODELS = ("<code>python -m app --model smollm2</code>", "<code>--model smollm2 --model gemma3-270m</code>")
MODEL_DEFAULTS = {"num_experts": 0, "top_k": 0, "moe_layers": [], "sliding_windows": [], "has_draft": False,
                  "num_speculative_tokens": 1, "max_model_len": 0, "device": "-", "architecture": "",
                  "chat_template": True, "draft": None}


def with_defaults(m: dict) -> dict:
    """A model's numbers with what an older trace file may lack filled in."""
    m = {**MODEL_DEFAULTS, **m}
    if m["draft"] is None and m["has_draft"]:
        m["draft"] = "draft model"
    return m


def _draft_text(m: dict, lang: str = "en") -> str:
    if m["draft"] == "ngram":
        return gettext(lang, "n-gram drafts (prompt lookup), k≤{k}", k=m["num_speculative_tokens"])
    if m["draft"]:
        return gettext(lang, "draft model {draft}, k≤{k}", draft=m["draft"], k=m["num_speculative_tokens"])
    return gettext(lang, "no draft")


def model_choice(m: dict, lang: str = "en") -> str:
    """The picker's line for one model: what it is at a glance."""
    ffn = gettext(lang, "MoE {n} experts top-{k}", n=m["num_experts"], k=m["top_k"]) if m["is_moe"] else \
        gettext(lang, "dense")
    draft = gettext(lang, "n-gram drafts") if m["draft"] == "ngram" else gettext(lang, "no draft") \
        if m["draft"] is None else gettext(lang, "draft: {draft}", draft=m["draft"])
    line = gettext(lang, "{name} — {arch} · {layers} layers · heads {q}q/{kv}kv · vocab {vocab} · {ffn} · {draft}",
                   name=m["name"], arch=m["architecture"] or "?", layers=m["num_layers"], q=m["num_heads"],
                   kv=m["num_kv_heads"], vocab=number(lang, m["vocab_size"]), ffn=ffn, draft=draft)
    return line + ("" if m["chat_template"] else gettext(lang, " · base model (plain prompt)"))


def model_summary(m: dict, lang: str = "en") -> str:
    esc = viz._html.esc
    moe = gettext(lang, "MoE: {n} experts, top-{k}, {layers} MoE layers · ", n=m["num_experts"], k=m["top_k"],
                  layers=len(m["moe_layers"])) if m["is_moe"] else gettext(lang, "dense FFN · ")
    arch = f" ({esc(m['architecture'])})" if m["architecture"] else ""
    heads = gettext(lang, "{q} query heads / {kv} KV heads × {dim}", q=m["num_heads"], kv=m["num_kv_heads"],
                    dim=m["head_dim"]) if not m.get("mla") else \
        gettext(lang, "{q} query heads over one {n}-number latent (MLA)", q=m["num_heads"],
                n=m["kv_values_per_token_layer"])  # DeepSeek
    said = viz._html.said_html(
        lang, "{name}{arch} · {layers} layers · d_model {hidden} · {heads} · vocab {vocab} · {moe}{draft} · {dtype}"
              "{quant} on {device} · KV pool {blocks} blocks × {size} tokens ({bytes})",
        name=f"<b>{esc(m['name'])}</b>", arch=arch, layers=str(m["num_layers"]), hidden=number(lang, m["hidden_size"]),
        heads=esc(heads), vocab=number(lang, m["vocab_size"]), moe=esc(moe), draft=esc(_draft_text(m, lang)),
        dtype=esc(m["dtype"]), quant=_quant_text(m, lang), device=esc(m["device"]),
        blocks=number(lang, m["num_blocks"]), size=str(m["block_size"]), bytes=esc(size(lang, m["kv_cache_bytes"])))
    return f"<div class='tt-model'>{said}</div>"


def _quant_text(m: dict, lang: str = "en") -> str:
    """" with int4 weights (...)": where the linear layers are quantized (engine/checkpoint/quantize.py)."""
    q = m.get("quantization")  # absent in replays of older traces
    return viz._html.esc(gettext(lang, " with {quantization}", quantization=q)) if q else ""


def model_note(m: dict, served: int, lang: str = "en") -> str:
    """Under the picker: the picked model in one line, plain-prompt mode for a base model,
    and how to open real models."""
    esc = viz._html.esc
    about = (f"<div class='tt-pick-about'><b>{esc(m['name'])}</b>: {esc(model_choice(m, lang).split(' — ', 1)[1])}"
             "</div>")
    plain = ("" if m["chat_template"] else "<div class='tt-plain'>" + viz._html.said_html(
        lang, "{label} {name} has no chat template (a base model), so the prompt is sent as plain text, with no "
              "system prompt or roles, and the model continues it (the API's {api}).",
        label="<b>" + viz._html.said_html(lang, "Plain-prompt mode:") + "</b>", name=esc(m["name"]),
        api="<code>POST /v1/completions</code>") + "</div>")
    several = gettext(lang, "{n} models on this server, each on its own engine. ", n=served) if served > 1 else ""
    hint = viz._html.said_html(lang, "Real models: {one} (SmolLM2-135M-Instruct, fetched offline from PyPI), several "
                                     "at once with {two} — see README", one=REAL_MODELS[0], two=REAL_MODELS[1])
    return f"{about}{plain}<div class='tt-real'>{esc(several)}{hint}.</div>"


# N_: in the catalogs (the page's load and switch translate a label that is one of them)
SYSTEM_LABEL = {False: N_("System prompt"), True: N_("System prompt (not used in plain-prompt mode)")}
USER_LABEL = {False: N_("User prompt"), True: N_("Prompt (plain text: the model continues it)")}


def spec_info(m: dict, lang: str = "en") -> str:
    if m["draft"] == "ngram":
        return gettext(lang, "drafts by n-gram prompt lookup")
    return gettext(lang, "draft model: {draft}", draft=m["draft"]) if m["has_draft"] else \
        gettext(lang, "no draft model loaded")


def step_label(frames: int, which: str = "", lang: str = "en") -> str:
    """The replay slider's label: one numbering everywhere ("step k of N engine steps");
    which: what the steps are when not every one was recorded (" that drew a token")."""
    if frames <= 0:
        return gettext(lang, "Replay: nothing to replay yet (send a request or load a trace)")
    return ngettext(lang, "Replay: engine step 1..{n} of this request ({n} engine step{which})",
                    "Replay: engine step 1..{n} of this request ({n} engine steps{which})", frames, which=which)


def step_note(frames: int, never_ran: bool = False, which: str = "", lang: str = "en") -> str:
    """What stands in for the step slider where there is nothing to scrub (none or one frame)."""
    if frames <= 0:
        said = gettext(lang, "nothing to replay yet (a request can be replayed step by step once it ends; or load a "
                             "trace)")
    elif never_ran:
        said = gettext(lang, "no engine step to replay: this request ended before the scheduler ran it (the panels "
                             "show its end)")
    elif frames == 1:
        said = gettext(lang, "this request took one engine step{which}: nothing to scrub (the panels show it)",
                       which=which)
    else:
        return ""
    line = gettext(lang, "Replay: {said}", said=said)  # outside the f-string: the extractor reads it
    return f"<div class='tt-step-note'>{viz._html.esc(line)}</div>"


def clamp_step(number_, frames: int, lang: str = "en") -> tuple[int, str]:
    """A step typed or dragged -> (the step shown, 1..frames; a note when it was out of range)."""
    try:
        wanted = int(round(float(number_)))
    except (TypeError, ValueError):
        return frames, gettext(lang, " · {typed} is not a step number: showing the last", typed=repr(str(number_)[:20]))
    if frames <= 0:
        return 0, ""
    if wanted < 1:
        return 1, gettext(lang, " · there is no step {n}: steps count from 1, showing step 1", n=wanted)
    if wanted > frames:
        return frames, gettext(lang, " · there is no step {n}: this request ran {frames} engine steps, showing the "
                                     "last", n=wanted, frames=frames)
    return wanted, ""


def too_fast_note(tokens: list[dict], steps: int, fast_s: float, which: str = "", lang: str = "en") -> str:
    """After an answer too fast to watch: a pointer to Play, at the speed chosen beside it."""
    if not tokens or steps < 2:
        return ""
    took = sum(float(t.get("latency") or 0.0) for t in tokens)  # from arrival to the last token
    if took >= fast_s:
        return ""
    said = viz._html.said_html(lang, "▶ That answer took {took} s, too fast to watch: press {play} to replay its "
                                     "{steps} engine steps{which} at the speed chosen beside it (2 steps/s by "
                                     "default), or drag the step slider.", took=number(lang, took, 2),
                               play="<b>" + viz._html.said_html(lang, "▶ Play") + "</b>", steps=str(steps),
                               which=viz._html.esc(which))
    return f"<div class='tt-replay-note'>{said}</div>"


def max_label(cap: int, context: int | None = None, lang: str = "en") -> str:
    """The max-tokens slider's label: the limit Send and the API apply for the model picked (the
    context less the prompt's tokens, which the slider's end cannot know: it leaves one)."""
    if context and cap >= context - 1:
        return gettext(lang, "Max tokens (≤ the context left: {context} less the prompt's tokens)",
                       context=number(lang, context))
    return gettext(lang, "Max tokens (≤ {cap}, the server's cap, and the context left)", cap=number(lang, cap))
