"""Tokenizer and chat template (from the checkpoint's own files, or a GGUF file's metadata), and an
incremental detokenizer that never splits a multi-byte UTF-8 character."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.checkpoint.errors import ModelLoadError
from engine.checkpoint.gguf_deepseek2 import load_tokenizer as load_deepseek2_tokenizer
from engine.token_bytes import byte_label


# Converting a GGUF file's vocabulary is slow for a large one (Gemma 3's 262k tokens): each file's
# tokenizer is built once per process, keyed by (path, mtime, size), and kept on disk.
_gguf_tokenizers: dict[tuple[str, int, int], Any] = {}
_GGUF_CACHE_SIZE = 4


class Tokenizer:
    def __init__(self, path: Path) -> None:
        if path.is_file():  # a GGUF file holds its vocabulary and chat template as metadata
            self.hf = _gguf_tokenizer(path)
        else:
            if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
                raise ModelLoadError(f"missing tokenizer files (tokenizer.json or tokenizer.model) in {path}")
            from transformers import AutoTokenizer
            try:
                self.hf = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
            except Exception as e:
                raise ModelLoadError(f"cannot load the tokenizer in {path}: {_line(e)}") from e
        self.vocab_size = len(self.hf)
        self.special_ids = set(self.hf.all_special_ids) | {
            i for i, t in self.hf.added_tokens_decoder.items() if t.special}
        self.has_chat_template = bool(self.hf.chat_template)
        self._texts: dict[int, str] = {}
        self._labels: dict[int, str] = {}
        # The Rust tokenizer itself where transformers' decode adds nothing to it (no clean-up of
        # spaces): the streamed text is the same, at a third of the cost (twice per new token)
        backend = getattr(self.hf, "_tokenizer", None)
        self._backend = backend if backend is not None and hasattr(backend, "decode") \
            and not getattr(self.hf, "clean_up_tokenization_spaces", True) else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.has_chat_template:
            raise ValueError("this model's tokenizer has no chat template; send a plain prompt instead")
        return self.hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        # The template already writes BOS and role markers.
        return self.encode(self.apply_chat_template(messages), add_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        """One token's text, special tokens included (cached: traces ask for it per step)."""
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.hf.decode([token_id], skip_special_tokens=False)
        return text

    def token_label(self, token_id: int) -> str:
        """One token as the page shows it: its text, or the bytes of a piece of a character."""
        label = self._labels.get(token_id)
        if label is None:
            label = self._labels[token_id] = byte_label(
                self.token_text(token_id), self.hf.convert_ids_to_tokens(token_id))
        return label

    def pieces(self, ids: list[int]) -> list[dict]:
        """Each token as the model sees it: raw piece, readable text, special flag."""
        raw = self.hf.convert_ids_to_tokens(ids)
        return [{"id": i, "piece": p, "text": byte_label(self.hf.decode([i]), p), "special": i in self.special_ids}
                for i, p in zip(ids, raw)]


def _gguf_tokenizer(path: Path):
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _gguf_tokenizers:
        if len(_gguf_tokenizers) >= _GGUF_CACHE_SIZE:
            del _gguf_tokenizers[next(iter(_gguf_tokenizers))]
        _gguf_tokenizers[key] = _converted_tokenizer(path, key)
    return _gguf_tokenizers[key]


def _converted_tokenizer(path: Path, key: tuple[str, int, int]):
    """transformers converts the tokenizer.ggml.* vocabulary and reads tokenizer.chat_template.
    The result is also saved on disk (tokenizer.json, quick to load), so the
    next start-up on the same file skips the conversion."""
    from transformers import AutoTokenizer
    saved = _tokenizer_cache_dir(path, key)
    if (saved / "tokenizer.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(saved), trust_remote_code=False)
        except Exception:  # a damaged or foreign cache entry: convert again
            pass
    try:
        hf = load_deepseek2_tokenizer(path) or \
            AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)
    except Exception as e:
        raise ModelLoadError(f"cannot load the tokenizer in {path}: {_line(e)}") from e
    try:  # written to a side folder, then renamed: a half-written entry is never read
        tmp = saved.with_name(saved.name + f".tmp{os.getpid()}")
        hf.save_pretrained(str(tmp))
        tmp.replace(saved)
    except OSError:
        pass  # a read-only cache only costs the conversion next time
    return hf


def _tokenizer_cache_dir(path: Path, key: tuple[str, int, int]) -> Path:
    root = Path(os.environ.get("TOKENTRACE_CACHE") or Path.home() / ".cache" / "tokentrace" / "models")
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    return root / ".tokenizers" / f"{path.stem}-{digest}"


def _line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


@dataclass
class IncrementalDetokenizer:
    """Turns a growing list of ids into text deltas. Decoding a window that starts a
    few tokens back keeps word-boundary spaces right; a trailing U+FFFD means the
    last token ended inside a multi-byte character, so that text waits."""
    tokenizer: Tokenizer
    ids: list[int]
    prefix_offset: int
    read_offset: int

    @classmethod
    def start(cls, tokenizer: Tokenizer, prompt_ids: list[int]) -> "IncrementalDetokenizer":
        n = len(prompt_ids)
        tail = list(prompt_ids[max(0, n - 4):])
        return cls(tokenizer, tail, 0, len(tail))

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset])
        after = self.tokenizer.decode(self.ids[self.prefix_offset:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return after[len(before):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        before = self.tokenizer.decode(self.ids[self.prefix_offset:self.read_offset])
        after = self.tokenizer.decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return after[len(before):] if after.startswith(before) else ""
