"""Tensor and expert parallelism on torch.distributed: one model across N ranks.

comm.py        the process group (gloo on CPU, NCCL on CUDA) and the collectives, timed
shard.py       which slice of every weight a rank holds, and the layers that all-reduce
protocol.py    what rank 0 and the workers say to each other: the shard to load, the
               handshake, each step's batch, the shutdown message
runner.py      rank 0: ParallelRunner, the ModelRunner that drives the workers
spawn.py       start a spawned process with a pipe, wait for each one's loaded report
               (the worker ranks here, the prefill engines of engine/disagg)
worker.py      ranks 1..N-1: load a shard, serve rank 0's steps (spawned, or torchrun's)
rendezvous.py  where rank 0 meets torchrun's ranks: torchrun's environment and store
torchrun.py    the entry point under torchrun (python -m engine.parallel.torchrun app|generate)

Imports go one way: shard -> comm; rendezvous -> protocol; spawn -> protocol; worker -> comm, shard, protocol,
rendezvous; runner -> those, spawn and worker (engine/llm_engine.py imports runner); torchrun ->
rendezvous, worker and the engine's LLM (nothing imports it: it is the entry point).
"""
