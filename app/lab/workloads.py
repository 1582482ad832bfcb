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


LONG_TEXT = (
    "The history of the harbour town is told in its buildings. The oldest warehouses stand by the water, "
    "built of grey stone when the fishing fleet was the only trade. Behind them the merchants' houses climb "
    "the hill, each a little grander than the one below, until the church at the top looks over all of it. "
    "In the square the market still meets on Thursdays, as it has for three hundred years, and the same "
    "families sell bread, cheese and fish from the same corners. ")


def long_prompt(tokenizer, n_tokens: int) -> list[int]:
    """A prompt of exactly n_tokens real tokens: the long text repeated, cut at n_tokens."""
    ids: list[int] = []
    piece = tokenizer.encode(LONG_TEXT, add_special_tokens=False)
    while len(ids) < n_tokens:
        ids += piece
    return ids[:n_tokens]


# speculation by content: text the answer can copy from its prompt, code, and open prose
CONTENT_PROMPTS = {
    "copy": ("Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the river bank. "
             "The quick brown fox jumps over the lazy dog near the river bank. The quick brown fox",
             "Fix the spelling and write the list again: apples, banannas, cheries, grapes, lemmons. "
             "The list again: apples, bananas, cherries, grapes, lemons. The list again: apples,"),
    "code": ("def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
             "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\nfor k in range(10):\n"),
    "prose": ("Once upon a time, in a small village by the sea,",
              "Describe the smell of rain on a summer afternoon."),
}


# precision: the fixed text every setting reads (teacher-forced: its next-token distributions compared)
FIXED_TEXT = ("The museum opened its doors in the spring. Visitors came from the whole region to see the old "
              "maps, the ship models and the letters of the captains who had sailed from the harbour. A guide "
              "led each group through the rooms, told the story of every object, and answered questions about "
              "the town, its people and the sea. In the last room stood a great clock that had not stopped in "
              "two hundred years.")
