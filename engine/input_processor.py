"""Intake: a request as it arrives (a prompt, token ids or chat messages, and its sampling
params) made into the Sequence the scheduler queues, checked once, here.

It tokenizes (the chat template for messages), refuses what cannot run (an empty prompt,
ids outside the vocabulary, a prompt the context or the KV pool cannot hold), fits
max_tokens to the context as the caller asks, and gives the sequence what its knobs need
before its first step: a seeded generator, a `full` trace's capture spec, a compiled
grammar, and for n > 1 its other choices (forked once its prompt is computed). vLLM v1 has
the same stage (its input processor); what is left to the engine is the request table and
the trace of the arrival, which need the engine's lock and tracer.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, replace

import torch

from engine.config import ModelConfig
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.structured import Grammars
from engine.tokenizer import IncrementalDetokenizer, Tokenizer
from engine.trace import CaptureConfig
from engine.trace.capture import CaptureSpec

# add_request(context_fit=...): a max_tokens the context cannot hold runs until the context is
# full, is lowered to what fits, or is refused (ContextLengthError, as vLLM's server does)
CONTEXT_FITS = ("run", "lower", "refuse")


class ContextLengthError(ValueError):
    """prompt + max_tokens passes the model's context (add_request with context_fit="refuse")."""

    def __init__(self, prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
        n, want, ctx = prompt_tokens, max_tokens, max_model_len
        super().__init__(f"max_tokens is too large: {want:,}. This model's maximum context length is {ctx:,} "
                         f"tokens and the prompt has {n:,} tokens ({want:,} > {ctx:,} - {n:,}): ask for at "
                         f"most {ctx - n:,}")
        self.prompt_tokens, self.max_tokens, self.max_model_len = n, want, ctx


@dataclass(frozen=True)
class RequestOptions:
    """add_request's per-request choices beside the prompt and its params."""
    request_id: str
    trace_level: str
    speculative: bool = True  # speculation on for this request (where the engine has it)
    num_speculative_tokens: int | None = None  # its k (at most the engine's)
    context_fit: str = "run"  # one of CONTEXT_FITS
    arrival: float = 0.0  # perf_counter when add_request was called
    capture: CaptureConfig | None = None  # the engine's capture settings (read at level "full")


def choice_ids(request_id: str, n: int) -> list[str]:
    """The request ids of a request's n choices: its own first, then "<id>.1" ... "<id>.<n-1>"."""
    return [request_id] + [f"{request_id}.{i}" for i in range(1, n)]


class InputProcessor:
    """One engine's intake: its tokenizer, model, context, pool size and device."""

    def __init__(self, tokenizer: Tokenizer, model_config: ModelConfig, max_model_len: int, num_blocks: int,
                 block_size: int, device: torch.device, num_speculative_tokens: int, speculation: bool) -> None:
        self.tokenizer, self.model_config, self.max_model_len = tokenizer, model_config, max_model_len
        self.num_blocks, self.block_size, self.device = num_blocks, block_size, device
        self.num_speculative_tokens = num_speculative_tokens
        self.speculation = speculation  # the engine has a proposer
        self.grammars: Grammars | None = None  # structured outputs' compiler, built on the first request that asks

    def sequence(self, prompt, params: SamplingParams, messages: list[dict] | None,
                 opts: RequestOptions) -> Sequence:
        """The request's Sequence, its other choices in `forks`; ValueError for what cannot run."""
        if opts.context_fit not in CONTEXT_FITS:
            raise ValueError(f"context_fit must be one of {CONTEXT_FITS}")
        text, ids = self.tokenize(prompt, messages)
        params = self.validate(ids, params, opts.context_fit)
        if text is None:  # token ids: their text, once they are known to be the vocabulary's (the trace shows it)
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        seq = Sequence(opts.request_id, ids, params, IncrementalDetokenizer.start(self.tokenizer, ids),
                       trace_level=opts.trace_level, prompt=text, arrival_time=opts.arrival)
        seq.tokenized_time = time.perf_counter()
        # penalties and biases read the tokens before each draw: a verified round's positions
        # would need them per position, so such a request decodes one token a step
        seq.speculative = opts.speculative and self.speculation and not params.adjusts_logits
        if opts.num_speculative_tokens is not None:
            if opts.num_speculative_tokens < 0:
                raise ValueError("num_speculative_tokens must be >= 0")
            seq.spec_k = min(opts.num_speculative_tokens, self.num_speculative_tokens)
        seq.generator = self.generator(params)
        if opts.trace_level == "full":
            c, cfg = opts.capture or CaptureConfig(), self.model_config
            layers = c.attention_layers if c.attention_layers is not None else list(range(cfg.num_layers))
            seq.capture = CaptureSpec(layers, c.heads, c.max_keys, cfg.is_moe, c.embed_dims, c.logit_lens_top,
                                      c.compact, c.first_keys)
        if params.structured is not None:
            seq.grammar = self.grammar_compiler().matcher(params.structured)  # ValueError: it does not compile
        seq.forks = [self.choice(seq, i) for i in range(1, params.n)]
        return seq

    def choice(self, seq: Sequence, i: int) -> Sequence:
        """Choice i of seq's n: the same prompt and knobs with its own random draws (seed + i,
        as vLLM seeds the n choices), no prompt logprobs (choice 0 has them)."""
        params = replace(seq.params, n=1, prompt_logprobs=None,
                         seed=None if seq.params.seed is None else (seq.params.seed + i) % 2 ** 64)
        child = Sequence(choice_ids(seq.request_id, i + 1)[-1], list(seq.prompt_token_ids), params,
                         IncrementalDetokenizer.start(self.tokenizer, seq.prompt_token_ids),
                         trace_level=seq.trace_level, prompt=seq.prompt, arrival_time=seq.arrival_time)
        child.tokenized_time, child.speculative, child.spec_k = seq.tokenized_time, seq.speculative, seq.spec_k
        child.capture = replace(seq.capture) if seq.capture is not None else None
        child.grammar = seq.grammar.fork() if seq.grammar is not None else None
        child.generator = self.generator(params)
        return child

    def generator(self, params: SamplingParams) -> torch.Generator | None:
        """A sampled request's own random stream: its seed, or a fresh one (greedy: none)."""
        if params.greedy:
            return None
        g = torch.Generator(self.device)
        g.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
        return g

    def grammar_compiler(self) -> Grammars:
        if self.grammars is None:
            cfg = self.model_config
            self.grammars = Grammars(self.tokenizer.hf, cfg.vocab_size, cfg.eos_token_ids)
        return self.grammars

    def tokenize(self, prompt, messages: list[dict] | None) -> tuple[str | None, list[int]]:
        """(the prompt's text, its token ids): messages through the chat template, a string
        encoded, token ids as they are (their text None: decoded once they are validated)."""
        if messages is not None:
            check_messages(messages)
            return self.tokenizer.apply_chat_template(messages), self.tokenizer.encode_chat(messages)
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return None, list(prompt)
        raise ValueError("a prompt is a string or a list of token ids (or pass messages=...)")

    def validate(self, ids: list[int], params: SamplingParams, context_fit: str) -> SamplingParams:
        """The prompt's checks, and max_tokens against the context: -> the params to run with."""
        if not ids:
            raise ValueError("the prompt is empty")
        vocab, ctx = self.model_config.vocab_size, self.max_model_len
        if any(t < 0 or t >= vocab for t in ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if len(ids) >= ctx:
            raise ValueError(f"the prompt has {len(ids)} tokens but this model's context is {ctx} "
                             "tokens, and at least one must be generated")
        if any(not 0 <= t < vocab for t in params.logit_bias):
            raise ValueError(f"logit_bias token ids must be in [0, {vocab})")
        room = ctx - len(ids)
        if params.max_tokens > room and context_fit == "refuse":
            raise ContextLengthError(len(ids), params.max_tokens, ctx)
        if params.max_tokens > room and context_fit == "lower":
            params = replace(params, max_tokens=room)
        if -(-(len(ids) + 1) // self.block_size) > self.num_blocks:
            raise ValueError(f"the prompt has {len(ids)} tokens but the KV cache holds only "
                             f"{self.num_blocks * self.block_size}")
        return params


def check_messages(messages: list[dict]) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            raise ValueError("each message needs a role (system, user or assistant) and string content")
