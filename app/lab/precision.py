"""Precision: the same model with float32, int8 and int4 weights (weight-only quantization,
engine/checkpoint/quantize.py). Measured: decode tokens/s, the weights' bytes in memory, and,
on a fixed text read teacher-forced, how often the quantized model's most likely next token
is float32's, and the KL divergence of its next-token distribution from float32's."""
from __future__ import annotations

import math

from engine import MAX_LOGPROBS, SamplingParams, TokenOutput

from app.lab.experiment import Experiment, Setting, SettingResult
from app.lab.runner import Job, Lab
from app.lab.workloads import FIXED_TEXT, PROMPTS
from visualizers import lab_precision

TOKENS = {"full": 64, "ci": 12}
TEXT_TOKENS = {"full": 96, "ci": 48}


def settings(size: str) -> list[Setting]:
    common = {"max_tokens": TOKENS[size], "text_tokens": TEXT_TOKENS[size], "dtype": "float32", "device": "cpu"}
    return [Setting("float32", "float32", {**common, "quantization": None}),
            Setting("int8", "int8 weights", {**common, "quantization": "int8"}),
            Setting("int4", "int4 weights", {**common, "quantization": "int4"})]


def run_setting(lab: Lab, setting: Setting) -> SettingResult:
    o = setting.options
    tops: list[list] = []

    def keep(role: str, out: TokenOutput) -> None:
        if role == "fixed text" and out.prompt_logprobs:
            tops.extend([[[t, lp] for t, lp in p.top] if p is not None else None for p in out.prompt_logprobs])

    # the quantized linear layers are CPU kernels: every setting runs there, so they compare
    with lab.engine(dtype=o["dtype"], quantization=o["quantization"], device="cpu") as (engine, events):
        ids = engine.tokenizer.encode(FIXED_TEXT)[:o["text_tokens"]]
        jobs = [Job("fixed text", ids, SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=MAX_LOGPROBS))]
        jobs += [Job("decode", p, SamplingParams(temperature=0, max_tokens=o["max_tokens"], ignore_eos=True))
                 for p in PROMPTS[:2]]
        info = engine.describe()
        drive = lab.drive(engine, events, jobs, one_at_a_time=True, on_output=keep)
    result = drive.setting_result(setting)
    q = info.quantization
    decode = [r for r in result.per_request if r.role == "decode"]
    tokens = sum(r.output_tokens - 1 for r in decode)
    seconds = sum((r.finish_s or 0) - (r.first_token_s or 0) for r in decode)
    result.extra = {"next_token_top": tops}
    result.metrics = {"decode_tokens_per_s": tokens / seconds if seconds else None,
                      "weights_bytes": info.model.weights_bytes,  # the kernels' blocked weights among them
                      "quantized_bytes": q.bytes if q is not None else 0,
                      "kernel_weight_bytes": info.model.kernel_weight_bytes,  # float weights blocked for the C kernels
                      "num_experts": info.model.num_experts,  # MoE experts are never quantized (see compare)
                      "positions": sum(t is not None for t in tops),  # the first prompt token has none
                      "ttft_s": decode[0].ttft_s if decode else None}
    return result


def compare(settings: list[SettingResult]) -> None:
    """Every setting against the first (float32): top-1 agreement and KL on the fixed text; and
    what the quantized run left float. The engine quantizes Linear layers only
    (engine/checkpoint/quantize.py), and no engine option changes that: the weights still
    blocked for the float kernels after it are the MoE experts (and any Linear the kernels
    cannot take). A float copy can also appear: an embedding that read a tied LM head's float
    weights keeps a table of its own once the head is codes (float tensors outside the
    kernels, less the codes, grow by it)."""
    ref = settings[0].extra["next_token_top"]
    f = settings[0].metrics
    for s in settings:
        m = s.metrics
        quantized = bool(m["quantized_bytes"]) and bool(f["weights_bytes"])
        m["left_float_share"] = m["kernel_weight_bytes"] / f["weights_bytes"] if quantized else 0.0
        m["float_copy_bytes"] = max(0, (m["weights_bytes"] - m["kernel_weight_bytes"] - m["quantized_bytes"])
                                    - (f["weights_bytes"] - f["kernel_weight_bytes"])) if quantized else 0
        mine = s.extra["next_token_top"]
        pairs = [(p, q) for p, q in zip(ref, mine) if p and q]
        s.metrics["agreement"] = sum(p[0][0] == q[0][0] for p, q in pairs) / len(pairs) if pairs else None
        kls = [kl_top(p, q) for p, q in pairs]
        s.metrics["kl_mean"] = sum(kls) / len(kls) if kls else None
        s.metrics["kl_max"] = max(kls) if kls else None


def kl_top(p: list, q: list) -> float:
    """KL(p‖q) over p's top tokens plus one bucket for the rest (a coarse-grained KL, which is
    never more than the full one). A token of p's top missing from q's reported top gets q's
    smallest reported probability (an upper bound on it)."""
    qd = {t: lp for t, lp in q}
    floor = min(lp for _, lp in q)
    kl, p_top, q_top = 0.0, 0.0, 0.0
    for t, lp in p:
        lq = qd.get(t, floor)
        kl += math.exp(lp) * (lp - lq)
        p_top += math.exp(lp)
        q_top += math.exp(lq)
    p_rest, q_rest = max(1e-12, 1 - p_top), max(1e-12, 1 - min(q_top, 1 - 1e-12))
    return max(0.0, kl + p_rest * math.log(p_rest / q_rest))


EXPERIMENT = Experiment(
    name="precision", title="Precision: float32, int8 and int4 weights",
    what="The same model with float32, int8 and int4 weights: tokens/s, memory, and next-token agreement "
         "and KL against float32 on a fixed text.",
    settings=settings, run_setting=run_setting, figures=lab_precision.figures, sentences=lab_precision.sentences,
    compare=compare,
    headline=[("decode_tokens_per_s", "decode tokens/s"), ("weights_bytes", "weights (bytes)"),
              ("left_float_share", "float32's bytes left float"), ("agreement", "top-1 agreement"),
              ("kl_mean", "KL mean (nats)"), ("kl_max", "KL max (nats)")])
