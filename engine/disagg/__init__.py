"""Disaggregated serving: prefill and decode on separate engines, each in its own process
with its own KV pool, the request's KV pages handed over on torch.distributed.

As vLLM's disaggregated prefill (and SGLang, Mooncake, Dynamo) does it: the prefill engine
computes the prompt (its prefix cache on its side), samples the FIRST token there, and
sends the request's KV blocks (every layer, its blocks only) to the decode engine, which
allocates blocks of its own, receives into them and decodes the rest.

Processes: the decode engine lives in the serving process (rank 0 of a 2-process group,
as the parallel engine's rank 0 does); the prefill engine is a process it spawns (rank 1).
Control messages (requests, "ready", "pull", "sent", trace events) cross a pipe; the KV
pages cross torch.distributed's own send/recv (gloo on the CPU; NCCL on CUDA, written
but untested here).

protocol.py  what the two sides say to each other, and the prefill side's start-up spec
transfer.py  the KV pages: gather a request's blocks, send, receive into other blocks
prefill.py   the prefill engine (an LLMEngine that holds a request after its first token)
             and its process's loop
engine.py    DisaggEngine: the decode side, an LLMEngine whose requests start remote

Imports go one way: protocol -> nothing here; transfer -> protocol; prefill -> protocol,
transfer (and engine/parallel's worker helpers); engine -> all of them (engine/llm.py
imports engine).
"""
from engine.disagg.engine import DisaggEngine, DisaggFailedError

__all__ = ["DisaggEngine", "DisaggFailedError"]
