"""The page with several models, in a real Chromium: the picker lists each with a short
description, picking one redraws every panel with that model's shapes (layers, heads,
vocabulary, dense or MoE), Send goes to the picked model, a base model gets plain-prompt
mode, and Watch follows requests to any model.

The shapes are the hard cases for the panels: a 30-layer model with 9 query / 3 KV heads and
a 49,152-token vocabulary (SmolLM2-135M's), and an 18-layer base model with a 262,144-token
vocabulary (Gemma 3 270M's), both tiny and random. Skips without Chromium unless
TOKENTRACE_REQUIRE_BROWSER=1 (see tests/browser_utils.py)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import pytest

from app.__main__ import build_services, parse_args
from tests.browser_utils import browser_or_skip, open_page, set_controls, wait_finished
from tests.service_utils import served

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword")]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def save_wide_tokenizer(path: Path, vocab_size: int, chat: bool) -> None:
    """A byte-level tokenizer whose every id decodes to text: the 256 bytes, four specials,
    then words " w<id>" up to vocab_size (a random model samples ids from all of them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    specials = ["<s>", "</s>", "<|user|>", "<|assistant|>"]
    vocab = {t: i for i, t in enumerate(specials + alphabet)}
    for i in range(len(vocab), vocab_size):
        vocab[f"Ġw{i}"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(path))


def make_wide_model(path: Path, layers: int, heads: int, kv_heads: int, vocab: int, chat: bool = True,
                    head_dim: int = 8, seed: int = 0) -> Path:
    """A tiny random Llama with a real model's layer count, head layout and vocabulary."""
    import torch
    import transformers

    from tests.tiny import scale_weights
    if (path / "config.json").is_file():
        return path
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=heads * head_dim, intermediate_size=96,
                                   num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                   max_position_embeddings=512, bos_token_id=0, eos_token_id=1, pad_token_id=None,
                                   tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    scale_weights(model, seed)
    with torch.no_grad():  # a softer LM head than unit scale: several candidates survive top-p
        model.get_input_embeddings().weight.mul_(1 / math.sqrt(heads * head_dim))
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    save_wide_tokenizer(path, vocab, chat)
    return path


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("wide")
    return {"smol-shape": make_wide_model(root / "smol-shape", 30, 9, 3, 49_152),
            "gemma-shape": make_wide_model(root / "gemma-shape", 18, 4, 1, 262_144, chat=False, head_dim=16)}


@pytest.fixture(scope="module")
def server(checkpoint, wide, tmp_path_factory):
    browser_or_skip()
    models = build_services(parse_args(["--model", str(checkpoint("mixtral")), "--draft", str(checkpoint("mistral")),
                                        "--served-model-name", "tiny-moe", "--model", str(wide["smol-shape"]),
                                        "--draft", "ngram", "--model", str(wide["gemma-shape"]),
                                        "--num-kv-blocks", "96", "--num-speculative-tokens", "3"]),
                            say=lambda line: None)
    with served(models, tmp_path_factory) as srv:
        yield srv


def pick(page, label: str) -> None:
    """Pick the model of the picker's line `label` (its served name comes first)."""
    page.click("#tt-model input")
    page.wait_for_timeout(200)
    page.get_by_role("option", name=label).click()
    name = label.split(" — ")[0]
    page.wait_for_function(f"document.querySelector('#tt-status textarea').value.startsWith({json.dumps(name)})")
    page.wait_for_timeout(300)


def options(page, elem_id: str) -> list[str]:
    page.click(f"#{elem_id} input")
    page.wait_for_timeout(200)
    items = page.get_by_role("option").all_inner_texts()
    page.click(".tt-header h1")  # closes the list
    page.wait_for_timeout(200)
    return [i.strip().split("\n")[-1].strip() for i in items]  # the selected one starts with a "✓" line


def text(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id}").inner_text()


def test_the_picker_redraws_every_panel_for_the_picked_model(server, browser, shots):
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    page = open_page(context, server.url)
    listed = options(page, "tt-model")
    assert len(listed) == 3
    assert listed[0].startswith("tiny-moe — MixtralForCausalLM · 3 layers · heads 4q/2kv · vocab 320 · MoE 4 experts")
    assert listed[1] == ("smol-shape — LlamaForCausalLM · 30 layers · heads 9q/3kv · vocab 49,152 · dense · "
                         "n-gram drafts")
    assert listed[2].startswith("gemma-shape — LlamaForCausalLM · 18 layers · heads 4q/1kv · vocab 262,144")
    assert "base model (plain prompt)" in listed[2]
    assert "python -m app --model smollm2" in text(page, "tt-model-note")  # how to open a real model
    assert page.locator("#tt-moe").is_visible()

    pick(page, listed[1])
    assert options(page, "tt-layer") == [str(i) for i in range(30)]
    assert options(page, "tt-head") == [str(i) for i in range(9)]
    summary = text(page, "tt-model-summary")
    assert "30 layers" in summary and "9 query heads / 3 KV heads × 8" in summary and "vocab 49,152" in summary
    assert not page.locator("#tt-moe").is_visible()  # a dense model has no MoE panel
    assert "2 × 30 × 3 × 8 × tokens × 4 B" in text(page, "tt-kv")  # the KV formula with its numbers
    assert "49,152" in text(page, "tt-sampling")
    assert "n-gram" in text(page, "tt-controls")  # its drafts: prompt lookup

    set_controls(page, "Tell me about foxes and owls.", 24)
    page.click("#tt-send")
    status = wait_finished(page)
    assert "finished" in status
    page.screenshot(path=str(shots / "page_smol_shape.png"), full_page=True)
    assert '"model": "smol-shape"' in text(page, "tt-request")
    assert "vocabulary: 49,152" in text(page, "tt-tokens")
    assert "d_model 72" in text(page, "tt-embedding")
    attention = text(page, "tt-attention")
    assert "of 30 captured" in attention and "9 query heads share 3 KV heads (3 per KV head)" in attention
    assert page.locator("#tt-attention .tt-group").count() == 3
    assert page.locator("#tt-attention .tt-ov-heads span").count() == 9  # the overview: every query head
    assert "over 49,152 vocabulary entries" in text(page, "tt-sampling")
    rid = status.split(":")[0]
    assert server.models.owner(rid).model_name == "smol-shape"  # Send went to the picked engine
    # typed, not clicked: the 30th option of an open list can sit outside the viewport when the
    # page scrolls under it (seen on a busy machine)
    page.fill("#tt-layer input", "29")
    page.keyboard.press("Enter")
    page.wait_for_function("document.querySelector('#tt-attention').innerText.includes('layer 29 ')")
    for panel in ("tt-attention", "tt-kv", "tt-sampling", "tt-tokens", "tt-embedding", "tt-timeline"):
        box = page.locator(f"#{panel}").bounding_box()
        assert box["width"] > 200 and box["x"] + box["width"] <= 1500, panel  # on screen, not clipped off
    page.locator("#tt-attention").screenshot(path=str(shots / "attention_30_layers_9_3_heads.png"))

    # a base model: plain-prompt mode, said on the page, and the engine gets the prompt as is
    pick(page, listed[2])
    assert "Plain-prompt mode" in text(page, "tt-model-note")
    assert not page.locator("#tt-system textarea").is_editable()
    # no draft: the "Draft tokens k" slider (4, 1..4) is not shown beside the disabled checkbox
    # (S 1400 idle: it was, and at 420 px its label wrapped "Draft / tokens / k")
    assert not page.locator("#tt-speculative input").is_enabled() and not page.locator("#tt-k").is_visible()
    assert options(page, "tt-layer") == [str(i) for i in range(18)]
    set_controls(page, "Once upon a time", 16)
    page.click("#tt-send")
    status = wait_finished(page)
    page.screenshot(path=str(shots / "page_gemma_shape.png"), full_page=True)
    assert '"prompt": "Once upon a time"' in text(page, "tt-request") and '"messages"' not in text(page, "tt-request")
    tokens = text(page, "tt-tokens")
    assert "vocabulary: 262,144" in tokens and "chat template: no" in tokens
    assert "over 262,144 vocabulary entries" in text(page, "tt-sampling")
    assert "2 × 18 × 1 × 16 × tokens × 4 B" in text(page, "tt-kv")
    assert server.models.owner(status.split(":")[0]).model_name == "gemma-shape"
    page.locator("#tt-sampling").screenshot(path=str(shots / "sampling_262k_vocab.png"))

    # back to the MoE model: its panels, selectors and draft model return
    pick(page, listed[0])
    assert page.locator("#tt-moe").is_visible() and options(page, "tt-layer") == ["0", "1", "2"]
    assert page.locator("#tt-k").is_visible() and page.locator("#tt-k input[type=range]").is_enabled()
    assert page.locator("#tt-system textarea").is_editable()
    assert page.dialogs == [] and page.external == []
    context.close()


def test_watch_follows_requests_to_any_model(server, browser, shots):
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    page = open_page(context, server.url)
    page.click("#tt-watch")
    page.wait_for_function("document.querySelector('#tt-status textarea').value.startsWith('watching')")
    body = {"model": "smol-shape", "messages": [{"role": "user", "content": "Hello from curl"}], "max_tokens": 12,
            "temperature": 0, "trace_level": "full"}  # API requests default to "basic" (no tensors)
    r = httpx.post(server.url + "v1/chat/completions", json=body, timeout=120)
    rid = r.json()["id"]
    page.wait_for_function(f"document.querySelector('#tt-status textarea').value.includes('{rid} finished')",
                           timeout=120_000)
    page.wait_for_timeout(500)
    assert rid in text(page, "tt-request") and '"model": "smol-shape"' in text(page, "tt-request")
    assert page.locator("#tt-model input").input_value().startswith("smol-shape")  # the picker follows
    assert options(page, "tt-layer") == [str(i) for i in range(30)]
    assert "9 query heads share 3 KV heads" in text(page, "tt-attention")
    assert not page.locator("#tt-moe").is_visible()
    # the next request, to the MoE model, brings its shapes back
    body["model"] = "tiny-moe"
    rid = httpx.post(server.url + "v1/chat/completions", json=body, timeout=120).json()["id"]
    page.wait_for_function(f"document.querySelector('#tt-status textarea').value.includes('{rid} finished')",
                           timeout=120_000)
    page.wait_for_timeout(500)
    assert options(page, "tt-layer") == ["0", "1", "2"] and page.locator("#tt-moe").is_visible()
    assert page.locator("#tt-moe td.tt-pick").count() > 0
    page.screenshot(path=str(shots / "page_watching_moe.png"), full_page=True)
    page.click("#tt-stop")
    context.close()


OVERFLOW = """() => [...document.querySelectorAll('.tt-panel, .tt-panel table, .tt-panel img, .tt-panel svg, '
  + '.tt-sample-main, .tt-moe-wrap')].filter(el => el.getBoundingClientRect().width > 0).map(el => {
    const r = el.getBoundingClientRect();
    return [(el.closest('[id^=tt-]') || {}).id + ' ' + el.tagName + '.' + (el.getAttribute('class') || ''),
            Math.round(r.left), Math.round(r.right), el.scrollWidth - el.clientWidth];
  }).filter(([what, left, right, hidden]) => left < 0 || right > window.innerWidth || hidden > 1)"""


def box(page, selector: str) -> dict:
    return page.locator(selector).first.bounding_box()


def test_the_panels_fill_a_wide_screen_and_fit_a_phone(server, browser, shots):
    """Issue 13, item 9: no large empty area beside Attention or Sampling on a dense model, the
    sampling table whole on a 49k and a 262k vocabulary, and at 420 px every panel stacked with
    no table cut off."""
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    page = open_page(context, server.url)
    listed = options(page, "tt-model")
    pick(page, listed[1])  # dense, 30 layers, 9/3 heads, 49,152 tokens
    set_controls(page, "Tell me about foxes and owls.", 16)
    page.click("#tt-send")
    wait_finished(page)
    table, history = box(page, "#tt-sampling .tt-sample-main"), box(page, "#tt-sampling .tt-sample-history")
    assert history["x"] >= table["x"] + table["width"] and abs(history["y"] - table["y"]) < 40  # side by side
    page.screenshot(path=str(shots / "layout_dense_1500.png"), full_page=True)
    for width in (1500, 1920):  # the attention overview beside the map (no empty area), or under it
        page.set_viewport_size({"width": width, "height": 1100})
        page.wait_for_timeout(300)
        attn, ov = box(page, "#tt-attention .tt-attn-big"), box(page, "#tt-attention .tt-ov")
        beside = ov["x"] >= attn["x"] + attn["width"]
        assert beside or ov["y"] >= attn["y"] + attn["height"] - 1, (width, attn, ov)
        if beside:
            assert ov["height"] <= attn["height"] * 1.2, (width, attn, ov)
    page.set_viewport_size({"width": 1500, "height": 1100})
    page.wait_for_timeout(300)
    assert page.evaluate(OVERFLOW) == []
    pick(page, listed[2])  # 262,144 tokens: the tiniest probabilities are the widest numbers
    set_controls(page, "Once upon a time", 12)
    page.click("#tt-send")
    wait_finished(page)
    assert page.evaluate(OVERFLOW) == []
    context.close()

    phone = browser.new_context(viewport={"width": 420, "height": 900})
    page = open_page(phone, server.url)
    set_controls(page, "Tell me about foxes.", 16)  # the MoE model: MoE and Sampling share a row on a desktop
    page.click("#tt-send")
    wait_finished(page)
    moe, sampling = box(page, "#tt-moe"), box(page, "#tt-sampling")
    assert moe["y"] + moe["height"] <= sampling["y"] and abs(moe["x"] - sampling["x"]) < 2  # stacked
    assert page.evaluate(OVERFLOW) == []
    page.screenshot(path=str(shots / "layout_moe_420.png"), full_page=True)
    for label in listed[1:]:
        pick(page, label)
        set_controls(page, "Once upon a time", 12)
        page.click("#tt-send")
        wait_finished(page)
        assert page.evaluate(OVERFLOW) == [], label
    page.screenshot(path=str(shots / "layout_gemma_420.png"), full_page=True)
    phone.close()
