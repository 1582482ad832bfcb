"""Sample prompts under the prompt box: a pick fills the system prompt and the question. The
article's own request (what happens when you ask ChatGPT) in English and in Chinese, where the
Tokens panel shows characters split into byte pieces (SmolLM2, the embedded model) or whole
words (Gemma 3)."""
from __future__ import annotations

import gradio as gr

# (label, system prompt, question)
SAMPLES = (
    ("The article's request: the KV cache in one sentence", "You are a concise assistant.",
     "Explain the KV cache in one sentence."),
    ("中文：用一句话解释 KV 缓存", "你是一个简洁的助手。", "用一句话解释 KV 缓存。"),
    ("中文：什么是KV缓存？", "你是一个简洁的助手。", "什么是KV缓存？"),
    ("A short story about a fox", "You are a helpful assistant.", "Tell me a short story about a fox."),
)


def sample_picker(live: bool) -> gr.Dropdown:
    """The picker (under the prompt box); nothing picked at first."""
    return gr.Dropdown([label for label, _, _ in SAMPLES], value=None, label="Sample prompts",
                       elem_id="tt-samples", interactive=live, allow_custom_value=False)


def picked(label: str | None) -> tuple:
    """A pick -> (system prompt, question) updates; an unknown or empty pick changes nothing."""
    for name, system, user in SAMPLES:
        if name == label:
            return gr.update(value=system), gr.update(value=user)
    return gr.update(), gr.update()


def wire_samples(ui: dict):
    """A pick fills the boxes; -> the event, for what follows it."""
    return ui["samples"].input(picked, [ui["samples"]], [ui["system"], ui["user"]], concurrency_limit=None,
                        api_visibility="private", show_progress="hidden")
