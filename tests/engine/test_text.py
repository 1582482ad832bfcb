"""Detokenization across multi-byte UTF-8, stop conditions, chat template, context limit."""
import json
import shutil

import pytest

from engine import LLM, SamplingParams
from engine.tokenizer import IncrementalDetokenizer, Tokenizer
from tests.engine_utils import DEVICE

TEXT = "Héllo wörld, naïve café 日本語 ✓ 🙂!"


@pytest.fixture(scope="module")
def llm(checkpoint):
    return LLM(checkpoint("qwen3"), device=DEVICE, block_size=4)


def byte_tokens(tok: Tokenizer, text: str) -> list[int]:
    """One token per UTF-8 byte (byte-level alphabet), so characters span tokens."""
    vocab = tok.hf.get_vocab()
    bytes_to_unicode = _bytes_to_unicode()
    return [vocab[bytes_to_unicode[b]] for b in text.encode("utf-8")]


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable character table (used by ByteLevel BPE).
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def test_streaming_never_splits_a_character(llm):
    tok = llm.tokenizer
    ids = byte_tokens(tok, TEXT)
    assert len(ids) == len(TEXT.encode("utf-8")) > len(TEXT)
    detok = IncrementalDetokenizer.start(tok, [5, 6, 7])
    deltas = [detok.push(i) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == TEXT
    assert deltas[len("Héllo wörld, naïve café ".encode()) + 1] == ""  # inside 日: held back


def test_merged_tokens_stream_the_same(llm):
    tok = llm.tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False)
    detok = IncrementalDetokenizer.start(tok, [])
    assert "".join(detok.push(i) for i in ids) + detok.flush() == TEXT


def test_stop_string_cuts_the_text_and_is_never_streamed(llm):
    prompt = list(range(10, 30))
    free = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))[0]
    text = free.text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert len(stop) == 3 and stop.strip()
    cut = text[: text.find(stop)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=[stop])
    streamed = []
    for item in llm.stream(prompt, params, trace="off"):
        if type(item).__name__ == "TokenOutput":
            streamed.append(item.text)
        last = item
    assert last.finish_reason == "stop" and last.text == cut
    assert "".join(streamed) == cut
    assert len(last.token_ids) < 40
    with_stop = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                                     stop=[stop], include_stop_str_in_output=True))[0]
    assert with_stop.text == cut + stop


def test_stop_token_and_eos(llm, checkpoint):
    prompt = list(range(10, 30))
    free = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0].token_ids
    third = free[2]
    out = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[third]))[0]
    assert out.finish_reason == "stop" and out.token_ids == free[: free.index(third) + 1]
    eos = llm.engine.model_config.eos_token_ids  # changed in place: the list the engine's ends read
    saved, eos[:] = list(eos), [third]
    try:
        stopped = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20))[0]
        assert stopped.finish_reason == "stop" and stopped.token_ids == free[: free.index(third) + 1]
        ignored = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0]
        assert ignored.finish_reason == "length" and ignored.token_ids == free
    finally:
        eos[:] = saved


def test_eos_ids_come_from_generation_config(checkpoint, tmp_path):
    path = tmp_path / "ckpt"
    shutil.copytree(checkpoint("qwen3"), path)
    assert json.loads((path / "config.json").read_text())["eos_token_id"] == 1
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 3]}))
    llm = LLM(path, device=DEVICE)
    assert llm.engine.model_config.eos_token_ids == [2, 3]  # generation_config wins over config.json
    free = llm.generate(list(range(10, 30)), SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": free.token_ids[4]}))
    out = LLM(path, device=DEVICE).generate(list(range(10, 30)), SamplingParams(temperature=0, max_tokens=12))[0]
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[: free.token_ids.index(free.token_ids[4]) + 1]


def test_generate_from_text(llm):
    text = "the quick brown fox"
    out = llm.generate(text, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    assert out.prompt_token_ids == llm.tokenizer.encode(text) and len(out.token_ids) == 6
    batch = llm.generate([text, llm.tokenizer.encode(text)], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert batch[0].token_ids == batch[1].token_ids == out.token_ids
    assert out.text == llm.tokenizer.decode(out.token_ids)


def test_chat_template_marks_roles(llm):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = llm.tokenizer.apply_chat_template(msgs)
    assert rendered == "<s><|system|>Be brief.</s><|user|>Hi</s><|assistant|>"
    out = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert out.prompt == rendered and out.prompt_token_ids[0] == 0 and len(out.token_ids) == 5
    pieces = llm.tokenizer.pieces(out.prompt_token_ids)
    assert [p["piece"] for p in pieces if p["special"]] == ["<s>", "</s>", "<|user|>", "</s>", "<|assistant|>"]
    assert "".join(p["text"] for p in pieces if not p["special"]) == "<|system|>Be brief.Hi"


def test_prompt_too_long_and_bad_prompts(llm):
    with pytest.raises(ValueError, match="prompt has 256 tokens but this model's context is 256"):
        llm.generate([5] * 256)
    with pytest.raises(ValueError, match="empty"):
        llm.generate("")
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 320\)"):
        llm.generate([5, 999])
    with pytest.raises(ValueError, match="role"):
        llm.chat([{"role": "wizard", "content": "x"}])
    assert not llm.engine.has_unfinished_requests()


def test_generation_stops_at_the_context_end(llm):
    out = llm.generate([5] * 250, SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 6
