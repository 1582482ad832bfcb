"""LLM: the offline Python API, in the style users know from vLLM.

    from engine import LLM, SamplingParams
    llm = LLM()                                   # the embedded model
    out = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=20))
    print(out[0].text)
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence as Seq

import torch
from tqdm.auto import tqdm

from engine.config import EngineConfig
from engine.disagg import DisaggEngine
from engine.engine_api import Engine
from engine.llm_engine import LLMEngine
from engine.config import ProgressFn
from engine.outputs import RequestOutput, TokenOutput
from engine.sampling_params import SamplingParams
from engine.trace import CaptureConfig, EventList, TraceEvent, Tracer

Prompt = str | list[int]
Messages = list[dict]


class LLM:
    def __init__(self, model: str | Path | None = None, *, device: str = "auto",
                 dtype: str | torch.dtype = "auto", capture: CaptureConfig | None = None,
                 progress: ProgressFn | None = None, draft: str | Path | None = None,
                 num_speculative_tokens: int = 4, prompt_lookup_max: int = 4, prompt_lookup_min: int = 2,
                 disaggregate: bool = False, prefill_ranks: int = 1, decode_ranks: int = 1,
                 **engine_options) -> None:
        """`draft`: a small model with the same vocabulary for speculative decoding, or
        "ngram" for prompt lookup: proposals copied from what followed the last n tokens
        (n from prompt_lookup_max down to prompt_lookup_min) earlier in the request.
        `engine_options` are EngineConfig fields: block_size, num_kv_blocks,
        kv_cache_memory_fraction, max_num_seqs, max_num_batched_tokens, max_model_len,
        enable_prefix_caching, use_triton, tensor_parallel_size, expert_parallel, quantization,
        cuda_graphs, cuda_graph_sizes.
        `disaggregate`: prefill and decode on separate engines, each in its own process with its
        own KV pool, the pages handed over on torch.distributed (engine/disagg). prefill_ranks:
        prefill engines, a process each (its own model copy, pool and prefix cache);
        decode_ranks: decode engines, a pool and batch each, in this process."""
        self.tracer = Tracer()
        if disaggregate:
            self.engine: Engine = DisaggEngine(model, device=device, dtype=dtype, config=EngineConfig(**engine_options),
                                       tracer=self.tracer, trace_level="off", capture=capture, progress=progress,
                                       draft=draft, prefill_ranks=prefill_ranks, decode_ranks=decode_ranks)
            self.tokenizer = self.engine.tokenizer
            return
        self.engine = LLMEngine(model, device=device, dtype=dtype, config=EngineConfig(**engine_options),
                                tracer=self.tracer, trace_level="off", capture=capture, progress=progress,
                                draft=draft, num_speculative_tokens=num_speculative_tokens,
                                prompt_lookup_max=prompt_lookup_max, prompt_lookup_min=prompt_lookup_min)
        self.tokenizer = self.engine.tokenizer

    def shutdown(self) -> None:
        """Stop the worker ranks of a sharded model (tensor_parallel_size > 1)."""
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def generate(self, prompts: Prompt | Seq[Prompt], params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = False, **spec) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. A prompt is a string or a list of token ids.
        With speculation on, `speculative=False` turns speculation off for these requests
        and `num_speculative_tokens=k` lowers their k."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        return self._run([dict(prompt=p, **spec) for p in prompts], params, use_tqdm)

    def chat(self, messages: Messages | Seq[Messages], params: SamplingParams | Seq[SamplingParams] | None = None,
             use_tqdm: bool = False, **spec) -> RequestOutput | list[RequestOutput]:
        """Apply the model's chat template and answer; one conversation or a list of them.
        `spec`: as for generate."""
        single = bool(messages) and isinstance(messages[0], dict)
        outs = self._run([dict(messages=m, **spec) for m in ([messages] if single else messages)], params, use_tqdm)
        return outs[0] if single else outs

    def stream(self, prompt: Prompt | None = None, params: SamplingParams | None = None, *,
               messages: Messages | None = None, trace: str = "full", speculative: bool = True,
               num_speculative_tokens: int | None = None) -> Iterator[TokenOutput | TraceEvent | RequestOutput]:
        """Run one request and yield, as they happen, its trace events (TraceEvent),
        each new token (TokenOutput), and finally the whole RequestOutput."""
        sink = EventList()
        self.tracer.add_sink(sink)
        rid = None
        try:
            rid = self.engine.add_request(prompt, params, messages=messages, trace_level=trace,
                                          speculative=speculative, num_speculative_tokens=num_speculative_tokens)
            done = ended = False  # its last token; its trace's `finish` (after its tokens' logit lenses)
            while True:
                outputs = self.engine.step() if self.engine.has_unfinished_requests() else []
                events, sink.events = sink.events, []
                for ev in events:
                    if ev.request_id in (rid, None):
                        yield ev
                        ended = ended or (ev.type == "finish" and ev.request_id == rid)
                for out in outputs:
                    if out.request_id == rid:
                        yield out
                        done = done or out.finished
                seq = self.engine.requests[rid]
                if (done or seq.is_finished) and (ended or not seq.traced or not self.engine.has_unfinished_requests()):
                    break
            yield self.engine.get_output(rid)
        finally:
            self.tracer.remove_sink(sink)
            if rid is not None:
                self.engine.abort(rid)
                self.engine.release(rid)

    def _run(self, requests: list[dict], params, use_tqdm: bool) -> list[RequestOutput]:
        if not isinstance(params, (list, tuple)):
            params = [params or SamplingParams()] * len(requests)
        if len(params) != len(requests):
            raise ValueError(f"{len(requests)} prompts but {len(params)} SamplingParams")
        ids = []
        try:
            for req, p in zip(requests, params):
                ids.append(self.engine.add_request(params=p, **req))
            bar = tqdm(total=len(ids), desc="Generating", disable=not use_tqdm)
            results: dict[str, RequestOutput] = {}
            wanted = set(ids)
            while len(results) < len(ids):
                for out in self.engine.step():
                    if out.finished and out.request_id in wanted and out.request_id not in results:
                        results[out.request_id] = self.engine.get_output(out.request_id)
                        self.engine.release(out.request_id)
                        bar.update(1)
            bar.close()
            return [results[i] for i in ids]
        finally:
            for i in ids:
                self.engine.abort(i)
                self.engine.release(i)
