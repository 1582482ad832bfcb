"""The lab's words in a language: the experiments' titles and one-line descriptions, their
settings' labels and their tables' column names are written in app/lab as English data (a
result file keeps them so); here they are marked for the catalogs and translated where they
are shown. A label with a number in it ("chunks of 512") is looked up as its template
("chunks of {n}"; with several, {n1} {n2} …); "copy acceptance" as its two parts."""
from __future__ import annotations

import re

from visualizers import i18n
from visualizers.i18n import N_

WORDS = (
    # the experiments' titles (app/lab/*.py)
    N_("Static vs continuous batching"), N_("Chunked prefill: decoding streams against a long prompt"),
    N_("Prefill and decode apart: colocated with chunked prefill vs disaggregated"),
    N_("KV capacity: a pool too small"), N_("Precision: float32, int8 and int4 weights"),
    N_("Prefix caching and routing across replicas"), N_("Speculation by content"),
    # the settings' labels
    N_("static, together"), N_("static, staggered"), N_("continuous, together"), N_("continuous, staggered"),
    N_("no chunking"), N_("chunks of {n}"), N_("colocated, chunks of {n}"), N_("disaggregated (prefill | decode)"),
    N_("pool for all"), N_("pool too small"), N_("int8 weights"), N_("int4 weights"),
    N_("round-robin"), N_("least-loaded"), N_("prefix-aware"),
    N_("no speculation"), N_("draft model"), N_("n-gram lookup"),
    # the headline tables' columns
    N_("setting"), N_("engine steps"), N_("CPU time (s)"), N_("makespan (s)"), N_("mean latency (s)"),
    N_("p99 latency (s)"), N_("slot occupancy"), N_("long prompt (tokens)"), N_("most prefilled in a step"),
    N_("biggest step a stream waited on (tokens)"), N_("gap p50 (s)"), N_("gap p99 (s)"), N_("longest stall (s)"),
    N_("long prompt TTFT (s)"), N_("prefill tokens in the streams' steps"), N_("blocks handed over"),
    N_("bytes handed over"), N_("long prompts' TTFT, median (s)"), N_("handover's share of TTFT"),
    N_("KV pages"), N_("preemptions"), N_("pages lost"), N_("tokens recomputed"),
    N_("decode tokens/s"), N_("weights (bytes)"), N_("float32's bytes left float"), N_("top-1 agreement"),
    N_("KL mean (nats)"), N_("KL max (nats)"), N_("prefix hit rate"), N_("prefill tokens computed"),
    N_("mean TTFT (s)"), N_("p99 TTFT (s)"), N_("most requests on one replica"),
    N_("copy"), N_("code"), N_("prose"), N_("acceptance"), N_("tokens/pass"), N_("tokens/s"),
    N_("{what} {measure}"),
    # the requests' roles in the workloads, and what a step did
    N_("{n} tokens"), N_("stream"), N_("long prompt"), N_("request {n}"), N_("fixed text"),
    N_("prefill"), N_("decode"), N_("verify"), N_("waiting"), N_("idle"),
    # what a run is doing (its progress line: app/lab's report calls)
    N_("building the engine"), N_("step {n1}, {n2} of {n3} requests done"), N_("building replica {n1} of {n2}"),
    N_("tick {n1}: {n2} of {n3} requests done"),
)
_NUMBER = re.compile(r"\d+")


def word(lang: str, text: str) -> str:
    """A title, label or column name in `lang` (itself where the catalogs have no entry)."""
    if lang == i18n.DEFAULT or not text:
        return text  # ("" would be the catalog's header)
    said = i18n.gettext(lang, text)
    if said != text:
        return said
    numbers = _NUMBER.findall(text)
    if len(numbers) == 1:  # "chunks of 512" -> "chunks of {n}"
        template = _NUMBER.sub("{n}", text)
        if (said := i18n.gettext(lang, template)) != template:
            return said.format(n=numbers[0])
    elif numbers:  # "step 12, 3 of 8 requests done" -> "step {n1}, {n2} of {n3} requests done"
        count = iter(range(1, len(numbers) + 1))
        template = _NUMBER.sub(lambda m: "{n%d}" % next(count), text)
        if (said := i18n.gettext(lang, template)) != template:
            return said.format(**{f"n{i}": x for i, x in enumerate(numbers, 1)})
    what, _, measure = text.partition(" ")  # "copy acceptance"
    if measure and i18n.gettext(lang, what) != what and i18n.gettext(lang, measure) != measure:
        return i18n.gettext(lang, "{what} {measure}", what=i18n.gettext(lang, what),
                            measure=i18n.gettext(lang, measure))
    return text


def hover(lang: str, msgid: str, **values: object) -> str:
    """A plotly hover template in `lang`: its %{…} fields kept as they are, {names} filled (no
    str.format: plotly's braces are not Python's)."""
    text = i18n.gettext(lang, msgid)
    for name, value in values.items():
        text = text.replace("{" + name + "}", str(value))
    return text
