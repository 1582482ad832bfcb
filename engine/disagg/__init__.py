"""Disaggregated serving: prefill and decode on separate engines, each in its own process
with its own KV pool, the request's KV pages handed over on torch.distributed.

As vLLM's disaggregated prefill (and SGLang, Mooncake, Dynamo) does it: the prefill engine
computes the prompt (its prefix cache on its side), samples the FIRST token there, and
sends the request's KV blocks (every layer, its blocks only) to the decode engine, which
allocates blocks of its own, receives into them and decodes the rest.

Processes (xPyD: P prefill engines, D decode engines, default 1 and 1): the decode engines
live in the serving process (rank 0 of a 1 + P process group, as the parallel engine's rank 0
does; each its own KV pool and batch, stepped in turn); each prefill engine is a process it
spawns (prefill k: rank k + 1, its own model copy, pool and prefix cache). A request goes to
the prefill engine that would compute it soonest (its cached prefix counted), its pages to
the decode engine with the most free blocks (routing.py). Control messages (requests,
"ready", "pull", "sent", trace events) cross a pipe per prefill engine; the KV pages cross
torch.distributed's own send/recv (gloo on the CPU; NCCL on CUDA, written but untested here).

protocol.py  what the two sides say to each other, the prefill side's start-up spec, and the
             kv.transfer event of a handover
transfer.py  the KV pages: gather a request's blocks, send, receive into other blocks
routing.py   which prefill engine computes a request, which decode engine receives it
lanes.py     the decode engines of the serving process: a lane each (its pool, a runner over it,
             its block manager and scheduler)
prefill.py   the prefill engine (around an LLMEngine it holds: a request kept after its first token)
             and its process's loop
engine.py    DisaggEngine: the decode side, around an LLMEngine it holds (its decode core, built
             with CoreHooks: its requests start remote); no subclass

Imports go one way: protocol, routing, lanes -> nothing here; transfer -> protocol; prefill
-> protocol, transfer (and engine/parallel's worker helpers); engine -> all of them
(engine/llm.py imports engine).
"""
from engine.disagg.engine import DisaggEngine, DisaggFailedError

__all__ = ["DisaggEngine", "DisaggFailedError"]
