"""A byte-level BPE tokenizer (GPT-2 style) trained with `tokenizers`, wrapped
as a `PreTrainedTokenizerFast` with special role tokens and a chat template.

Byte-level means every string can be encoded (no unknown token): the base
alphabet is the 256 bytes, and merges are learned on the training split only.
"""
from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

PAD, BOS, END = "<|pad|>", "<|bos|>", "<|end|>"
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
SPECIAL_TOKENS = [PAD, BOS, END, *ROLE_TOKENS.values()]  # ids 0..5, in this order

# Every turn is `<|role|>\n{content}<|end|>\n`; the prompt starts with <|bos|>.
# <|end|> ends a turn and is the eos token, so generation stops after the
# assistant's answer. `add_generation_prompt` opens the assistant's turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # Like Llama: plain `tokenizer(text)` starts with <|bos|>; the chat template
    # writes its own <|bos|> and apply_chat_template adds no special tokens.
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return wrap(tok)


def wrap(tok: Tokenizer) -> PreTrainedTokenizerFast:
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=END,
        pad_token=PAD,
        additional_special_tokens=list(ROLE_TOKENS.values()),
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(tok: PreTrainedTokenizerFast, out_dir) -> None:
    """save_pretrained, then put the chat template inside tokenizer_config.json
    (older loaders and other engines look for it there, not in a .jinja file),
    name the plain fast-tokenizer class so no custom code is needed, and list
    the role tokens under `additional_special_tokens`.

    transformers 5 saves them as a list under `extra_special_tokens`, a form
    transformers 4 cannot read (there that key must be a dict of named tokens,
    and `from_pretrained` fails with "'list' object has no attribute 'keys'").
    `additional_special_tokens` is read by both: 4.x natively, 5.x as the
    legacy name of the same list."""
    import json
    from pathlib import Path

    out = Path(out_dir)
    tok.save_pretrained(out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in ("is_local", "local_files_only"):  # loader state that a reloaded tokenizer carries
        cfg.pop(key, None)
    roles = list(ROLE_TOKENS.values())
    extra = cfg.get("extra_special_tokens")
    if isinstance(extra, list):  # transformers 5: rename it in place, same position in the file
        assert extra == roles, extra
        cfg = {("additional_special_tokens" if k == "extra_special_tokens" else k): v for k, v in cfg.items()}
    elif not extra:  # transformers 4 writes an empty dict
        cfg.pop("extra_special_tokens", None)
    cfg["additional_special_tokens"] = roles
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg["add_bos_token"] = True
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
