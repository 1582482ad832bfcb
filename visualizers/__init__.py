"""Pure drawing functions: trace events (plain dicts, as `TraceEvent.to_dict()` gives
them) in, escaped HTML out. They import nothing from `engine/` or `app/`, so a
recorded trace and a live run draw the same way, in the page or in a notebook."""
from visualizers._html import not_recorded
from visualizers.answer import answer_html
from visualizers.attention import attention_html, attention_matrix, layers_and_heads
from visualizers.disagg import disagg_html
from visualizers.embedding import embedding_html, embedding_matrix
from visualizers.kv_cache import (apply_kv_pool, copy_pool, decode_engine_of, empty_pool, engine_kv_events, kv_formula_html,
                                  kv_grid_html, pool_at, pool_engine)
from visualizers.kv_calculator import DTYPE_BYTES, REFERENCE_MODELS, calculator_html, kv_cache_bytes
from visualizers.logit_lens import logit_lens_html
from visualizers.moe import moe_html, moe_layers
from visualizers.parallel import parallel_html
from visualizers.prefix_cache import prefix_cache_html
from visualizers.request import request_html
from visualizers.sampling import sampling_html
from visualizers.speculative import spec_html
from visualizers.timeline import queue_seconds, timeline_html, timeline_steps, untraced_timeline_html
from visualizers.tokens import id_prompt, tokens_html

__all__ = ["disagg_html", "answer_html", "attention_html", "attention_matrix", "layers_and_heads", "embedding_html",
           "embedding_matrix", "kv_formula_html", "kv_grid_html", "DTYPE_BYTES", "REFERENCE_MODELS",
           "calculator_html", "kv_cache_bytes", "logit_lens_html", "moe_html", "moe_layers", "parallel_html", "prefix_cache_html", "request_html",
           "sampling_html", "spec_html", "timeline_html", "timeline_steps", "tokens_html", "id_prompt", "not_recorded",
           "queue_seconds", "untraced_timeline_html", "apply_kv_pool", "copy_pool", "empty_pool", "pool_at",
           "decode_engine_of", "engine_kv_events", "pool_engine"]
