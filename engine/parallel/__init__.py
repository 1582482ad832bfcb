"""Tensor and expert parallelism on torch.distributed: one model across N ranks.

comm.py     the process group (gloo on CPU, NCCL on CUDA) and the collectives, timed
shard.py    which slice of every weight a rank holds, and the layers that all-reduce
worker.py   the ranks 1..N-1 (spawned processes) and the rank-0 runner that drives them
"""
