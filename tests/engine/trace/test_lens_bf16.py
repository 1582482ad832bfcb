"""The logit lens at bfloat16 (engine/trace/logit_lens.py): its rows ride in the model's own pass
over the LM head, x kept to 16 mantissa bits (tt_linear_bf16_exact), so their chosen-token ranks
are the exact lens's; the model's own rows are what an untraced pass computes, bit for bit."""
from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from engine import LLM
from engine.trace import logit_lens


def test_lens_rows_exact_and_the_models_rows_untouched(checkpoint, cpu_kernels_switch):
    cpu_kernels_switch(True)
    llm = LLM(checkpoint("llama"), device="cpu", dtype="bfloat16")
    model = llm.engine.runner.model
    head = model.lm_head
    assert head.blocked is not None and head.blocked.dtype == torch.bfloat16
    g = torch.Generator().manual_seed(0)
    inner, hidden = torch.randn(6, head.in_features, generator=g), torch.randn(2, head.in_features, generator=g)
    capture = SimpleNamespace(lens_hidden=[inner], ready=lambda: False)  # what a traced pass keeps (trace/capture.py)
    own = logit_lens.logits_with_lens(model, hidden, capture)
    assert torch.equal(own, model.compute_logits(hidden))  # the sampled rows as untraced
    lens = capture.lens_logits[:6].double()
    w = head.blocked.unblocked().double()
    normed = model.model.norm(inner)
    exact, rounded = F.linear(normed.double(), w), F.linear(normed.to(torch.bfloat16).double(), w)
    assert (lens - exact).abs().max() < (rounded - exact).abs().max() / 20
    assert torch.equal(lens.argmax(dim=-1), exact.argmax(dim=-1))
