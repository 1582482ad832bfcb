"""The lab's fixed texts: prompts every experiment draws from (no randomness but a seeded
shuffle, so a setting's workload is the same on every run and every machine)."""
from __future__ import annotations

import random

PROMPTS = (
    "Once upon a time, in a small village by the sea,",
    "The engine reads the request, splits it into tokens and",
    "Write a short story about a robot who learns to paint.",
    "Explain why the sky is blue in simple words.",
    "A list of things to pack for a long hike:",
    "The history of the printing press begins",
    "Describe the smell of rain on a summer afternoon.",
    "The train left the station just before dawn, and",
)


def shuffled(values: list, seed: int) -> list:
    out = list(values)
    random.Random(seed).shuffle(out)
    return out
