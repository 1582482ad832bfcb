"""Tiny random-weight checkpoints of every supported architecture, written with
`transformers` itself, so parity tests compare against an implementation no one
here wrote."""
from __future__ import annotations

import math
from pathlib import Path

import torch

VOCAB = 320

# name -> (config class name, kwargs). Each turns on the feature that family is known for.
ARCH_CONFIGS: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=True, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32})),
    "mistral": ("MistralConfig", dict(sliding_window=8)),
    "qwen2": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "qwen3": ("Qwen3Config", dict(head_dim=24)),
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=48, mlp_only_layers=[1],
                                         norm_topk_prob=False)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                         decoder_sparse_step=2, norm_topk_prob=True, head_dim=16)),
    "qwen3_moe_nonorm": ("Qwen3MoeConfig", dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                                mlp_only_layers=[0], norm_topk_prob=False, head_dim=16)),
    "olmoe": ("OlmoeConfig", dict(num_experts=4, num_experts_per_tok=2, clip_qkv=4.0)),
    # local (window 6) and global layers alternating, each kind with its own RoPE (linear scaling on
    # the global ones); head_dim and query_pre_attn_scalar differ from hidden / heads
    "gemma3": ("Gemma3TextConfig", dict(head_dim=24, query_pre_attn_scalar=20, sliding_window=6,
                                        sliding_window_pattern=2, rope_parameters={
                                            "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                               "rope_theta": 5000.0},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}})),
}


def save_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 4, special_tokens=["<s>", "</s>", "<|user|>", "<|assistant|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["The quick brown fox jumps over the lazy dog. Héllo wörld, naïve café 日本語 ✓ 🙂"] * 50
    tok.train_from_iterator(text, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>"
                          "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    fast.save_pretrained(str(path))


def save_word_tokenizer(path: Path, words: list[str]) -> None:
    """A word-level tokenizer with a handful of tokens (the first is EOS), for tests
    that need the exact distribution over a tiny vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=words[0]).save_pretrained(str(path))


def scale_weights(model: torch.nn.Module, seed: int) -> None:
    """Unit-scale random weights: default init (std 0.02) gives near-uniform logits
    whose argmax ties make greedy comparisons meaningless."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:  # norm weights
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))


def make_checkpoint(arch: str, path: Path, seed: int = 0, num_layers: int = 3,
                    max_shard_size: str | None = None, words: list[str] | None = None,
                    num_heads: int = 4, num_kv_heads: int = 2, hidden_size: int = 64) -> Path:
    """A tiny random checkpoint; `words`: use a word-level vocabulary of those tokens;
    num_heads / num_kv_heads / hidden_size: other shapes (e.g. SmolLM2's 9 query heads on
    3 KV heads, with a hidden size that 9 divides)."""
    import transformers

    cls_name, extra = ARCH_CONFIGS[arch]
    cfg = getattr(transformers, cls_name)(
        vocab_size=len(words) if words else VOCAB, hidden_size=hidden_size, intermediate_size=96, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, max_position_embeddings=256,
        bos_token_id=0, eos_token_id=0 if words else 1, pad_token_id=None, **extra)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    scale_weights(model, seed)
    path.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(path), **kwargs)
    save_word_tokenizer(path, words) if words else save_tokenizer(path)
    return path


def load_reference(path: Path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32,
                                                attn_implementation="eager").eval()
