"""The models benchmarks/peers.py gives its peers, made from the checkpoints this engine reads:
a Hugging Face folder for vLLM from a GGUF file, and GGUF files of one precision for
llama.cpp from a Hugging Face folder (with llama.cpp's own convert_hf_to_gguf.py).

    python -m benchmarks.peer_models hf smollm2 DIR        # a catalog name or a .gguf -> a float32 HF folder
    python -m benchmarks.peer_models gguf DIR OUT.gguf --outtype f16 --converter CONVERT_HF_TO_GGUF.py

The converter ships in llama-cpp-python's source package (vendor/llama.cpp/convert_hf_to_gguf.py,
with the gguf-py it imports beside it): `pip download --no-deps --no-binary :all: llama-cpp-python`.
It names a byte-level BPE vocabulary's pre-tokenizer by a hash of known models' and refuses
one it has not seen (the embedded model's): `--any-pre-tokenizer` writes llama.cpp's "default"
then. peers.py feeds token ids, so the pre-tokenizer is never used there; text through such a
file would be split by llama.cpp's default rule, not the model's.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from engine.checkpoint.resolve import resolve_model_path


def hf_folder(model: str, out: Path) -> Path:
    """A GGUF checkpoint as a float32 Hugging Face folder: config.json with `architectures`
    (transformers leaves it out for a GGUF, and vLLM and the converter pick the model class
    by it), model.safetensors (the tied head saved once, as the embedding), tokenizer files."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: heavy, and only this command needs it
    path = Path(resolve_model_path(model))
    if path.suffix != ".gguf":
        raise SystemExit(f"{path} is not a GGUF file: a Hugging Face folder needs no converting")
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    state = hf.state_dict()
    if hf.config.tie_word_embeddings:  # save_pretrained refuses a GGUF-loaded model; a tied checkpoint has one copy
        state.pop("lm_head.weight", None)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"), metadata={"format": "pt"})
    hf.config.architectures = [type(hf).__name__]
    hf.config.save_pretrained(out)
    hf.generation_config.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(out)
    plain_config(out / "config.json")
    return out


def plain_config(config_path: Path) -> None:
    """The saved config as a plain float checkpoint's: no `quantization_config` naming the GGUF
    (the weights are dequantized; vLLM would load them as GGUF), and the older spellings too:
    transformers 5 writes `dtype` and `rope_parameters`, and a reader on transformers 4 (vLLM's
    pin may be one) finds neither and would take RoPE's default base."""
    config = json.loads(config_path.read_text())
    if not config.get("architectures"):
        raise SystemExit(f"{config_path} has no architectures")
    config.pop("quantization_config", None)
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope:
        config.setdefault("rope_theta", rope["rope_theta"])
    if "dtype" in config:
        config.setdefault("torch_dtype", config["dtype"])
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# Run inside the converter's process: its module, with the pre-tokenizer lookup falling back to
# "default" (llama.cpp's name for its plain byte-level rule; it knows no "gpt2").
_ANY_PRE = """
import sys
sys.path.insert(0, sys.argv[1])
import convert_hf_to_gguf as c
try:  # newer llama.cpp keeps the model classes in a package beside the script
    from conversion.base import TextModel as base
except ImportError:
    base = getattr(c, "TextModel", None) or c.Model
lookup = base.get_vocab_base_pre
def any_pre(self, tokenizer):
    try:
        return lookup(self, tokenizer)
    except NotImplementedError:
        print("pre-tokenizer not recognized: writing llama.cpp's default", file=sys.stderr)
        return "default"
base.get_vocab_base_pre = any_pre
sys.argv = [sys.argv[1] + "/convert_hf_to_gguf.py"] + sys.argv[2:]
c.main()
"""


def gguf_file(hf_dir: Path, out: Path, outtype: str, converter: Path, any_pre_tokenizer: bool = False) -> Path:
    """llama.cpp's converter on a Hugging Face folder, in its own process (it is a script)."""
    args = [str(hf_dir), "--outfile", str(out), "--outtype", outtype]
    if any_pre_tokenizer:
        cmd = [sys.executable, "-c", _ANY_PRE, str(converter.parent), *args]
    else:
        cmd = [sys.executable, str(converter), *args]
    subprocess.run(cmd, check=True)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peer_models", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    hf = sub.add_parser("hf", help="a GGUF checkpoint -> a float32 Hugging Face folder (for vLLM, the converter)")
    hf.add_argument("model", help="a name of `python -m engine.checkpoint list` or a .gguf file")
    hf.add_argument("out", type=Path)
    gg = sub.add_parser("gguf", help="a Hugging Face folder -> a GGUF file (for llama.cpp)")
    gg.add_argument("hf_dir", type=Path)
    gg.add_argument("out", type=Path)
    gg.add_argument("--outtype", default="f32", choices=["f32", "f16", "bf16", "q8_0"])
    gg.add_argument("--converter", type=Path, required=True, help="llama.cpp's convert_hf_to_gguf.py")
    gg.add_argument("--any-pre-tokenizer", action="store_true",
                    help="write llama.cpp's default pre-tokenizer where the converter does not know the vocabulary's")
    args = ap.parse_args(argv)
    if args.command == "hf":
        print(f"written: {hf_folder(args.model, args.out)}")
    else:
        if not args.converter.is_file():
            raise SystemExit(f"no converter at {args.converter}")
        print(f"written: {gguf_file(args.hf_dir, args.out, args.outtype, args.converter, args.any_pre_tokenizer)}")


if __name__ == "__main__":
    main()
