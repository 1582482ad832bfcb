"""TokenTrace's embedded default models: a small Mixtral-style MoE target and a
dense Llama-style draft, trained by `python -m assets.models.train` on the
Debian `fortunes` corpus and stored here in Hugging Face format.

    target/   MixtralForCausalLM (8 experts, top-2, grouped-query attention)
    draft/    LlamaForCausalLM   (speculative-decoding draft, same tokenizer)
"""
from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent
TARGET_DIR = MODELS_DIR / "target"
DRAFT_DIR = MODELS_DIR / "draft"
