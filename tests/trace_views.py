"""A small traced request as the page's LiveView sees it, shared by the visualizer and page
tests: a 4-token prompt (" The capital is"), two generated tokens (" Paris", "."), two layers
(one local), two heads over one KV head, MoE routing, the lens and the sampling of each pass;
and the same request stopped before the scheduler ran it."""
from __future__ import annotations

from app.page.live_view import LiveView
from visualizers.kv_cache import empty_pool

LABELS = ["<s>", "The", " capital", " is", " Paris", ".", "<eos>"]
PROMPT = 4
MODEL = {"name": "m", "block_size": 2, "num_blocks": 8, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1,
         "head_dim": 4, "dtype": "float32", "dtype_bytes": 4, "kv_cache_bytes": 1024, "is_moe": True,
         "has_draft": False, "sliding_windows": [None, 2], "vocab_size": 50, "hidden_size": 8}


def _probs(rows: range, keys: range, heads: int = 2) -> list:
    """Each query's weights: its own key holds 0.5 + 0.1 * head, the rest share what is left."""
    out = []
    for h in range(heads):
        mat = []
        for q in rows:
            n = q - keys.start + 1
            own = 0.5 + 0.1 * h
            mat.append([own if k == q else ((1 - own) / (n - 1) if k < q else 0.0) for k in keys][:len(keys)])
        out.append(mat)
    return out


def events(k_start: int = 0) -> list[dict]:
    evs = [{"type": "tokenize", "step": 1, "count": PROMPT,
            "tokens": [{"id": i, "piece": t, "text": t, "special": i == 0} for i, t in enumerate(LABELS[:PROMPT])]},
           {"type": "kv.alloc", "step": 1, "blocks": [3, 5, 6, 7], "table": [3, 5, 6, 7]}]
    passes = [(0, PROMPT, "prefill", 1), (4, 1, "decode", 2), (5, 1, "decode", 3)]
    for q0, n, kind, step in passes:
        for layer in (0, 1):
            evs.append({"type": "attention", "step": step, "layer": layer, "kind": kind, "heads": [0, 1],
                        "num_heads": 2, "num_kv_heads": 1, "q_start": q0, "k_start": max(k_start if q0 else 0, 0),
                        "window": MODEL["sliding_windows"][layer],
                        "probs": _probs(range(q0, q0 + n), range(k_start if q0 else 0, q0 + n))})
            evs.append({"type": "moe", "step": step, "layer": layer, "start": q0, "num_experts": 4, "top_k": 2,
                        "experts": [[(q + layer) % 4, (q + 1) % 4] for q in range(q0, q0 + n)],
                        "weights": [[0.75, 0.25]] * n, "batch_load": [1, 1, 1, 1]})
        evs.append({"type": "embed", "step": step, "start": q0, "token_ids": list(range(q0, q0 + n)),
                    "shape": [n, 8], "dims": 3, "rows": [[q / 10, -q / 10, 0.5] for q in range(q0, q0 + n)]})
        drawn = q0 + n
        evs.append({"type": "sample", "step": step, "position": drawn, "source": "target", "method": None,
                    "candidates": [drawn, 40], "token_id": drawn, "token_prob": 0.9, "entropy": 0.3,
                    "params": {"temperature": 0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "greedy": True},
                    "stages": {"logits": {"probs": [0.9, 0.1], "kept": 50}}})
        evs.append({"type": "logit_lens", "step": step, "position": drawn, "source": "target", "token_id": drawn,
                    "token_text": LABELS[drawn],
                    "layers": [{"top_ids": [drawn], "top_texts": [LABELS[drawn]], "top_probs": [0.9],
                                "chosen_rank": 1, "chosen_prob": 0.9}] * 3})
    return evs


def view(evs: list[dict] | None = None) -> LiveView:
    v = LiveView(model=MODEL, piece=lambda i: LABELS[i] if i < len(LABELS) else f"<{i}>", is_special=lambda i: i == 6)
    v.request_id = "r1"
    pool = empty_pool(8, 2)
    pool["owners"], pool["fill"] = {b: ["r1"] for b in (3, 5, 6, 7)}, {3: 2, 5: 2, 6: 2, 7: 0}
    v.set_pool(pool)
    v.add(evs if evs is not None else events())
    v.add([{"type": "output", "token_id": i, "text": LABELS[i], "finished": False, "index": i - PROMPT, "t": 0.0}
           for i in range(PROMPT, len(LABELS))])
    return v


def never_ran(special: int = 6) -> LiveView:
    """A full-level request stopped before the scheduler admitted it: its arrival, its
    tokenization, the abort's finish and its end-of-stream output, no engine step."""
    v = LiveView(model=MODEL, piece=lambda i: LABELS[i] if i < len(LABELS) else f"<{i}>",
                 is_special=lambda i: i == special)
    v.request_id = "r1"
    v.set_pool(empty_pool(8, 2))
    usage = {"prompt_tokens": PROMPT, "completion_tokens": 0, "cached_tokens": 0}
    v.add([{"type": "request.arrive", "step": 0, "trace_level": "full", "messages": []}, events()[0],
           {"type": "finish", "step": 1, "reason": "abort", "usage": usage},
           {"type": "output", "token_id": -1, "text": "", "finished": True, "finish_reason": "abort", "index": 0,
            "t": 0.0, "step": 1, "usage": usage}])
    return v
