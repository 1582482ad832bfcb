"""Shared helpers: is triton there, and should this call take the Triton path."""

from __future__ import annotations

import functools
import importlib.util
import os

import torch


@functools.cache
def triton_available() -> bool:
    """True when triton is installed. Finds the package without importing it (cheap)."""
    return importlib.util.find_spec("triton") is not None


def triton_interpret() -> bool:
    # Read at call time: the interpreter must be chosen before triton is first imported.
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton_for(t: torch.Tensor, use_triton: bool | None) -> bool:
    """Decide the path for one call.

    use_triton=None: Triton on CUDA tensors (when triton is installed), else reference.
    use_triton=False: always the reference (handy for debugging on a GPU).
    use_triton=True: Triton; on CPU tensors this needs TRITON_INTERPRET=1.
    """
    if use_triton is None:
        return t.is_cuda and triton_available()
    if not use_triton:
        return False
    if not triton_available():
        raise RuntimeError("use_triton=True but triton is not installed")
    if not t.is_cuda and not triton_interpret():
        raise RuntimeError(
            "use_triton=True on CPU tensors needs TRITON_INTERPRET=1 set before triton is imported"
        )
    return True
