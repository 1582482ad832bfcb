"""DEVICE: where the engine tests run (TOKENTRACE_TEST_DEVICE=cuda on a GPU machine; CPU
by default). Passes run by hand, outside the scheduler, are engine/forward.py's."""
from __future__ import annotations

import os

DEVICE = os.environ.get("TOKENTRACE_TEST_DEVICE", "cpu")
