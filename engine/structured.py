"""Structured outputs: a grammar (JSON, a JSON schema, a regular expression, a choice of
strings) masks the tokens that could not continue a valid answer, one step at a time.

The grammar is xgrammar's (the library vLLM and SGLang use): it compiles the grammar against
the tokenizer's vocabulary once, and per step fills a bitmask of the tokens allowed next.
Picked over llguidance and outlines-core because it installs from PyPI as a wheel and runs
on the CPU (its bitmask applies to CPU logits too), and its JSON-schema support is the one
vLLM's `response_format` uses. JSON is compiled without free whitespace between tokens
(any_whitespace=False, vLLM's "disable-any-whitespace"): small models otherwise can spend
their whole budget on newlines. One gap in xgrammar 0.2.9 is closed here: a string with a
length bound (maxLength, minLength: the rule `[^"\\\r\n]{0,n}`) lets raw control bytes in,
which JSON forbids (RFC 8259 section 7: U+0000..U+001F must be escaped), so an answer could end
by stop and not parse. With JSON free of whitespace between tokens no control byte is ever
valid, so for JSON the tokens holding one are masked too (a fixed vocabulary mask, read once
from the tokenizer's bytes as xgrammar decoded them). The mask is the first stage of the sampling chain
(engine/penalties.py), as vLLM applies it to the logits before the sampler.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import torch

KINDS = ("json_object", "json_schema", "regex", "choice")


@dataclass(frozen=True)
class Constraint:
    """What the answer must match. kind: json_object (a JSON object), json_schema (value:
    the schema as JSON text), regex (value: the pattern), choice (value: the strings, as a
    JSON list)."""
    kind: str
    value: str = ""
    field: str = "response_format"  # the request's field that asked (its errors name it)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"a constraint's kind is one of {', '.join(KINDS)}, got {self.kind!r}")


class Grammars:
    """One engine's compiler: the tokenizer's vocabulary read once (slow for a large
    vocabulary), compiled grammars cached by the compiler. Built on the first request that asks."""

    def __init__(self, hf_tokenizer, vocab_size: int, stop_ids: list[int]) -> None:
        import xgrammar as xgr  # only when a request asks for structured output
        self._xgr = xgr
        self.vocab_size = vocab_size
        self.info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=vocab_size,
                                                       stop_token_ids=list(stop_ids) or None)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)
        # [V] bool: tokens whose bytes hold a control character (masked for JSON, see above)
        self.control = torch.zeros(vocab_size, dtype=torch.bool)
        bad = [i for i, b in enumerate(self.info.decoded_vocab[:vocab_size]) if any(c < 0x20 for c in b)]
        self.control[bad] = True

    def matcher(self, constraint: Constraint) -> "Matcher":
        """ValueError (naming what is wrong) for a schema or pattern that does not compile."""
        try:
            compiled = self._compile(constraint)
        except (RuntimeError, ValueError, TypeError) as e:  # xgrammar raises RuntimeError for bad input
            raise ValueError(f"{constraint.field}: the {constraint.kind.replace('_', ' ')} does not compile: "
                             f"{str(e).splitlines()[0][:300]}") from None
        forbid = self.control if constraint.kind in ("json_object", "json_schema") else None
        return Matcher(self._xgr, self._xgr.GrammarMatcher(compiled), self.vocab_size, forbid)

    def _compile(self, c: Constraint):
        if c.kind == "json_object":  # OpenAI's JSON mode: an object (xgrammar's builtin grammar takes any value)
            return self.compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
        if c.kind == "json_schema":
            return self.compiler.compile_json_schema(c.value, any_whitespace=False)
        if c.kind == "regex":
            return self.compiler.compile_regex(c.value)
        choices = json.loads(c.value)  # one of these strings exactly: an EBNF alternation of literals
        literals = (json.dumps(s, ensure_ascii=False) for s in choices)
        return self.compiler.compile_grammar("root ::= " + " | ".join(literals))


class Matcher:
    """One sequence's place in its grammar."""

    def __init__(self, xgr, matcher, vocab_size: int, forbid: torch.Tensor | None = None) -> None:
        """forbid: [V] bool, tokens masked at every step besides the grammar's (JSON: control bytes)."""
        self._xgr, self.matcher, self.vocab_size, self.forbid = xgr, matcher, vocab_size, forbid
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)  # [1, ceil(V / 32)] int32

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """The logits [V] with every token the grammar forbids next set to -inf (a copy)."""
        self.matcher.fill_next_token_bitmask(self._bitmask)
        x = logits.float().clone()[None].cpu()
        self._xgr.apply_token_bitmask_inplace(x, self._bitmask, vocab_size=self.vocab_size)
        if self.forbid is not None:
            x[0, :len(self.forbid)].masked_fill_(self.forbid[:x.shape[-1]], float("-inf"))
        return x[0].to(logits.device)

    def accept(self, token: int) -> bool:
        """Advance past a drawn token; False if the grammar refuses it (never, for a masked draw)."""
        return self.matcher.is_terminated() or bool(self.matcher.accept_token(token))

    @property
    def finished(self) -> bool:
        """The grammar has accepted a stop token: the answer is complete."""
        return self.matcher.is_terminated()

    def fork(self) -> "Matcher":
        return Matcher(self._xgr, self.matcher.fork(), self.vocab_size, self.forbid)
