"""The live question of a classroom: "predict the next token".

The presenter opens it at any stage, on any answer token (the first by default): every
student picks one of the model's top candidates there (or types a guess), then the presenter
reveals what the model drew, with the class's votes beside the model's probabilities. Until
the reveal no stage shows that token (app/classroom/mask.py), and the choices come in a
shuffled order (under greedy decoding the most likely one is the answer): drawn once per
question from a seed it keeps, so every screen and every reload shows the same order.
One vote per browser (the server keys votes by the browser's id; a second vote replaces the
first), and until the reveal the class gets only what the buttons show: each candidate's text
and its place in that order (a vote names the place), no probability and no token id (a
byte-pair vocabulary numbers its frequent tokens first: a low id ranks a candidate).
Probabilities read as every stage prints them (the stages' prob()).
"""
from __future__ import annotations

import random
import secrets
from collections import Counter
from dataclasses import dataclass, field

from visualizers.i18n import N_
from visualizers.stages.facts import prob

MAX_CANDIDATES = 6  # the choices offered (the model's top ones)
MAX_GUESS_CHARS = 40
MAX_VOTERS = 20_000  # a bound on the memory one room's question may hold
SHOWN_GUESSES = 8  # typed guesses shown at the reveal (the most frequent)


CHOICE_RULE = "choice must be a candidate's place in the order shown (0 for the first button)"
# refusals a screen shows: the API says them in English (OpenAI's error shape); the screen in its own
# language (app/classroom/words.py sends the catalog's text for each)
VOTING_CLOSED = N_("the answer is revealed: voting is closed")
NO_QUESTION = N_("no question is open")
ALL_VOTES = N_("this question has all the votes it can hold")
GUESS_RULE = N_("guess must be 1 to {n} characters of text")
OPEN_FIRST = N_("a question is open: reveal or close it first")


class VoteRefused(ValueError):
    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


@dataclass
class Candidate:
    token_id: int
    text: str  # the token's text (untrusted: escaped where shown)
    prob: float  # the model's softmax(logits) for it
    final_prob: float  # after the request's temperature / top-k / top-p


@dataclass
class Question:
    qid: int
    position: int  # the position of the token asked about
    context: str  # the last words before it (untrusted)
    candidates: list[Candidate]
    drawn: int  # the token id the engine drew
    drawn_text: str
    drawn_prob: float  # its probability where it was drawn (after the request's knobs)
    seed: int = 0  # the shuffle's: the order the class sees the candidates in
    greedy: bool = False  # the request drew the most likely token (temperature 0), not a sample
    shown: list[int] = field(default_factory=list)  # that order: indices into candidates (most likely first)
    revealed: bool = False
    votes: dict[str, int | str] = field(default_factory=dict)  # browser id -> token id, or a typed guess

    def __post_init__(self) -> None:
        if not self.shown:
            self.shown = fair_order([c.prob for c in self.candidates], self.seed)

    @classmethod
    def from_sample(cls, qid: int, sample: dict, pieces: dict[int, str], context: str,
                    seed: int | None = None) -> "Question":
        """The question on `sample`'s draw: its top candidates, shown in an order shuffled from
        `seed` (None: a fresh one)."""
        stages = sample["stages"]
        first, last = stages.get("logits") or next(iter(stages.values())), list(stages.values())[-1]
        order = sorted(range(len(sample["candidates"])), key=lambda j: -first["probs"][j])[:MAX_CANDIDATES]
        cands = [Candidate(int(sample["candidates"][j]), pieces.get(int(sample["candidates"][j]),
                                                                    f"#{sample['candidates'][j]}"),
                           float(first["probs"][j]), float(last["probs"][j])) for j in order]
        drawn = int(sample["token_id"])
        return cls(qid, int(sample["position"]), context, cands, drawn, pieces.get(drawn, f"#{drawn}"),
                   float(sample.get("token_prob", 0.0)), secrets.randbits(32) if seed is None else seed,
                   bool((sample.get("params") or {}).get("greedy")))

    def vote(self, voter: str, choice: object, guess: object) -> None:
        """choice: a candidate's place in the order shown (0 first); guess: typed text. Exactly one."""
        if self.revealed:
            raise VoteRefused(VOTING_CLOSED, 409)
        if (choice is None) == (guess is None):
            raise VoteRefused("the body must be {\"choice\": <a candidate's place, 0 first>} or {\"guess\": <text>}")
        if choice is not None:
            if isinstance(choice, bool) or not isinstance(choice, int) or not 0 <= choice < len(self.shown):
                raise VoteRefused(CHOICE_RULE, param="choice")
            value: int | str = self.candidates[self.shown[choice]].token_id
        else:
            if not isinstance(guess, str) or not guess.strip() or len(guess) > MAX_GUESS_CHARS:
                raise VoteRefused(GUESS_RULE.format(n=MAX_GUESS_CHARS), param="guess")
            # a typed guess that is one of the candidates counts for it
            match = next((c.token_id for c in self.candidates if c.text.strip() == guess.strip()), None)
            value = match if match is not None else guess.strip()
        if voter not in self.votes and len(self.votes) >= MAX_VOTERS:
            raise VoteRefused(ALL_VOTES, 429)
        self.votes[voter] = value  # once per browser: a second vote replaces the first

    def tally(self) -> tuple[Counter, Counter]:
        picks = Counter(v for v in self.votes.values() if isinstance(v, int))
        guesses = Counter(v.lower() for v in self.votes.values() if isinstance(v, str))
        return picks, guesses

    def public(self) -> dict:
        """What every follower sees: the choices as the buttons show them (their text, in the
        shuffled order); at the reveal, the answer, the model's probabilities and the class's votes."""
        out = {"id": self.qid, "position": self.position, "context": self.context, "revealed": self.revealed,
               "votes": len(self.votes),
               "candidates": [{"choice": k, "text": self.candidates[i].text} for k, i in enumerate(self.shown)]}
        if self.revealed:
            out.update(self.results())
        return out

    def results(self) -> dict:
        picks, guesses = self.tally()
        n = max(1, len(self.votes))
        return {"drawn": {"token_id": self.drawn, "text": self.drawn_text, "prob": self.drawn_prob,
                          "prob_text": prob(self.drawn_prob)},
                "greedy": self.greedy,
                "candidates": [{"token_id": c.token_id, "text": c.text, "prob": c.prob, "final_prob": c.final_prob,
                                "prob_text": prob(c.final_prob), "choice": self.shown.index(i),
                                "votes": picks[c.token_id], "share": picks[c.token_id] / n}
                               for i, c in enumerate(self.candidates)],
                "guesses": [{"text": g, "votes": k} for g, k in guesses.most_common(SHOWN_GUESSES)],
                "other_guesses": sum(guesses.values()),
                "correct": sum(1 for v in self.votes.values() if v == self.drawn)}

    def export(self) -> dict:
        """The results (most likely first), with the order the class saw the choices in."""
        return {**self.public(), **self.results(), "revealed": self.revealed, "seed": self.seed,
                "shown_order": [self.candidates[i].token_id for i in self.shown]}


def fair_order(probs: list[float], seed: int) -> list[int]:
    """A shuffle of the candidates' indices from `seed`, never one that lists them most likely
    first (that order would rank them; with ties, any order that does)."""
    order, rng = list(range(len(probs))), random.Random(seed)
    ranked = len(set(probs)) > 1  # all equal: no order ranks them
    while ranked and all(probs[a] >= probs[b] for a, b in zip(order, order[1:])):
        rng.shuffle(order)
    return order
