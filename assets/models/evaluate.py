"""Measure the embedded models on the held-out split; every number in the model
card (assets/models/README.md) comes from this module.

    python -m assets.models.evaluate            # full held-out split, prints a report
    python -m assets.models.evaluate --write    # ... and writes eval_results.json, fingerprint.json
    python -m assets.models.evaluate --quick    # the small subset the tests re-check

Measured here:
- perplexity of target and draft on held-out documents (`<|bos|> text <|end|>`,
  every token after <|bos|> predicted), and of a unigram baseline fitted on the
  training split (add-one smoothing);
- expert load: the share of routed (token, top-2 slot) assignments each expert
  of each MoE layer receives on held-out text;
- greedy speculative acceptance: the draft proposes k=4 greedy tokens, the target
  checks them in one forward pass, the longest prefix equal to the target's own
  argmax is accepted (plus one target token); rate = accepted / proposed;
- English-word rate: the share of words in greedy continuations of ordinary
  prompts that occur in the training text (a word list with no extra package).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import DRAFT_DIR, MODELS_DIR, TARGET_DIR
from .corpus import load_docs, split_docs

QUICK_DOCS = 32  # size of the subset that tests re-evaluate
FINGERPRINT_PROMPT = "The little dog ran to the door and"
FINGERPRINT_CHAT = [{"role": "user", "content": "Tell me something about cats."}]
PROMPTS = [  # ordinary prompts for the English-word check and the card's samples
    "Once upon a time, there was a",
    "The best thing about computers is",
    "My favorite food is",
    "A wise man once said",
    "The teacher asked the students",
    "Love is",
    "In the morning, I",
    "The cat sat on the",
]
CHAT_PROMPTS = ["Tell me something about love.", "Tell me a fortune.", "Say something about computers."]
WORD_RE = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")


@dataclass
class Models:
    tok: object
    target: torch.nn.Module
    draft: torch.nn.Module


def load_models(target_dir: Path = TARGET_DIR, draft_dir: Path = DRAFT_DIR) -> Models:
    """Load both checkpoints with plain transformers, upcast to float32 (the
    bfloat16 weights convert exactly, so results do not depend on CPU bf16 math)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    return Models(tok, target, draft)


def heldout_texts(limit: int | None = None) -> list[str]:
    docs = split_docs(load_docs())["test"]
    return [d.text for d in docs[:limit]]


def encode(tok, text: str, max_len: int = 512) -> list[int]:
    return ([tok.bos_token_id] + tok.encode(text, add_special_tokens=False) + [tok.eos_token_id])[:max_len]


@torch.no_grad()
def perplexity(model, tok, texts: list[str]) -> float:
    nll, count = 0.0, 0
    for text in texts:
        ids = torch.tensor([encode(tok, text)])
        logits = model(ids).logits[0, :-1].float()
        nll += torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
        count += ids.shape[1] - 1
    return math.exp(nll / count)


def unigram_perplexity(tok, train_texts: list[str], texts: list[str]) -> float:
    counts = Counter()
    for t in train_texts:
        counts.update(encode(tok, t)[1:])
    total, vocab = sum(counts.values()), len(tok)
    nll, n = 0.0, 0
    for t in texts:
        for i in encode(tok, t)[1:]:
            nll -= math.log((counts[i] + 1) / (total + vocab))
            n += 1
    return math.exp(nll / n)


@torch.no_grad()
def expert_load(model, tok, texts: list[str]) -> list[list[float]]:
    """[layer][expert] share of routed (token, slot) assignments."""
    k, n_exp = model.config.num_experts_per_tok, model.config.num_local_experts
    counts = torch.zeros(model.config.num_hidden_layers, n_exp)
    for text in texts:
        out = model(torch.tensor([encode(tok, text)]), output_router_logits=True)
        for layer, logits in enumerate(out.router_logits):
            picks = logits.float().topk(k, dim=-1).indices.flatten()
            counts[layer] += torch.bincount(picks, minlength=n_exp).float()
    return (counts / counts.sum(dim=1, keepdim=True)).tolist()


@torch.no_grad()
def greedy_next(model, ids: list[int]) -> int:
    return int(model(torch.tensor([ids])).logits[0, -1].argmax())


@torch.no_grad()
def speculative_acceptance(models: Models, texts: list[str], k: int = 4, prompt_tokens: int = 16,
                           new_tokens: int = 48) -> dict:
    """Greedy speculative decoding, without a KV cache (exact and simple): the
    output equals the target's own greedy decoding, and we count how many draft
    proposals the target accepted."""
    tok, target, draft = models.tok, models.target, models.draft
    proposed = accepted = rounds = 0
    for text in texts:
        ids = encode(tok, text)[: prompt_tokens + 1]
        if ids[-1] == tok.eos_token_id:
            ids = ids[:-1]
        produced = 0
        while produced < new_tokens:
            guess: list[int] = []
            for _ in range(k):
                guess.append(greedy_next(draft, ids + guess))
            verdict = target(torch.tensor([ids + guess])).logits[0, len(ids) - 1 :].argmax(-1).tolist()
            n = 0
            while n < k and guess[n] == verdict[n]:
                n += 1
            new = guess[:n] + [verdict[n]]  # accepted prefix + the target's own next token
            proposed, accepted, rounds = proposed + k, accepted + n, rounds + 1
            ids += new
            produced += len(new)
            if tok.eos_token_id in new:
                break
    return {"k": k, "prompts": len(texts), "rounds": rounds, "proposed": proposed, "accepted": accepted,
            "acceptance_rate": accepted / proposed,
            "tokens_per_target_pass": (accepted + rounds) / rounds}


def train_word_list() -> set[str]:
    counts = Counter(w.lower() for d in split_docs(load_docs())["train"] for w in WORD_RE.findall(d.text))
    return {w for w, c in counts.items() if c >= 2}


@torch.no_grad()
def generate(model, tok, prompt_ids: list[int], max_new_tokens: int = 40) -> str:
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False)
    return tok.decode(out[0, len(prompt_ids):], skip_special_tokens=True)


def samples(models: Models) -> list[dict]:
    tok, rows = models.tok, []
    for p in PROMPTS:
        rows.append({"prompt": p, "target": generate(models.target, tok, tok(p).input_ids),
                     "draft": generate(models.draft, tok, tok(p).input_ids)})
    for p in CHAT_PROMPTS:
        ids = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
        rows.append({"prompt": f"[chat] {p}", "target": generate(models.target, tok, ids),
                     "draft": generate(models.draft, tok, ids)})
    return rows


def english_word_rate(texts: list[str], words: set[str]) -> float:
    found = [w.lower() in words for t in texts for w in WORD_RE.findall(t)]
    return sum(found) / max(1, len(found))


@torch.no_grad()
def fingerprint(model, tok) -> dict:
    """A few logits on a fixed prompt: catches an accidental overwrite."""
    ids = tok(FINGERPRINT_PROMPT).input_ids
    logits = model(torch.tensor([ids])).logits[0].float()
    last = logits[-1]
    top = last.topk(5)
    return {"prompt": FINGERPRINT_PROMPT, "input_ids": ids,
            "argmax_ids": logits.argmax(-1).tolist(),
            "last_top5_ids": top.indices.tolist(),
            "last_top5_logits": [round(v, 5) for v in top.values.tolist()],
            "logits_0_to_7_at_last": [round(v, 5) for v in last[:8].tolist()],
            "mean_logit": round(float(logits.mean()), 6)}


def quick_eval(models: Models, n_docs: int = QUICK_DOCS) -> dict:
    """The subset the tests re-run: perplexities, expert load and acceptance on
    the first n_docs held-out documents."""
    texts = heldout_texts(n_docs)
    return {
        "docs": len(texts),
        "target_ppl": perplexity(models.target, models.tok, texts),
        "draft_ppl": perplexity(models.draft, models.tok, texts),
        "min_expert_load": min(min(layer) for layer in expert_load(models.target, models.tok, texts)),
        "acceptance_rate": speculative_acceptance(models, texts[:8], new_tokens=16)["acceptance_rate"],
    }


def full_eval(models: Models) -> dict:
    t0 = time.time()
    splits = split_docs(load_docs())
    train_texts = [d.text for d in splits["train"]]
    test_texts = [d.text for d in splits["test"]]
    tok = models.tok
    n_tokens = sum(len(encode(tok, t)) - 1 for t in test_texts)
    loads = expert_load(models.target, tok, test_texts)
    rows = samples(models)
    words = train_word_list()
    result = {
        "heldout_docs": len(test_texts),
        "heldout_tokens": n_tokens,
        "perplexity": {
            "target": perplexity(models.target, tok, test_texts),
            "draft": perplexity(models.draft, tok, test_texts),
            "unigram": unigram_perplexity(tok, train_texts, test_texts),
        },
        "expert_load": loads,
        "min_expert_load": min(min(layer) for layer in loads),
        "speculative": speculative_acceptance(models, test_texts[:200]),
        "english_word_rate": {
            "target": english_word_rate([r["target"] for r in rows], words),
            "draft": english_word_rate([r["draft"] for r in rows], words),
        },
        "samples": rows,
        "parameters": {"target": sum(p.numel() for p in models.target.parameters()),
                       "draft": sum(p.numel() for p in models.draft.parameters())},
        "quick": quick_eval(models),
    }
    result["eval_wall_time_s"] = round(time.time() - t0, 1)
    return result


def report(r: dict) -> str:
    p = r["perplexity"]
    lines = [
        f"held-out: {r['heldout_docs']} documents, {r['heldout_tokens']} predicted tokens",
        f"perplexity: target {p['target']:.2f} | draft {p['draft']:.2f} | unigram baseline {p['unigram']:.1f}",
        "expert load (share of routed token-slots, experts 0-7):",
        *[f"  layer {i}: " + " ".join(f"{100 * x:5.1f}%" for x in layer) for i, layer in enumerate(r["expert_load"])],
        f"  minimum: {100 * r['min_expert_load']:.1f}%",
        "speculative (greedy, k={k}, {prompts} prompts): acceptance {rate:.1%}, "
        "{tpp:.2f} tokens per target pass".format(k=r["speculative"]["k"], prompts=r["speculative"]["prompts"],
                                                   rate=r["speculative"]["acceptance_rate"],
                                                   tpp=r["speculative"]["tokens_per_target_pass"]),
        f"English-word rate of greedy samples: target {r['english_word_rate']['target']:.1%}, "
        f"draft {r['english_word_rate']['draft']:.1%}",
        "quick subset: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                     for k, v in r["quick"].items()),
        "samples (greedy, target):",
        *[f"  {s['prompt']!r} -> {s['target']!r}" for s in r["samples"]],
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", default=str(MODELS_DIR))
    ap.add_argument("--quick", action="store_true", help=f"only the {QUICK_DOCS}-document subset")
    ap.add_argument("--write", action="store_true", help="write eval_results.json and fingerprint.json")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy 2-core machine)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    d = Path(args.models_dir)
    models = load_models(d / "target", d / "draft")
    if args.quick:
        print(json.dumps(quick_eval(models), indent=2))
        return
    result = full_eval(models)
    print(report(result))
    if args.write:
        (d / "eval_results.json").write_text(json.dumps(result, indent=2) + "\n")
        fp = {"target": fingerprint(models.target, models.tok), "draft": fingerprint(models.draft, models.tok)}
        (d / "fingerprint.json").write_text(json.dumps(fp, indent=2) + "\n")
        print(f"wrote {d / 'eval_results.json'} and {d / 'fingerprint.json'}")


if __name__ == "__main__":
    main()
