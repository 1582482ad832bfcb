"""Issue 42 items 4 and 6: a Chinese prompt's tokens drawn as characters on each of the three
models, from their real tokenizers: the embedded model (byte-level BPE: every character three
byte pieces, through the engine's own trace), SmolLM2 (byte-level BPE: some characters whole,
some split) and Gemma 3 (whole Chinese words in one token; byte fallback for a rare character)."""
from __future__ import annotations

import re

from engine.llm_engine import DEFAULT_MODEL, LLMEngine
from engine.sampling_params import SamplingParams
from engine.tokenizer import Tokenizer
from engine.trace.tracer import EventList, Tracer
from tests.real_models import cached_gguf
from visualizers.char_runs import is_cjk
from visualizers.tokens import tokens_html

SYSTEM, USER = "你是一个简洁的助手。", "用一句话解释 KV 缓存。"


def drawn(html: str) -> str:
    """The text the panel draws, in order: each character box, and each chip that needs none."""
    found = re.findall(r'class="tt-char"[^>]*>([^<]*)</span>|class="tt-chip[^"]*"[^>]*>([^<]*)<sub>', html)
    return "".join(box or chip for box, chip in found)


def chinese(text: str) -> str:
    return "".join(ch for ch in text if is_cjk(ch))


def panel(tok: Tokenizer, ids: list[int]) -> str:
    toks = tok.pieces(ids)
    return tokens_html({"tokens": toks, "count": len(toks), "vocab_size": tok.vocab_size})


def test_the_embedded_model_s_trace_draws_each_character_over_its_three_byte_pieces():
    sink = EventList()
    engine = LLMEngine(DEFAULT_MODEL, device="cpu", tracer=Tracer(sink), trace_level="basic")
    rid = engine.add_request(None, SamplingParams(temperature=0, max_tokens=1),
                             messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}])
    while engine.has_unfinished_requests():
        engine.step()
    event = next(e.data for e in sink.of(rid) if e.type == "tokenize")
    html = tokens_html(event)
    assert chinese(drawn(html)) == chinese(SYSTEM + USER)
    assert 'title="句 U+53E5: 3 bytes over 3 tokens"' in html and "tt-char-bad" not in html
    assert "<b>19</b> characters in <b>57</b> tokens (<b>0.3</b> characters a token" in html


def test_smollm2_draws_split_characters_over_their_pieces_and_keeps_whole_ones():
    tok = Tokenizer(cached_gguf("smollm2"))
    html = panel(tok, tok.encode_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]))
    assert chinese(drawn(html)) == chinese(SYSTEM + USER)
    assert 'title="句 U+53E5: 3 bytes over 2 tokens"' in html and ">用<sub>23088</sub>" in html  # split; whole
    assert ">一个<sub>" in html and "10 split into byte pieces" in html and "tt-char-bad" not in html


def test_gemma3_keeps_whole_chinese_words_in_one_chip():
    tok = Tokenizer(cached_gguf("gemma3-270m"))  # its GGUF has no chat template: a plain prompt
    html = panel(tok, tok.encode(SYSTEM + USER))
    assert chinese(drawn(html)) == chinese(SYSTEM + USER)
    assert "tt-run" not in html and ">句话<sub>" in html and ">缓存<sub>" in html
    assert "<b>19</b> characters in <b>12</b> tokens (<b>1.6</b> characters a token" in html  # SmolLM2: 0.6
    assert '6 tokens of several whole characters: <span class="tt-chip tt-word">是一个</span>' in html


def test_gemma3_falls_back_to_bytes_for_a_rare_character_and_draws_it_over_them():
    tok = Tokenizer(cached_gguf("gemma3-270m"))
    html = panel(tok, tok.encode("龘是", add_special_tokens=False))  # 龘: not in its vocabulary
    assert chinese(drawn(html)) == "龘是" and 'title="龘 U+9F98: 3 bytes over 3 tokens"' in html
    assert '<span class="tt-hex">E9</span><sub>471</sub>' in html
