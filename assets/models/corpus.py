"""The training corpus: the English fortune-cookie files of Debian's `fortunes`.

Why this corpus: it must exist offline on a fresh machine, from a package
registry, under a licence that lets us ship models trained on it.
`apt-get install -y fortunes` (Debian package `fortunes`, 1:1.99.1, BSD licence,
see /usr/share/doc/fortunes/copyright) installs ~2.5 MB of short English texts
(quotes, jokes, poems, definitions), one "document" per fortune, separated by
a line holding a single `%`.

The split is a pure function of each document's text (a SHA-1 bucket), so it is
the same on every machine and does not depend on file order.
"""
from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from pathlib import Path

FORTUNES_DIR = Path("/usr/share/games/fortunes")
INSTALL_HINT = "apt-get install -y fortunes"

# Files left out: pictures made of characters, code, and the categories whose
# jokes are about ethnicity, gender or drugs (this model is shown to classes).
EXCLUDED_FILES = {"ascii-art", "ethnic", "men-women", "drugs", "perl", "translate-me"}

# Buckets of SHA-1(text) % 100: 0-4 held-out test, 5-9 validation, rest train.
TEST_BUCKETS = range(0, 5)
VAL_BUCKETS = range(5, 10)

# Human-readable topic per fortune file, used to phrase chat-style examples.
TOPICS = {
    "art": "art", "computers": "computers", "debian": "Debian", "definitions": "words",
    "education": "school", "food": "food", "humorists": "humor", "kids": "children",
    "law": "the law", "linux": "Linux", "linuxcookie": "Linux", "literature": "books",
    "love": "love", "magic": "magic", "medicine": "medicine", "news": "the news",
    "people": "people", "pets": "pets", "platitudes": "life", "politics": "politics",
    "riddles": "riddles", "science": "science", "songs-poems": "poems", "sports": "sports",
    "startrek": "Star Trek", "tao": "the Tao", "wisdom": "wisdom", "work": "work",
}
USER_PROMPTS = [
    "Tell me something about {topic}.",
    "Say something about {topic}.",
    "What do you know about {topic}?",
    "Give me a quote about {topic}.",
    "Tell me a fortune.",
    "Tell me something funny.",
    "Say something wise.",
]
SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a fortune cookie. Answer with one fortune.",
    "You are a friendly assistant who likes quotes and jokes.",
]


@dataclass(frozen=True)
class Doc:
    source: str  # fortune file name, e.g. "kids"
    text: str


def _clean(raw: str) -> str:
    """Undo the 72-column hard wrapping: a line that starts with whitespace
    (an indented paragraph or an `-- Author` line) starts a new line, any other
    line continues the previous one."""
    out: list[str] = []
    for line in raw.split("\n"):
        if not line.strip():
            if out and out[-1]:
                out.append("")
            continue
        starts_new = line[:1] in (" ", "\t") or not out or not out[-1]
        line = re.sub(r"\s+", " ", line.strip())
        if starts_new:
            out.append(line)
        else:
            out[-1] += " " + line
    return "\n".join(l for l in out if l).strip()


def _is_prose(text: str) -> bool:
    """Keep documents that are mostly letters and spaces (drops tables, art)."""
    if len(text) < 20:
        return False
    letters = sum(c.isalpha() or c.isspace() for c in text)
    return letters / len(text) >= 0.8


def load_docs(root: Path = FORTUNES_DIR) -> list[Doc]:
    """All cleaned, de-duplicated documents, in a fixed order."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root} not found: install the corpus with `{INSTALL_HINT}`")
    docs: list[Doc] = []
    seen: set[str] = set()
    for path in sorted(root.iterdir()):
        if path.is_symlink() or not path.is_file() or path.suffix or path.name in EXCLUDED_FILES:
            continue  # .dat indexes, .u8 symlinks
        raw = path.read_text(encoding="utf-8", errors="replace")
        for chunk in re.split(r"^%$", raw, flags=re.M):
            text = _clean(chunk)
            if _is_prose(text) and text not in seen:
                seen.add(text)
                docs.append(Doc(path.name, text))
    return docs


def bucket(text: str) -> int:
    return int(hashlib.sha1(text.encode("utf-8")).hexdigest(), 16) % 100


def split_docs(docs: list[Doc]) -> dict[str, list[Doc]]:
    """Deterministic train / val / test split (test is the card's held-out set)."""
    splits: dict[str, list[Doc]] = {"train": [], "val": [], "test": []}
    for d in docs:
        b = bucket(d.text)
        name = "test" if b in TEST_BUCKETS else "val" if b in VAL_BUCKETS else "train"
        splits[name].append(d)
    return splits


def chat_messages(doc: Doc, rng: random.Random) -> list[dict[str, str]]:
    """Wrap a fortune as a short conversation, so the model learns the chat
    format and to stop with the end-of-turn token after answering."""
    topic = TOPICS.get(doc.source, "life")
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    messages.append({"role": "user", "content": rng.choice(USER_PROMPTS).format(topic=topic)})
    messages.append({"role": "assistant", "content": doc.text})
    return messages
