"""A token that is a piece of a character (byte-level BPE, SentencePiece byte fallback) is
labelled by its bytes, <0xF0><0x9F>, not by the U+FFFD its lone decoding gives."""
from engine.llm_engine import DEFAULT_MODEL, LLMEngine
from engine.sampling_params import SamplingParams
from engine.token_bytes import byte_label, piece_bytes
from engine.tokenizer import Tokenizer
from engine.trace.tracer import EventList, Tracer
from tests.real_models import cached_gguf

TEXT = "🙂 مرحبا 中文"


def labels_rebuild(tok: Tokenizer, text: str) -> list[str]:
    """The labels of `text`'s tokens, after checking that their bytes put back together are the
    text's own UTF-8 (a <0xNN> stands for its byte, anything else for its UTF-8)."""
    labels = [tok.token_label(i) for i in tok.encode(text, add_special_tokens=False)]
    parts = [bytes([int(p[3:5], 16)]) if p.startswith("<0x") else p.encode()
             for label in labels for p in _split(label)]
    assert b"".join(parts) == text.encode()
    return labels


def _split(label: str) -> list[str]:
    out, i = [], 0
    while i < len(label):
        if label.startswith("<0x", i) and label[i + 5:i + 6] == ">":
            out.append(label[i:i + 6])
            i += 6
        else:
            out.append(label[i])
            i += 1
    return out


def test_the_embedded_tokenizer_labels_each_byte_of_an_emoji():
    tok = Tokenizer(DEFAULT_MODEL)
    labels = labels_rebuild(tok, TEXT)
    assert labels[:4] == ["<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]  # 🙂 is F0 9F 99 82
    assert not any("\ufffd" in label for label in labels)


def test_smollm2_labels_pieces_of_characters_and_keeps_whole_ones():
    tok = Tokenizer(cached_gguf("smollm2"))
    labels = labels_rebuild(tok, TEXT)
    assert labels[:2] == ["<0xF0><0x9F>", "<0x99><0x82>"] and " م" in labels and "中" in labels


def test_sentencepiece_byte_pieces_and_plain_text():
    assert piece_bytes("<0xEA>") == b"\xea" and byte_label("\ufffd", "<0xEA>") == "<0xEA>"
    assert byte_label("Paris", "ĠParis") == "Paris"  # whole text is left as it is
    assert byte_label("\ufffd", "▁\ufffd") == "\ufffd"  # bytes not known from the piece: unchanged


def test_the_trace_carries_the_byte_labels():
    sink = EventList()
    engine = LLMEngine(DEFAULT_MODEL, device="cpu", tracer=Tracer(sink), trace_level="basic")
    rid = engine.add_request("🙂", SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    tokens = next(e.data["tokens"] for e in sink.of(rid) if e.type == "tokenize")
    assert [t["text"] for t in tokens if t["text"].startswith("<0x")] == ["<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]
