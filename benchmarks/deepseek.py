"""DeepSeek's multi-head latent attention (MLA) on a tiny random DeepSeek-V3: what its KV
cache keeps a token against full per-head K and V and a GQA model of the same shape, the
bytes one decode step reads, and decode against transformers on the same checkpoint.

    python -m benchmarks.deepseek [--device cpu] [--context 1024] [--new-tokens 24] [--repeats 3] [--json OUT]

Byte counts are measured from the engine (the pool's describe(), the model's parameters);
the GQA row is the same layers and query heads with 1/4 as many KV heads of v_head_dim. The
same arithmetic is printed for DeepSeek-V3's own config (61 layers, 128 heads, 576-number
latent) against a GQA model of 8 KV heads of 128 dims. Timings on a loaded machine are
noisy: the engine/transformers ratio of one interleaved run is what counts.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.bench.timing import decode_rate, decode_times, greedy, repeat_spread, run_engine
from engine.config import ModelConfig
from engine.kernels.cpu import blocked_weights
from engine.llm_engine import LLMEngine

# a tiny V3 with the real one's proportions where they matter here: latent = (kv_lora_rank + rope) << H x (qk + v)
TINY = dict(vocab_size=512, hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=16, num_key_value_heads=16, q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32,
            qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
            n_group=4, topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5,
            max_position_embeddings=4096, bos_token_id=0, eos_token_id=1, pad_token_id=None)
# DeepSeek-V3 / R1 (config.json): only what the KV arithmetic reads
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 129280, "hidden_size": 7168,
               "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
               "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
               "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
               "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
               "first_k_dense_replace": 3, "max_position_embeddings": 163840}


@dataclass
class KVRow:
    model: str
    latent_bytes_per_token: int  # what the pool keeps: layers x (kv_lora_rank + rope) x bytes
    full_kv_bytes_per_token: int  # K and V of every head: layers x heads x (qk + v head dims) x bytes
    gqa_bytes_per_token: int  # 2 x layers x KV heads x head_dim x bytes of the GQA comparator
    gqa: str  # the comparator, in words


def kv_row(name: str, cfg: ModelConfig, dtype_bytes: int, gqa_heads: int, gqa_dim: int) -> KVRow:
    m, L, H = cfg.mla, cfg.num_layers, cfg.num_heads
    return KVRow(name, L * m.latent_dim * dtype_bytes, L * H * (m.qk_head_dim + m.v_head_dim) * dtype_bytes,
                 2 * L * gqa_heads * gqa_dim * dtype_bytes, f"{L} layers x {gqa_heads} KV heads x {gqa_dim} dims")


def weight_bytes_read(engine: LLMEngine) -> int:
    """Bytes of weights one decode step of one sequence reads: every weight (a parameter, or
    where the C kernels hold it, its blocked copy: the only one, counted at its logical
    out x in size) but the embedding table's other rows and the routed experts the token was
    not sent to."""
    cfg, model = engine.model_config, engine.runner.model
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    total += sum(w.out_features * w.in_features * w.data.element_size() for w in blocked_weights(model))
    embed = model.model.embed_tokens
    if not cfg.tie_word_embeddings and embed.weight is not None:  # one row is read; a tied table whole, as the head
        total -= embed.weight.numel() * embed.weight.element_size()
    for layer in model.model.layers:
        mlp = layer.mlp
        if hasattr(mlp, "experts_gate_up"):
            routed = sum(p.numel() * p.element_size() for n, p in mlp.named_parameters() if n.startswith("experts_"))
            experts = getattr(mlp, "c_experts", None)
            if experts is not None:
                routed += sum(w.out_features * w.in_features * w.data.element_size() for w in experts.blocked_weights())
            total -= routed * (cfg.num_experts - cfg.num_experts_per_tok) // cfg.num_experts
    return total


def tiny_checkpoint(folder: Path, seed: int = 0) -> Path:
    """The tiny model's safetensors and a word-level tokenizer (the bench feeds token ids)."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    torch.manual_seed(seed)
    cfg = transformers.DeepseekV3Config(**TINY, initializer_range=0.1)  # logits far from uniform: no greedy ties
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # a balance bias that changes choices, as a trained one does
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.e_score_correction_bias.normal_(0, 0.3)
    model.save_pretrained(str(folder))
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, TINY["vocab_size"])}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                         unk_token="<unk>").save_pretrained(str(folder))
    return folder


def decode_rows(engine: LLMEngine, path: Path, new_tokens: int, repeats: int, prompt_len: int = 32) -> dict:
    """Batch-1 greedy decode rate, the engine and transformers interleaved, tokens compared."""
    from transformers import AutoModelForCausalLM
    ref = AutoModelForCausalLM.from_pretrained(str(path), dtype=engine.dtype).to(engine.device).eval()
    prompt = torch.randint(4, TINY["vocab_size"], (prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
    ids = torch.tensor([prompt], device=engine.device)

    def hf(n: int) -> list[int]:
        with torch.inference_mode():
            return ref.generate(ids, max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
                                attention_mask=torch.ones_like(ids))[0, prompt_len:].tolist()

    def ours(n: int) -> list[int]:
        return next(iter(run_engine(engine, [prompt], [greedy(n)]).values()))["tokens"]
    same = hf(new_tokens) == ours(new_tokens)
    times = decode_times({"hf": hf, "us": ours}, new_tokens, repeats)
    n = new_tokens - 1
    return {"engine_tok_s": decode_rate(times, "us", n), "transformers_tok_s": decode_rate(times, "hf", n),
            "greedy_tokens_identical": same,
            "spread": repeat_spread(times["hf"], times["hf1"], times["us"], times["us1"])}


def run(device: str, context: int, new_tokens: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_checkpoint(Path(tmp))
        engine = LLMEngine(path, device=device, dtype="float32")
        kv = engine.describe().kv_pool
        cfg = engine.model_config
        tiny = kv_row("tiny DeepSeek-V3 (float32)", cfg, kv.bytes_per_value, cfg.num_heads // 4, cfg.mla.v_head_dim)
        assert tiny.latent_bytes_per_token == kv.bytes_per_token  # the pool's own count
        weights = weight_bytes_read(engine)
        step = {name: weights + context * per_token for name, per_token in
                (("mla", tiny.latent_bytes_per_token), ("full_kv", tiny.full_kv_bytes_per_token),
                 ("gqa", tiny.gqa_bytes_per_token))}
        decode = decode_rows(engine, path, new_tokens, repeats)
    v3 = kv_row("DeepSeek-V3 (bfloat16)", ModelConfig.from_hf(DEEPSEEK_V3), 2, 8, 128)
    return {"kv": [asdict(tiny), asdict(v3)], "context": context, "weights_read_per_step": weights,
            "bytes_read_per_decode_step": step, "decode": decode, "device": device}


def report(r: dict) -> str:
    lines = ["KV cache per token (latent the pool keeps | full K and V of every head | GQA comparator):"]
    for row in r["kv"]:
        lat, full, gqa = row["latent_bytes_per_token"], row["full_kv_bytes_per_token"], row["gqa_bytes_per_token"]
        lines.append(f"  {row['model']}: {lat:,} B | {full:,} B ({full / lat:.1f}x) | {gqa:,} B ({gqa / lat:.1f}x; "
                     f"{row['gqa']})")
    s = r["bytes_read_per_decode_step"]
    lines.append(f"bytes one decode step reads at {r['context']:,} tokens of context (tiny model, weights "
                 f"{r['weights_read_per_step']:,} B + the cache): MLA {s['mla']:,} B, full K/V {s['full_kv']:,} B "
                 f"({s['full_kv'] / s['mla']:.2f}x), GQA {s['gqa']:,} B ({s['gqa'] / s['mla']:.2f}x)")
    d = r["decode"]
    lines.append(f"batch-1 greedy decode on {r['device']}: engine {d['engine_tok_s']:.1f} tok/s, transformers "
                 f"{d['transformers_tok_s']:.1f} tok/s ({d['engine_tok_s'] / d['transformers_tok_s']:.2f}x; "
                 f"{d['spread']}); greedy tokens {'identical' if d['greedy_tokens_identical'] else 'DIFFER'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--context", type=int, default=1024, help="tokens of context for the bytes-per-step row")
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write the numbers here")
    args = ap.parse_args(argv)
    r = run(args.device, args.context, args.new_tokens, args.repeats)
    print(report(r))
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
