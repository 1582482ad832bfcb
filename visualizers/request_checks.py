"""The Request panel's checks in the page's language. The server writes each check as
(name, passed, detail) in English (app/serving/requests.py: a failed check's detail is the
API's error message, which stays as the API gave it); a passed check's detail is the page's
own words, read back here into a catalog entry with its values. A detail no pattern knows is
shown as written."""
from __future__ import annotations

import re

from visualizers import i18n
from visualizers.i18n import N_

NAMES = {"messages": N_("messages"), "sampling": N_("sampling"), "engine": N_("engine"), "prompt": N_("prompt"),
         "body": N_("body"), "trace": N_("trace")}
# a passed check's detail (or one piece of the sampling line) -> its catalog entry, the groups its values
WHOLE = [(re.compile(r"(?P<n>[\d,]+) messages?"), None),
         (re.compile(r"a plain prompt of (?P<n>[\d,]+) characters \(no chat template\)"),
          N_("a plain prompt of {n} characters (no chat template)")),
         (re.compile(r"a plain prompt of (?P<n>[\d,]+) token ids \(no tokenizer, no chat template\)"),
          N_("a plain prompt of {n} token ids (no tokenizer, no chat template)")),
         (re.compile(r"accepted by (?P<model>.+); fits the context of (?P<n>[\d,]+) tokens and the KV pool"),
          N_("accepted by {model}; fits the context of {n} tokens and the KV pool")),
         (re.compile(r"accepted by (?P<model>.+) \(sent by another client\)"),
          N_("accepted by {model} (sent by another client)")),
         (re.compile(r"accepted \(recorded\)"), N_("accepted (recorded)")),
         (re.compile(r"ignored \(--ignore-unknown-fields\): (?P<fields>.+)"),
          N_("ignored (--ignore-unknown-fields): {fields}"))]
PIECES = [(re.compile(r"temperature (?P<t>[\d.]+)"), N_("temperature {t}")),
          (re.compile(r"top-k off"), N_("top-k off")),
          (re.compile(r"max (?P<n>[\d,]+) tokens"), N_("max {n} tokens")),
          (re.compile(r"greedy: the argmax, the same every run \(no seed needed\)"),
           N_("greedy: the argmax, the same every run (no seed needed)")),
          (re.compile(r"no seed \(a random draw\)"), N_("no seed (a random draw)")),
          (re.compile(r"(?P<n>\d+) choices \(the prompt prefilled once\)"),
           N_("{n} choices (the prompt prefilled once)"))]


def check_name(lang: str, name: str) -> str:
    return i18n.gettext(lang, NAMES[name]) if name in NAMES else name


def check_detail(lang: str, detail: str, passed: bool | None) -> str:
    """A check's detail in lang (plain text): a failed check's as the API wrote it."""
    if lang == i18n.DEFAULT or passed is False or not detail:
        return detail
    for pattern, msgid in WHOLE:
        m = pattern.fullmatch(detail)
        if m and msgid is None:  # the messages' count: the stages' own entry
            k = int(m["n"].replace(",", ""))
            return i18n.ngettext(lang, "{n} message", "{n} messages", k)
        if m:
            return i18n.gettext(lang, msgid, **m.groupdict())
    return i18n.gettext(lang, ", ").join(_piece(lang, p) for p in re.split(r", (?!the same every run)", detail))


def _piece(lang: str, piece: str) -> str:
    for pattern, msgid in PIECES:
        m = pattern.fullmatch(piece)
        if m:
            return i18n.gettext(lang, msgid, **m.groupdict())
    return piece
