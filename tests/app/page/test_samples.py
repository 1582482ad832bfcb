"""Issue 42 item 4: sample prompts under the prompt box, the article's own request and Chinese
ones; a pick fills the system prompt and the question."""
from __future__ import annotations

from app.__main__ import build_services, parse_args
from app.page.layout import build_page
from app.page.samples import SAMPLES, picked


def test_the_samples_hold_the_article_s_request_and_a_chinese_one():
    asked = {(system, user) for _, system, user in SAMPLES}
    assert ("You are a concise assistant.", "Explain the KV cache in one sentence.") in asked
    assert ("你是一个简洁的助手。", "用一句话解释 KV 缓存。") in asked


def test_a_pick_fills_the_system_prompt_and_the_question():
    system, user = picked(SAMPLES[1][0])
    assert (system["value"], user["value"]) == SAMPLES[1][1:]
    assert picked(None) == picked("no such sample") and "value" not in picked(None)[0]


def test_the_live_page_wires_the_picker_to_both_boxes():
    models = build_services(parse_args(["--draft", "none", "--num-kv-blocks", "16", "--db", "none"]),
                            say=lambda _: None)
    page = build_page(models)
    ids = {c["id"]: c.get("props", {}).get("elem_id") for c in page.config["components"]}
    comps = {c.get("props", {}).get("elem_id"): c["props"] for c in page.config["components"]}
    assert [c[0] for c in comps["tt-samples"]["choices"]] == [label for label, _, _ in SAMPLES]
    wired = [d for d in page.config["dependencies"]
             if any(ids.get(t[0]) == "tt-samples" for t in d["targets"])]
    assert len(wired) == 1 and {ids[o] for o in wired[0]["outputs"]} == {"tt-system", "tt-user"}
