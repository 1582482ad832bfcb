"""benchmarks/peer_models.py: a GGUF checkpoint as the Hugging Face folder vLLM and llama.cpp's
converter read: `architectures` in its config, the tied embedding saved once, the same weights
and tokenizer as the GGUF file."""
from __future__ import annotations

import json

import torch

from benchmarks.peer_models import hf_folder
from tests.gguf_writer import tiny_model, write_gguf  # skips these tests without the gguf package
from tests.tiny import save_tokenizer


def test_a_gguf_checkpoint_becomes_a_folder_with_architectures_and_its_own_weights(tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = tmp_path / "tok"
    tok.mkdir()
    save_tokenizer(tok)
    source = tiny_model("LlamaConfig", tie_word_embeddings=True)
    path = write_gguf(source, tok, tmp_path / "tiny.gguf")
    out = hf_folder(str(path), tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    hf = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = torch.tensor([[3, 17, 42, 99, 5, 250]])
    with torch.inference_mode():
        torch.testing.assert_close(hf(ids).logits, source(ids).logits, rtol=1e-5, atol=1e-5)
    text = "the quick brown fox"
    assert AutoTokenizer.from_pretrained(str(out)).encode(text) == \
        AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="tiny.gguf").encode(text)
