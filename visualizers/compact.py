"""A trace's tensor captures in their stored form, read back as plain nested lists.

The engine may store a big capture (attention probabilities, embedding rows) compactly
(engine/trace/compact.py writes that form); an older trace file, or a small capture, holds
nested lists of floats. Every visualizer reads a capture through `dense`, so both draw the
same way."""
from __future__ import annotations


def dense(x) -> list:
    """A capture as nested lists of floats, whichever form it was stored in."""
    return x  # nested lists: stored as they are (the compact form's reader is added with its writer)
