"""Train TokenTrace's embedded models from scratch on 2 CPU cores.

    python -m assets.models.train            # full run (~38 min), writes assets/models/
    python -m assets.models.train --only draft   # retrain the draft from the saved target
    python -m assets.models.train --quick --out /tmp/tt-models   # smoke test, ~1 min

Steps: corpus (Debian `fortunes`) -> byte-level BPE tokenizer -> a Mixtral-style
MoE target trained on the text (cross-entropy plus a per-layer load-balancing
loss) -> a smaller Llama-style dense draft distilled from the target: its loss
is only KL(target || draft) on the training windows, with no cross-entropy on
the text (which is just logged, and used for validation); each saved as a
Hugging Face directory. The ~38 min is the sum of the two models' recorded
times (training.json: 1332.6 s target + 912.4 s draft, from separate runs).
Deterministic: fixed seeds, one thread per model (on a shared 2-core machine a
single thread is far faster than two that must wait for each other), the data
order drawn from seeded generators.

The training loop is plain PyTorch on the `transformers` model classes, in the
spirit of nanoGPT: random windows of a packed token stream, AdamW, warmup +
cosine decay, and the checkpoint with the best validation loss is kept.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from . import MODELS_DIR
from .corpus import chat_messages, load_docs, split_docs
from .tokenizer import BOS, END, save_tokenizer, train_tokenizer

VOCAB_SIZE = 4096
SEED = 1234
CHAT_FRACTION = 0.5  # share of training documents wrapped as a chat turn


@dataclass
class TrainConfig:
    name: str  # "target" or "draft": also the output sub-directory
    steps: int
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    min_lr_frac: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 8
    seed: int = SEED
    threads: int = 1
    distill_from: str | None = None  # teacher sub-directory ("target") for the draft
    model: dict = field(default_factory=dict)  # keyword arguments of the HF config


def target_model_config() -> dict:
    """Mixtral-style: grouped-query attention (8 query heads share 2 KV heads),
    8 SwiGLU experts per layer, top-2 routing, load-balancing auxiliary loss."""
    return dict(
        vocab_size=VOCAB_SIZE, hidden_size=256, intermediate_size=192, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=32,
        num_local_experts=8, num_experts_per_tok=2, router_aux_loss_coef=0.05,
        max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-5,
        sliding_window=None, tie_word_embeddings=True, initializer_range=0.02,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )


def draft_model_config() -> dict:
    """Llama-style dense draft, ~10x fewer parameters than the target, same
    tokenizer. Distilled from the target (see distill_loss), so that its greedy
    guesses agree with the target's often."""
    return dict(
        vocab_size=VOCAB_SIZE, hidden_size=96, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=3, num_key_value_heads=1, head_dim=32,
        max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, initializer_range=0.02,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )


def build_model(name: str, kwargs: dict) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    if name == "target":
        return MixtralForCausalLM(MixtralConfig(**kwargs))
    return LlamaForCausalLM(LlamaConfig(**kwargs))


# ---------------------------------------------------------------- data


def encode_docs(tok, docs, chat_fraction: float, seed: int) -> torch.Tensor:
    """Pack documents into one token stream. A plain document is
    `<|bos|> text <|end|>`; a chat one is the chat template of a short
    user -> assistant exchange, which ends with `<|end|>` too."""
    rng = random.Random(seed)
    order = list(range(len(docs)))
    rng.shuffle(order)
    bos, end = tok.convert_tokens_to_ids(BOS), tok.convert_tokens_to_ids(END)
    ids: list[int] = []
    for i in order:
        doc = docs[i]
        if rng.random() < chat_fraction:
            ids += tok.apply_chat_template(chat_messages(doc, rng), tokenize=True, return_dict=False)
        else:
            ids += [bos, *tok.encode(doc.text, add_special_tokens=False), end]
    return torch.tensor(ids, dtype=torch.long)


def get_batch(data: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator):
    starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=gen)
    x = torch.stack([data[s : s + seq_len] for s in starts.tolist()])
    y = torch.stack([data[s + 1 : s + 1 + seq_len] for s in starts.tolist()])
    return x, y


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))


def balance_loss(router_logits: tuple[torch.Tensor, ...], top_k: int, n_experts: int) -> torch.Tensor:
    """Switch-Transformer load-balancing loss, computed per layer and averaged:
    n_experts * sum_i(share of routed slots to expert i * mean router prob of i),
    which is 1.0 when routing is uniform. (transformers' own aux_loss pools the
    counts of all layers first, so one layer can starve an expert that another
    layer overuses; we saw experts with ~0% of tokens that way.)"""
    losses = []
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)
        picks = probs.topk(top_k, dim=-1).indices
        share = torch.nn.functional.one_hot(picks, n_experts).float().sum(1).mean(0) / top_k
        losses.append(n_experts * (share * probs.mean(0)).sum())
    return torch.stack(losses).mean()


def lm_loss(model, x: torch.Tensor, y: torch.Tensor, moe: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy on next tokens, plus (MoE only) the per-layer
    load-balancing loss, which keeps all experts in use; returns (total, ce)."""
    out = model(input_ids=x, output_router_logits=True) if moe else model(input_ids=x)
    ce = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1).float(), y.flatten())
    if moe:
        c = model.config
        aux = balance_loss(out.router_logits, c.num_experts_per_tok, c.num_local_experts)
        return ce + c.router_aux_loss_coef * aux, ce
    return ce, ce


def distill_loss(model, teacher, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """KL(teacher || student) on every position: the draft learns to imitate the
    target's whole next-token distribution rather than the data's next token,
    since speculative decoding rewards agreeing with the target (a cross-entropy
    term on the data lowered the acceptance rate). Returns (KL, data CE)."""
    with torch.no_grad():
        t_logp = torch.log_softmax(teacher(input_ids=x).logits.float(), dim=-1)
    s_logits = model(input_ids=x).logits.float()
    ce = torch.nn.functional.cross_entropy(s_logits.flatten(0, 1), y.flatten())
    kl = torch.nn.functional.kl_div(torch.log_softmax(s_logits, dim=-1), t_logp, log_target=True,
                                    reduction="none").sum(-1).mean()
    return kl, ce.detach()


@torch.no_grad()
def evaluate_loss(model, data: torch.Tensor, cfg: TrainConfig, moe: bool) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(cfg.seed + 1)  # the same val windows every time
    losses = [lm_loss(model, *get_batch(data, cfg.batch_size, cfg.seq_len, gen), moe)[1].item()
              for _ in range(cfg.eval_batches)]
    model.train()
    return sum(losses) / len(losses)


# ---------------------------------------------------------------- training


def train_one(cfg: TrainConfig, out_dir: str) -> dict:
    """Train one model and save it to out_dir/cfg.name."""
    from transformers import AutoTokenizer

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    model_dir = Path(out_dir) / cfg.name
    tok = AutoTokenizer.from_pretrained(model_dir)
    splits = split_docs(load_docs())
    train_data = encode_docs(tok, splits["train"], CHAT_FRACTION, cfg.seed)
    val_data = encode_docs(tok, splits["val"], 0.0, cfg.seed)

    moe = cfg.name == "target"
    teacher = None
    if cfg.distill_from:
        from transformers import AutoModelForCausalLM

        teacher = AutoModelForCausalLM.from_pretrained(Path(out_dir) / cfg.distill_from, dtype=torch.float32)
        teacher.eval().requires_grad_(False)
    model = build_model(cfg.name, cfg.model)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices, embeddings, experts
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # norms
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    best = {"val_loss": float("inf"), "step": -1, "state": None}
    history = []
    t0 = time.time()
    bar = tqdm(range(cfg.steps), desc=cfg.name, mininterval=5, ncols=100)
    for step in bar:
        if step % cfg.eval_every == 0 or step == cfg.steps - 1:
            val = evaluate_loss(model, val_data, cfg, moe)
            history.append({"step": step, "val_loss": round(val, 4), "elapsed_s": round(time.time() - t0, 1)})
            if val < best["val_loss"]:  # keep the best weights: the corpus is small
                best = {"val_loss": val, "step": step,
                        "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        x, y = get_batch(train_data, cfg.batch_size, cfg.seq_len, gen)
        loss, ce = distill_loss(model, teacher, x, y) if teacher is not None else lm_loss(model, x, y, moe)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        bar.set_postfix(loss=f"{ce.item():.3f}", val=f"{history[-1]['val_loss']:.3f}", refresh=False)
    bar.close()
    # Evaluate the final weights too (the loop's last check ran before the last step).
    val = evaluate_loss(model, val_data, cfg, moe)
    history.append({"step": cfg.steps, "val_loss": round(val, 4), "elapsed_s": round(time.time() - t0, 1)})
    if val < best["val_loss"]:
        best = {"val_loss": val, "step": cfg.steps, "state": model.state_dict()}
    wall = time.time() - t0
    model.load_state_dict(best["state"])
    save_model(model, tok, model_dir)
    return {
        "name": cfg.name,
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_tokens_in_stream": len(train_data),
        "tokens_seen": cfg.steps * cfg.batch_size * cfg.seq_len,
        "epochs": round(cfg.steps * cfg.batch_size * cfg.seq_len / len(train_data), 2),
        "best_step": best["step"],
        "best_val_loss": round(best["val_loss"], 4),
        "wall_time_s": round(wall, 1),
        "history": history,
        "config": {k: v for k, v in asdict(cfg).items() if k != "model"},
    }


def save_model(model, tok, model_dir: Path) -> None:
    """Save as a Hugging Face directory in bfloat16 (as real Llama/Mixtral
    checkpoints are; it halves the size), with a generation config whose eos is
    the end-of-turn token, then check that transformers reloads it exactly."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = model.to(torch.bfloat16).eval()
    model.config.dtype = "bfloat16"
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        do_sample=False, max_new_tokens=64,
    )
    model.save_pretrained(model_dir)
    save_tokenizer(tok, model_dir)
    # Also write the pre-v5 spellings, for loaders that read config.json themselves.
    cfg_path = model_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("torch_dtype", "bfloat16")
    cfg.setdefault("rope_theta", cfg.get("rope_parameters", {}).get("rope_theta", 10000.0))
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    # transformers v5 fuses the experts in memory (gate_up_proj) but writes the
    # classic per-expert keys; check both the file's keys and the round trip.
    from safetensors import safe_open

    with safe_open(model_dir / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    if model.config.model_type == "mixtral":
        assert "model.layers.0.block_sparse_moe.experts.7.w1.weight" in keys, sorted(keys)[:20]
    reloaded = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    mine, theirs = model.float().state_dict(), reloaded.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    x = torch.tensor([tok("Hello, world. The cat sat on the mat.").input_ids])
    with torch.no_grad():
        a, b = model(x).logits, reloaded(x).logits
    # Same weights bit for bit (above); the forward may differ in the last bits
    # because from_pretrained can pick another (fused) experts kernel.
    assert torch.allclose(a, b, atol=1e-2, rtol=1e-3), f"{model_dir}: logits differ by {(a - b).abs().max()}"
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    os.chmod(model_dir / "model.safetensors", 0o644)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(MODELS_DIR), help="output directory (default: assets/models)")
    ap.add_argument("--quick", action="store_true", help="a few steps only: a smoke test of the pipeline")
    ap.add_argument("--target-steps", type=int, default=800)
    ap.add_argument("--draft-steps", type=int, default=800)
    ap.add_argument("--only", choices=["target", "draft"], help="train one model (the draft needs the target)")
    args = ap.parse_args()

    random.seed(SEED)
    torch.manual_seed(SEED)
    out = Path(args.out)
    t0 = time.time()
    docs = load_docs()
    splits = split_docs(docs)
    print(f"corpus: {len(docs)} documents -> " + ", ".join(f"{k} {len(v)}" for k, v in splits.items()))
    # The tokenizer sees training text and the chat prompts' wording, never val/test.
    rng = random.Random(SEED)
    texts = [d.text for d in splits["train"]]
    texts += [m["content"] for d in splits["train"][:2000] for m in chat_messages(d, rng)[:-1]]
    tok = train_tokenizer(texts, VOCAB_SIZE)
    for name in ("target", "draft"):
        save_tokenizer(tok, out / name)
    print(f"tokenizer: {len(tok)} entries, saved to {out}/{{target,draft}} ({time.time() - t0:.1f}s)")

    quick = dict(steps=6, eval_every=3, eval_batches=2, warmup=2, batch_size=4, seq_len=64)
    target = TrainConfig("target", steps=args.target_steps, lr=2e-3, model=target_model_config())
    draft = TrainConfig("draft", steps=args.draft_steps, lr=3e-3, distill_from="target",
                        model=draft_model_config())
    if args.quick:
        target, draft = (TrainConfig(c.name, model=c.model, lr=c.lr, distill_from=c.distill_from, **quick)
                         for c in (target, draft))
    # The draft learns from the trained target, so the two run one after the other.
    summary_path = out / "training.json"
    previous = json.loads(summary_path.read_text())["models"] if summary_path.exists() else {}
    results = {**previous}
    for cfg in (target, draft):
        if args.only in (None, cfg.name):
            results[cfg.name] = train_one(cfg, str(out))
    summary = {
        "seed": SEED, "vocab_size": len(tok), "chat_fraction": CHAT_FRACTION,
        "corpus_documents": {k: len(v) for k, v in splits.items()},
        "last_run_wall_time_s": round(time.time() - t0, 1),  # this invocation only (see --only)
        "models": results,
    }
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n" * 2 + json.dumps({k: v for k, v in summary.items() if k != "models"}, indent=2))
    for r in results.values():
        print(f"{r['name']}: {r['parameters']:,} params, best val loss {r['best_val_loss']} "
              f"at step {r['best_step']}, {r['wall_time_s']}s")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
