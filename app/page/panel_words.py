"""What a panel says when it has nothing to draw (the capture level left its stage out, no
request yet, a request that never ran), in the tab's language: the catalogs' entries, named
placeholders filled with plain text (the panels escape it)."""
from __future__ import annotations

from visualizers import i18n
from visualizers.i18n import N_

# what each capture level leaves out, for the panels that show it
NOT_RECORDED = {"off": N_("capture level off records only the streamed tokens, their timing and the usage"),
                "basic": N_("capture level basic records no tensors (embeddings, attention, MoE routing)")}
NEEDS_FULL = {"embedding": N_("not recorded: embedding rows need capture level full (this request: {level}); {ask}"),
              "attention": N_("not recorded: attention probabilities need capture level full (this request: {level}); "
                              "{ask}"),
              "moe": N_("not recorded: the router's picks need capture level full (this request: {level}); {ask}"),
              "logit_lens": N_("not recorded: the logit lens needs capture level full (this request: {level}); {ask}")}
NEEDS_BASIC = {"sampling": N_("not recorded: the sampling distributions need capture level basic or full (this "
                              "request: off); {ask}"),
               "spec": N_("not recorded: the speculative rounds need capture level basic or full (this request: off); "
                          "{ask}")}
# how to get what a panel lacks (an API request is at level basic unless its body says otherwise)
ASK = {"full": N_('ask for it: "trace_level": "full" in the API request\'s body, or Capture level full on this page '
                  "before Send"),
       "basic": N_('ask for it: "trace_level": "basic" (or "full") in the API request\'s body, or Capture level basic '
                   "or full on this page before Send")}
# before any request, the panels that would otherwise say they wait for one
IDLE = {"prefix": (N_("Prefix cache"), N_("no request yet: the lookup runs when the scheduler admits one")),
        "timeline": (N_("Timeline"), N_("no request yet"))}
TITLES = {"embedding": N_("Embedding"), "attention": N_("Attention"), "moe": N_("Mixture of experts"),
          "sampling": N_("Sampling"), "spec": N_("Speculative decoding"), "logit_lens": N_("Logit lens")}
# what a request that never ran has not got, for the panels that would say "not yet"
NEVER_RAN = {"embedding": N_("never reached: the request ended ({why}) before any engine step ran it, so no row was "
                             "looked up"),
             "attention": N_("never reached: the request ended ({why}) before any engine step ran it, so no "
                             "attention was computed"),
             "moe": N_("never reached: the request ended ({why}) before any engine step ran it, so no token was "
                       "routed"),
             "sampling": N_("never reached: the request ended ({why}) before any engine step ran it, so no token was "
                            "sampled"),
             "logit_lens": N_("never reached: the request ended ({why}) before any engine step ran it, so no token "
                              "was predicted"),
             "spec": N_("never reached: the request ended ({why}) before any engine step ran it, so no round was "
                        "proposed")}
# what a byte cap froze, by panel: (the event type, the captures' name)
CAPTURED = {"embedding": ("embed", N_("embedding rows")), "attention": ("attention", N_("attention captures")),
            "moe": ("moe", N_("MoE routing captures")), "logit_lens": ("logit_lens", N_("logit-lens captures"))}
OFF_ANSWER = N_("{off}: no tokenization, prefix-cache blocks, embeddings, attention, MoE routing, sampling, speculative "
                "rounds or engine steps (the KV pool is read from the engine as it runs); choose basic or full to see "
                "them")
OFF_TOKENS = N_("capture level off does not record the prompt's tokens (nor the vocabulary and template): the generated "
                "ones are the streamed outputs")
NO_DRAFT = N_("this model is served without a draft, so no speculative decoding (start it with --draft MODEL or "
              "--draft ngram)")
SPEC_OFF = N_("speculative decoding is off for this request")
CHOICES_TITLE, ITS_ID = N_("{n} choices"), N_("its id")
CHOICES_OF_ONE = N_("this request asked for {n} choices; its trace is choice 0's (the others ran as requests of their "
                    "own, {id}.1 …), so only choice 0 is drawn here")


def t(lang: str, msgid: str, **values) -> str:
    """msgid in lang (plain text: the panel escapes it)."""
    return i18n.gettext(lang, msgid, **values)


def missing(lang: str, name: str, level: str) -> str | None:
    """Why a panel has nothing to draw when its request does not record that stage."""
    if name in NEEDS_FULL and level != "full":
        return t(lang, NEEDS_FULL[name], level=level, ask=t(lang, ASK["full"]))
    if name in NEEDS_BASIC and level == "off":
        return t(lang, NEEDS_BASIC[name], ask=t(lang, ASK["basic"]))
    return None


def never_ran(lang: str, name: str, why: str) -> tuple[str, str]:
    """(title, message) of a panel whose request ended before any engine step ran it."""
    return t(lang, TITLES[name]), t(lang, NEVER_RAN[name], why=why)
