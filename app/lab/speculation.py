"""Speculation by content: the same prompts (copy or edit given text, code, open prose)
decoded with no speculation, with the draft model (where one is served: the embedded
model's), and with n-gram lookup in the request's own tokens. Greedy, one request at a
time: acceptance and tokens per target pass depend on the text alone; tokens/s is this
machine's."""
from __future__ import annotations

from pathlib import Path

from engine import SamplingParams

from app.lab.experiment import Experiment, Setting, SettingResult
from app.lab.runner import Job, Lab
from app.lab.workloads import CONTENT_PROMPTS
from visualizers import lab_speculation

EMBEDDED_DRAFT = Path(__file__).resolve().parents[2] / "assets" / "models" / "draft"
K = 4  # proposals per round
TOKENS = {"full": 96, "ci": 32}


def settings(size: str, model: str | None = None) -> list[Setting]:
    common = {"max_tokens": TOKENS[size], "num_speculative_tokens": K}
    out = [Setting("none", "no speculation", {**common, "draft": None})]
    if model is None:  # the embedded target is served with its embedded draft
        out.append(Setting("draft", "draft model", {**common, "draft": "embedded draft"}))
    out.append(Setting("ngram", "n-gram lookup", {**common, "draft": "ngram"}))
    return out


def run_setting(lab: Lab, setting: Setting) -> SettingResult:
    o = setting.options
    draft = {"embedded draft": str(EMBEDDED_DRAFT)}.get(o["draft"], o["draft"])
    spec = {"draft": draft, "num_speculative_tokens": o["num_speculative_tokens"]} if draft else {}
    jobs = [Job(kind, prompt, SamplingParams(temperature=0, max_tokens=o["max_tokens"], ignore_eos=True))
            for kind, prompts in CONTENT_PROMPTS.items() for prompt in prompts]
    with lab.engine(**spec) as (engine, events):
        drive = lab.drive(engine, events, jobs, one_at_a_time=True)
    result = drive.setting_result(setting)
    # each round, as the engine reported it: proposals and accepted (token texts left out)
    result.events = [{"request_id": e["request_id"], "step": e["step"], "k": e["k"], "accepted": e["accepted"]}
                     for e in drive.events if e["type"] == "spec"]
    result.metrics = metrics(result)
    return result


def metrics(r: SettingResult) -> dict:
    out: dict = {}
    for kind in CONTENT_PROMPTS:
        reqs = [q for q in r.per_request if q.role == kind]
        ids = {q.request_id for q in reqs}
        rounds = [e for e in r.events if e["request_id"] in ids]
        proposed = sum(e["k"] for e in rounds)
        tokens = sum(q.output_tokens for q in reqs)
        passes = sum(len(q.steps) for q in reqs)  # every step a request was in ran the target once
        seconds = sum(q.latency_s or 0.0 for q in reqs)
        out[f"{kind}_proposed"] = proposed
        out[f"{kind}_accepted"] = sum(e["accepted"] for e in rounds)
        out[f"{kind}_acceptance"] = out[f"{kind}_accepted"] / proposed if proposed else None
        out[f"{kind}_tokens_per_pass"] = tokens / passes if passes else None
        out[f"{kind}_tokens_per_s"] = tokens / seconds if seconds else None
    return out


EXPERIMENT = Experiment(
    name="speculation", title="Speculation by content",
    what="Copy, code and prose prompts with no speculation, a draft model and n-gram lookup: acceptance, "
         "tokens per target pass, tokens/s.",
    settings=settings, run_setting=run_setting, figures=lab_speculation.figures,
    sentences=lab_speculation.sentences,
    headline=[(f"{k}_{m}", f"{k} {label}") for m, label in (("acceptance", "acceptance"),
                                                             ("tokens_per_pass", "tokens/pass"))
              for k in CONTENT_PROMPTS] + [(f"{k}_tokens_per_s", f"{k} tokens/s") for k in CONTENT_PROMPTS])
