"""The exact joint distribution of a tiny 5-word model's first three sampled tokens, with
transformers' own warpers as the reference, and a chi-square statistic of observed draws
against it: the sampling tests of the speculative paths share them."""
from __future__ import annotations

import itertools

import torch

from tests.tiny import load_reference

WORDS = ["<eos>", "a", "b", "c", "d"]
KNOBS = dict(temperature=0.8, top_k=4, top_p=0.9, min_p=0.05)


def warpers() -> list:
    from transformers.generation.logits_process import (MinPLogitsWarper, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)
    return [TemperatureLogitsWarper(0.8), TopKLogitsWarper(4), TopPLogitsWarper(0.9), MinPLogitsWarper(0.05)]


def joint_distribution(path, prompt: list[int]) -> torch.Tensor:
    """P(first three tokens) under KNOBS, a [5, 5, 5] tensor, from the checkpoint at path."""
    ref, ws = load_reference(path), warpers()
    probs = torch.zeros(5, 5, 5)
    with torch.no_grad():
        for seq in itertools.product(range(5), repeat=2):
            ids = torch.tensor([prompt + list(seq)])
            logits = ref(ids).logits[0, -3:]
            p = []
            for i in range(3):
                scores = logits[i:i + 1]
                for w in ws:
                    scores = w(ids[:, : len(prompt) + i], scores)
                p.append(torch.softmax(scores, -1)[0])
            probs[seq[0], seq[1]] = p[0][seq[0]] * p[1][seq[1]] * p[2]
    return probs


def first_three(outputs) -> torch.Tensor:
    """Counts of the first three tokens of each output, a [5, 5, 5] tensor."""
    counts = torch.zeros(5, 5, 5)
    for o in outputs:
        counts[tuple(o.token_ids[:3])] += 1
    return counts


def chi_square(observed: torch.Tensor, expected: torch.Tensor) -> tuple[float, int]:
    """(statistic, degrees of freedom) of the counts against the distribution."""
    mask = expected > 0
    assert observed[~mask].sum() == 0  # nothing drawn that the knobs cut away
    e = expected[mask] * observed.sum()
    return float(((observed[mask] - e) ** 2 / e).sum()), int(mask.sum()) - 1
