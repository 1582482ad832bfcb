"""Blocks whose streamed updates cost what they change, not what the event could change.

A handler that yields {component: value} for a few of its event's outputs leaves the rest as
Gradio's bare skip ({"__type__": "update"}), and Gradio's Blocks.postprocess_data turns each
bare skip into a brand-new component (constructor, signature inspection, config) before it
sends {"__type__": "update"}, the same "no change" it was given. Send's event has 81 outputs
(the page's API) and a streaming update changes ~16: measured on 2 busy cores, one update's
postprocess took 190-210 ms with 81 outputs and 20-24 ms with 30 (benchmarks.measure cuts the
lag in three: this is most of "yield -> message in the browser"). SkipBlocks hands Gradio only
the outputs an update names and puts the bare skips back as Gradio would have sent them
(tests/app/page/test_skips.py holds the two equal)."""
from __future__ import annotations

import copy

import gradio as gr
from gradio.blocks import Block, convert_component_dict_to_list

SKIP = {"__type__": "update"}  # an output left unchanged, as a handler gives it and Gradio sends it


def skipped(block) -> dict:
    """What Gradio's own postprocess_data sends for a bare skip of this block: a gr.HTML's
    comes out with the "__type__" key again under "props" (postprocess_update_dict counts every
    key that is not an HTML constructor parameter as a prop)."""
    return {"props": dict(SKIP), **SKIP} if isinstance(block, gr.HTML) else dict(SKIP)


def bare_skip(value) -> bool:
    return isinstance(value, dict) and value == SKIP


class SkipBlocks(gr.Blocks):
    async def postprocess_data(self, block_fn, predictions, state):
        outputs = list(block_fn.outputs)
        preds = predictions
        if isinstance(preds, dict) and preds and all(isinstance(k, Block) for k in preds):
            preds = convert_component_dict_to_list(outputs, preds)
        if block_fn.batch or len(outputs) < 2 or not isinstance(preds, (list, tuple)) or len(preds) != len(outputs):
            return await super().postprocess_data(block_fn, predictions, state)
        keep = [i for i, (b, p) in enumerate(zip(outputs, preds)) if not (bare_skip(p) and not b.stateful)]
        if len(keep) == len(outputs):
            return await super().postprocess_data(block_fn, preds, state)
        out = [skipped(b) for b in outputs]
        if not keep:
            return out
        part = copy.copy(block_fn)  # the same event, narrowed to the outputs this update names
        part.outputs = [outputs[i] for i in keep]
        # one output left: Gradio wraps a single output's value in a list itself
        got = await super().postprocess_data(part, preds[keep[0]] if len(keep) == 1 else [preds[i] for i in keep],
                                             state)
        for i, value in zip(keep, got):
            out[i] = value
        return out
