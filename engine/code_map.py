"""Which of the engine's functions does each stage of a request's journey: the one place the
page and the classroom read to show "the code that ran it" (docs/page.md).

Data only. Each stage key (the page's sections, visualizers/journey.py KEYS) lists its code:
a function or method as `module:QualName`, a line saying why it is the one to read, the
lines that make the number the page shows (`marks`: a piece of text each marked line holds,
so an edit elsewhere in the function never moves them), `values`: lines beside which the page
writes the request's value that line made (a line's text, then the value's name, which
visualizers/code_values.py fills from the trace), and `path`, where a stage has
several ways to run (the C kernel on this CPU, a Triton kernel on a GPU, plain torch; a draft
model or an n-gram lookup): the name the engine reports for the way that ran (its trace
events say which: engine/code_ran.py's `attention_path`, the `spec` event's `method`).
engine/code_source.py finds each one in the running checkout; tests/engine/test_code_map.py
fails when a function named here moves, is renamed or is deleted and this map does not follow."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Code:
    name: str  # "engine.block_manager:BlockManager.match_tokens": importable module, qualified name
    why: str  # what this function does for the stage, in one line
    marks: tuple[str, ...] = ()  # text held by the lines that make the stage's number (each found once)
    path: str = ""  # where a stage runs one of several ways: this way's name ("" runs every time)
    values: tuple[tuple[str, str], ...] = ()  # (text held by one line, the name of the request's value beside it)


# the ways a stage may run, by the names the engine reports (engine/code_ran.py), in words
PATHS = {
    "c_fused": "the fused C layer (this CPU: attention and MLP of a few rows in C calls)",
    "c_kernel": "the C decode-attention kernel (this CPU: keys read in place from the pages)",
    "triton": "the Triton kernels (a GPU: paged decode attention, KV stores)",
    "torch": "plain torch (scaled_dot_product_attention over the gathered pages)",
    "draft": "a draft model proposes k tokens",
    "ngram": "an n-gram lookup in the request's own tokens proposes k tokens",
    "moe_c_block": "the MoE half in the fused layer's C call (this CPU: norm, router and experts, cpu_moe.c)",
    "moe_c": "the router and the chosen experts in one C call (this CPU: cpu_moe.c)",
    "moe_torch": "plain torch: the router's softmax and top-k, then the chosen experts",
}

STAGE_CODE: dict[str, tuple[Code, ...]] = {
    "request": (
        Code("engine.llm_engine:LLMEngine.add_request", "a request enters the engine: a Sequence, its choices, "
             "then the scheduler's queue"),
        Code("engine.input_processor:InputProcessor.sequence", "intake: tokenize, check the context, build the "
             "Sequence", marks=("self.validate(",)),
        Code("engine.input_processor:InputProcessor.validate", "the checks: the prompt and max_tokens fit the "
             "context"),
    ),
    "tokens": (
        Code("engine.input_processor:InputProcessor.tokenize", "messages through the chat template, a string "
             "encoded", marks=("self.tokenizer.encode_chat(messages)",),
             values=(("self.tokenizer.encode_chat(messages)", "tokens.ids"),)),
        Code("engine.tokenizer:Tokenizer.apply_chat_template", "the chat template writes the roles' special "
             "tokens around each message"),
        Code("engine.tokenizer:Tokenizer.encode_chat", "the templated text to ids"),
        Code("engine.tokenizer:Tokenizer.encode", "byte-level BPE: text to token ids"),
    ),
    "prefix": (
        Code("engine.block_manager:chain_hash", "a block's key: its tokens and the key of the block before it, "
             "so a hit means the whole prefix matches"),
        Code("engine.block_manager:BlockManager.match_tokens", "the lookup: full blocks of the prompt, hashed "
             "in a chain, until the first miss", marks=("h = chain_hash(parent, ids)", "hits.append(bid)"),
             values=(("h = chain_hash(parent, ids)", "prefix.hash"), ("hits.append(bid)", "prefix.hits"))),
        Code("engine.block_manager:BlockManager.admit", "the hits become the start of the request's block "
             "table; their tokens are not computed again",
             marks=("seq.num_computed_tokens = seq.num_cached_tokens",)),
    ),
    "embedding": (
        Code("engine.model:DecoderModel.forward", "one row of the embedding matrix per token id, then every "
             "layer in turn", marks=("x = self.embed_tokens(batch.input_ids)",)),
    ),
    "layers": (
        Code("engine.model:DecoderLayer.forward", "one layer: attention, then the MLP or the MoE, each "
             "added to the residual stream", marks=("plan = self._fused_plan(x, batch)",)),
        Code("engine.layers.fused:forward", "this CPU's way: a few rows through the layer in C calls",
             path="c_fused"),
        Code("engine.layers.attention:Attention.forward", "q, k, v, RoPE, the new keys stored in the pages",
             marks=("store_kv(k, v, self.k_cache, self.v_cache, batch)",)),
        Code("engine.layers.attention:Attention.attend", "which attention runs: Triton decode, batched decode "
             "or one prefill per sequence", marks=("return paged_decode_attention(",)),
        Code("engine.layers.attention:decode_attention", "decode: one query per sequence over its pages, by "
             "the C kernel where it applies, else one torch SDPA call, query heads grouped by KV head",
             marks=("return cpu_kernels.decode_attention(", "out = F.scaled_dot_product_attention("), path="torch"),
        Code("engine.kernels.cpu:decode_attention", "the C decode-attention kernel: each query over its "
             "sequence's pages, read in place (cpu_attention.c)", path="c_kernel"),
        Code("engine.layers.attention:prefill_attention", "prefill: the prompt's queries over its keys, causal",
             path="torch"),
        Code("engine.kernels.paged_attention:paged_decode_attention", "the GPU's paged decode kernel, or its "
             "torch reference", path="triton"),
        Code("engine.kernels._paged_attention_triton:_paged_decode_kernel", "the Triton kernel: each block of "
             "the sequence's pages read once for the whole query group, softmax online",
             marks=("block_id = tl.load(block_tables_ptr", "m_new = tl.maximum(m, tl.max(s, axis=1))",
                    "acc = acc * alpha[:, None]"), path="triton"),
        Code("engine.layers.mlp:SparseMoE.forward", "MoE: the router picks each token's experts (in C where "
             "the kernels hold them), their outputs weighted and summed",
             values=(("capture.moe_routing[self.layer_idx] = (experts, weights)", "moe.picks"),)),
        Code("engine.layers.fused:_moe_forward", "the fused layer's MoE half: norm, router and experts in one C call",
             path="moe_c_block", values=(("capture.moe_routing[layer.mlp.layer_idx]", "moe.picks"),)),
        Code("engine.layers.moe_cpu:CpuExperts.forward", "the router and the chosen experts in one C call "
             "(cpu_moe.c)", path="moe_c"),
        Code("engine.layers.mlp:SparseMoE.route", "the router in torch: softmax, then the top-k experts and "
             "their weights", marks=("weights, experts = torch.topk(probs, self.top_k, dim=-1)",), path="moe_torch"),
        Code("engine.layers.mlp:MLP.forward", "the dense MLP: gate, up, activation, down"),
    ),
    "timeline": (
        Code("engine.llm_engine:LLMEngine._step", "a step is an outline: schedule, propose, run, sample, "
             "trace, commit"),
        Code("engine.scheduler:Scheduler.schedule", "decodes first, then prefills, within the step's token "
             "budget", marks=("plan = self._plan(seq, len(seq) - seq.num_computed_tokens, budget)",)),
        Code("engine.scheduler:Scheduler._plan", "how many tokens a sequence computes this step: a whole "
             "prompt, a chunk of it, or one token"),
    ),
    "kv": (
        Code("engine.block_manager:BlockManager.allocate", "the pages a step needs, taken from the free list",
             marks=("new = [self._take(seq)",), values=(("new = [self._take(seq)", "kv.new"),)),
        Code("engine.block_manager:BlockManager._take", "a free block, evicting a cached prefix only when none "
             "is empty"),
        Code("engine.block_manager:BlockManager._release", "at the finish: each block's count drops; a full "
             "one stays in the prefix cache"),
        Code("engine.layers.attention:store_kv", "each new token's K and V written to its slot in the pool",
             values=(("k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, batch.slot_mapping, k)", "kv.slot"),)),
    ),
    "logit_lens": (
        Code("engine.model:CausalLM.compute_logits", "the LM head: hidden state to one logit per token of the "
             "vocabulary", marks=("logits = head(hidden, exact_rows)",)),
        Code("engine.trace.logit_lens:logits_with_lens", "the lens: each layer's residual through the final "
             "norm and the same head"),
    ),
    "sampling": (
        Code("engine.sampler:sample", "greedy rows take the argmax; the others go through the knobs and a "
             "draw", marks=("knobs.update(filter_stages(x, p))",),
             values=(("picks = greedy_tokens(greedy_logits)", "sampling.greedy"),
                     ("tokens[i] = draw(torch.softmax(knobs", "sampling.drawn"))),
        Code("engine.sampler:filter_stages", "temperature, top-k, top-p, min-p, each cutting the logits in "
             "turn", marks=("outside_nucleus(torch.softmax(x, dim=-1), params.top_p)",),
             values=(("x = logits.float() / params.temperature", "sampling.temperature"),)),
        Code("engine.sampler:outside_nucleus", "the top-p cut: tokens after the mass reaches top_p",
             marks=("drop[ids[before < top_p]] = False",), values=(("drop[ids[before < top_p]] = False", "sampling.top_p"),)),
        Code("engine.sampler:draw", "one token: a uniform number on the cumulative probabilities"),
    ),
    "answer": (
        Code("engine.output_processor:OutputProcessor.append", "the token appended, its text decoded",
             marks=("seq.text += seq.detokenizer.push(token)",),
             values=(("seq.text += seq.detokenizer.push(token)", "answer.sofar"),)),
        Code("engine.output_processor:OutputProcessor.stop_reason", "why the request stops here: end of "
             "sequence, a stop string, max_tokens"),
        Code("engine.tokenizer:IncrementalDetokenizer.push", "streaming detokenization: only text that can "
             "no longer change leaves"),
        Code("engine.output_processor:holdback", "text held back while it may begin a stop string"),
    ),
    "batching": (
        Code("engine.scheduler:Scheduler.schedule", "continuous batching: running requests first, then new "
             "ones admitted while pages and budget last", marks=("self.bm.admit(seq, hits)",)),
        Code("engine.model_runner:ModelRunner.prepare", "every scheduled sequence's rows in one ForwardBatch",
             values=(("ids.extend(s.token_ids())", "batching.size"),)),
        Code("engine.llm_engine:LLMEngine._commit", "after the pass: tokens appended, finished requests freed "
             "at once"),
    ),
    "spec": (
        Code("engine.speculation:Speculation.propose", "the sequences that verify a round this step get their "
             "proposals"),
        Code("engine.speculative.draft:Speculator.propose", "a small draft model runs k steps ahead",
             path="draft"),
        Code("engine.speculative.ngram:find_ngram", "the latest earlier occurrence of the last n tokens, and "
             "what followed it", path="ngram"),
        Code("engine.speculative.verify:verify", "one target pass checks every proposal: accept with "
             "probability min(1, p/q), else draw the correction", marks=("tokens.append(x)",
                                                                         "return Verdict(k, tokens + [bonus]"),
             values=(("tokens.append(x)", "spec.accepted"),)),
    ),
    "parallel": (
        Code("engine.parallel.shard:placement", "which rank holds which heads, KV heads and experts"),
        Code("engine.parallel.shard:ReduceLinear.forward", "a row-split projection's partial sums added "
             "across ranks"),
        Code("engine.parallel.comm:Comm.all_reduce", "the collective, timed for the trace"),
    ),
}
