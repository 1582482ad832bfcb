"""SkipBlocks (app/page/skips.py): a streamed update that names a few of its event's outputs
comes out exactly as Gradio's own postprocess_data makes it, without building a component
for every output it leaves alone (that cost Send's updates ~0.1-0.2 s each)."""
from __future__ import annotations

import asyncio

import gradio as gr
import pytest
from gradio.state_holder import SessionState

from app.page import layout
from app.page.skips import SkipBlocks


def page_of(kind):
    """A page with 34 outputs on one event (as Send has 81) and that event."""
    with kind() as page:
        html = [gr.HTML(f"<p>{i}</p>") for i in range(30)]
        box = gr.Textbox("status")
        stop = gr.Button("Stop", variant="secondary")
        with gr.Column() as col:
            gr.Markdown("inside")
        num = gr.Number(3)
        go = gr.Button("go")
        outputs = html + [box, stop, col, num]
        go.click(lambda: None, None, outputs, api_name="go")
    fn = next(f for f in page.fns.values() if f.api_name == "go")
    return page, fn, html, box, stop, col, num


def updates(html, box, stop, col, num):
    """A streaming update: two panels, the status, Stop's look, the others left alone."""
    return [{html[3]: "<b>new &lt;3</b>", html[7]: "<i>x</i>", box: "req-1: streaming", stop: gr.update(variant="primary")},
            {html[0]: "<p>again</p>", col: gr.update(visible=False), num: 7},
            {html[5]: "only one"},
            {box: gr.update()}]


@pytest.mark.parametrize("case", range(4))
def test_an_update_comes_out_as_gradio_makes_it(case):
    ours, fn, *parts = page_of(SkipBlocks)
    plain, plain_fn, *plain_parts = page_of(gr.Blocks)
    mine = updates(*parts)[case]
    theirs = updates(*plain_parts)[case]
    got = asyncio.run(ours.postprocess_data(fn, mine, SessionState(ours)))
    want = asyncio.run(plain.postprocess_data(plain_fn, theirs, SessionState(plain)))
    assert got == want
    assert len(got) == len(fn.outputs)


def test_the_outputs_left_alone_build_no_component(monkeypatch):
    page, fn, html, box, stop, col, num = page_of(SkipBlocks)
    built = []
    plain_init = gr.HTML.__init__

    def init(self, *args, **kwargs):
        built.append(1)
        plain_init(self, *args, **kwargs)
    monkeypatch.setattr(gr.HTML, "__init__", init)
    asyncio.run(page.postprocess_data(fn, {html[1]: "<p>one</p>", box: "s"}, SessionState(page)))
    assert built == []  # gr.Blocks builds one gr.HTML for each of the 29 panels left alone


def test_the_page_is_built_on_skip_blocks():
    import inspect
    assert "SkipBlocks(" in inspect.getsource(layout.build_page)
