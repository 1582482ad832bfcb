"""Measure the embedded models on the held-out split; every number in the model
card (assets/models/README.md) comes from this module.

    python -m assets.models.evaluate            # full held-out split, prints a report
    python -m assets.models.evaluate --write    # ... and writes eval_results.json, fingerprint.json
    python -m assets.models.evaluate --quick    # the small subset the tests re-check

Measured here:
- perplexity of target and draft on held-out documents (`<|bos|> text <|end|>`,
  every token after <|bos|> predicted), and of a unigram baseline fitted on the
  training split (add-one smoothing);
- a paired target-vs-draft comparison on the same held-out documents: per
  document, the difference of the mean NLL per token (target - draft); the
  share of documents where the target's is lower (with an exact two-sided sign
  test); and a bootstrap 95% confidence interval (documents resampled with
  replacement, fixed seed) of the perplexity ratio target / draft. It measures
  how much the gap depends on which documents were held out, not how much it
  would vary between training runs (each model was trained once);
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
from dataclasses import dataclass
from pathlib import Path

import torch

from . import DRAFT_DIR, MODELS_DIR, TARGET_DIR
from .corpus import load_docs, split_docs

QUICK_DOCS = 32  # size of the subset that tests re-evaluate
BOOTSTRAP_SAMPLES = 10_000  # resamples of the held-out documents for the paired comparison
BOOTSTRAP_SEED = 1234
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
def doc_nll(model, tok, texts: list[str]) -> list[tuple[float, int]]:
    """Per document: (summed NLL in nats of every token after <|bos|>, token count)."""
    rows = []
    for text in texts:
        ids = torch.tensor([encode(tok, text)])
        logits = model(ids).logits[0, :-1].float()
        rows.append((torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum").item(),
                     ids.shape[1] - 1))
    return rows


def perplexity_of(rows: list[tuple[float, int]]) -> float:
    nll, count = 0.0, 0
    for s, n in rows:
        nll += s
        count += n
    return math.exp(nll / count)


def nll_diff_per_doc(target_rows: list[tuple[float, int]], draft_rows: list[tuple[float, int]]) -> list[float]:
    """Per document: target - draft mean NLL per token (nats; negative = target better)."""
    assert [n for _, n in target_rows] == [n for _, n in draft_rows], "not the same documents"
    return [(t - d) / n for (t, n), (d, _) in zip(target_rows, draft_rows)]


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided sign test (binomial, p = 1/2; ties are left out)."""
    n, k = wins + losses, min(wins, losses)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def paired_comparison(target_rows: list[tuple[float, int]], draft_rows: list[tuple[float, int]],
                      samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """Target vs draft on the same documents (rows from doc_nll, same texts).

    `mean_nll_diff_per_doc`: the mean over documents of (target - draft) mean
    NLL per token (nats; negative = target better), each document weighted
    equally. `log_ppl_ratio` is the token-weighted version, log(ppl_t / ppl_d).
    The 95% intervals are bootstrap percentiles: the documents are resampled
    with replacement `samples` times (numpy generator seeded with `seed`)."""
    import numpy as np

    diff = np.array(nll_diff_per_doc(target_rows, draft_rows))
    t = np.array([s for s, _ in target_rows], dtype=np.float64)
    d = np.array([s for s, _ in draft_rows], dtype=np.float64)
    n = np.array([c for _, c in target_rows], dtype=np.float64)
    wins, losses = int((diff < 0).sum()), int((diff > 0).sum())
    rng = np.random.default_rng(seed)
    boot_ratio, boot_diff = [], []
    for start in range(0, samples, 1000):  # in chunks: 1000 x docs indices at a time
        idx = rng.integers(0, len(n), size=(min(1000, samples - start), len(n)))
        boot_ratio.append(np.exp((t[idx].sum(1) - d[idx].sum(1)) / n[idx].sum(1)))
        boot_diff.append(diff[idx].mean(1))
    boot_ratio, boot_diff = np.concatenate(boot_ratio), np.concatenate(boot_diff)
    return {
        "docs": len(n),
        "ppl_ratio": math.exp((t.sum() - d.sum()) / n.sum()),
        "ppl_ratio_ci95": [float(v) for v in np.percentile(boot_ratio, [2.5, 97.5])],
        "log_ppl_ratio": float((t.sum() - d.sum()) / n.sum()),
        "mean_nll_diff_per_doc": float(diff.mean()),
        "mean_nll_diff_per_doc_ci95": [float(v) for v in np.percentile(boot_diff, [2.5, 97.5])],
        "target_better_docs": wins,
        "draft_better_docs": losses,
        "target_better_share": wins / len(n),
        "sign_test_p": sign_test_p(wins, losses),
        "bootstrap": {"samples": samples, "seed": seed, "unit": "document"},
    }


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
    t_rows, d_rows = doc_nll(models.target, models.tok, texts), doc_nll(models.draft, models.tok, texts)
    return {
        "docs": len(texts),
        "target_ppl": perplexity_of(t_rows),
        "draft_ppl": perplexity_of(d_rows),
        "target_better_share": sum(x < 0 for x in nll_diff_per_doc(t_rows, d_rows)) / len(texts),
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
    t_rows, d_rows = doc_nll(models.target, tok, test_texts), doc_nll(models.draft, tok, test_texts)
    loads = expert_load(models.target, tok, test_texts)
    rows = samples(models)
    words = train_word_list()
    result = {
        "heldout_docs": len(test_texts),
        "heldout_tokens": n_tokens,
        "perplexity": {
            "target": perplexity_of(t_rows),
            "draft": perplexity_of(d_rows),
            "unigram": unigram_perplexity(tok, train_texts, test_texts),
        },
        "paired_target_vs_draft": paired_comparison(t_rows, d_rows),
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
    p, c = r["perplexity"], r["paired_target_vs_draft"]
    lines = [
        f"held-out: {r['heldout_docs']} documents, {r['heldout_tokens']} predicted tokens",
        f"perplexity: target {p['target']:.2f} | draft {p['draft']:.2f} | unigram baseline {p['unigram']:.1f}",
        "paired, target vs draft on the same {n} documents: perplexity ratio {r:.4f} "
        "(bootstrap 95% CI {lo:.4f} to {hi:.4f})".format(
            n=c["docs"], r=c["ppl_ratio"], lo=c["ppl_ratio_ci95"][0], hi=c["ppl_ratio_ci95"][1]),
        "  per document: mean NLL/token difference (target - draft) {m:+.4f} nats (95% CI {mlo:+.4f} to "
        "{mhi:+.4f}); target better on {w}/{n} ({share:.1%}, sign test p = {pv:.2g})".format(
            m=c["mean_nll_diff_per_doc"], mlo=c["mean_nll_diff_per_doc_ci95"][0],
            mhi=c["mean_nll_diff_per_doc_ci95"][1], w=c["target_better_docs"], n=c["docs"],
            share=c["target_better_share"], pv=c["sign_test_p"]),
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
