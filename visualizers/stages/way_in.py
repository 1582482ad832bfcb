"""The way in: the request arrives, is tokenized, looked up in the prefix cache, embedded."""
from __future__ import annotations

from visualizers import i18n
from visualizers._html import esc, fmt_bytes
from visualizers.i18n import N_
from visualizers.prefix_next import FOLLOW_UP, NextHit, asked, next_hit, system_tokens
from visualizers.stages.facts import Facts, Part, n, p, plural, said, said_n
from visualizers.tokens import id_prompt

NEVER = N_("Never reached")  # a finished request that did not get here (the page's heading says so too)
NOT_YET = "Not reached yet: this request is still on its way (the page re-reads it while it runs)."
IDLE = "No request yet: press Send (or Watch API requests) and this stage shows what happens here to it."


def not_yet(f: Facts) -> str:
    """A stage the request has not reached, or (before any request) one no request has, or one
    a request that ended early (stopped while it waited) never reached."""
    if f.idle:
        return idle_words(f)
    if f.finish:
        return said(f, "Never reached: the request ended ({reason}) before the engine ran it here.",
                    reason=esc(str(f.finish.get("reason") or "stopped")))
    return said(f, "Not reached yet: this request is still on its way (the page re-reads it while it runs).")
UNTRACED = "This request's capture level (off) records no engine events for this stage."


def idle_words(f: Facts) -> str:
    """IDLE in the stage's language."""
    return said(f, "No request yet: press Send (or Watch API requests) and this stage shows what happens here to it.")


def untraced_words(f: Facts) -> str:
    """UNTRACED in the stage's language."""
    return said(f, "This request's capture level (off) records no engine events for this stage.")


def request(f: Facts) -> Part:
    arrive = f.first.get("request.arrive") or {}
    body = f.body or {}
    msgs = arrive.get("messages") or body.get("messages") or []
    params = arrive.get("params") or {}
    if not params and body:
        params = {"max_tokens": body.get("max_tokens") or body.get("max_completion_tokens") or 0,
                  "temperature": body.get("temperature", 1.0)}
    ask = said(f, "at most {tokens} new tokens at temperature {temperature}", tokens=n(int(params.get("max_tokens") or 0)),
               temperature=n(float(params.get("temperature", 0) or 0)))
    ids = None if msgs else id_prompt(body)
    if msgs:
        chars = sum(len(m["content"]) for m in msgs if isinstance(m, dict) and isinstance(m.get("content"), str))
        values = {"messages": said_n(f, "{n} message", "{n} messages", len(msgs)), "ask": ask,
                  "chars": said_n(f, "{n} character", "{n} characters", chars)}
        what = (said(f, "Send will post a JSON body like any OpenAI client would: {messages}, {chars} of text, asking "
                        "for {ask}.", **values) if f.idle else  # before any request: the body the controls make
                said(f, "A client sent a JSON body like any OpenAI client would: {messages}, {chars} of text, asking "
                        "for {ask}.", **values))
    elif ids is not None:  # POST /v1/completions with token ids: no text was sent
        what = said_n(f, "A client sent a plain prompt (POST /v1/completions, no chat messages) as {n} token id, "
                         "not text, asking for {ask}.",
                      "A client sent a plain prompt (POST /v1/completions, no chat messages) as {n} token ids, "
                      "not text, asking for {ask}.", len(ids), ask=ask)
    else:  # POST /v1/completions: a plain prompt, no chat messages
        prompt = body.get("prompt") if isinstance(body.get("prompt"), str) else arrive.get("prompt")
        chars = len(prompt) if isinstance(prompt, str) else 0
        values = {"chars": said_n(f, "{n} character", "{n} characters", chars), "ask": ask}
        what = (said(f, "Send will post a plain prompt (POST /v1/completions, no chat messages) of {chars}, asking for "
                        "{ask}.", **values) if f.idle else
                said(f, "A client sent a plain prompt (POST /v1/completions, no chat messages) of {chars}, asking for "
                        "{ask}.", **values))
    checked = (said(f, "The server will check every field before the engine sees it and give the request an id that "
                       "every event carries.") if f.idle else
               said(f, "The server checked every field before the engine saw it, and gave the request its id {id}: "
                       "every event below carries that id.", id="<b>" + esc(f.request_id) + "</b>"))
    text = p(what, checked, routed(f, arrive.get("replica")))
    chip = esc(i18n.gettext(f.lang, "{chars} chars", chars=i18n.number(f.lang, chars)) if ids is None else
               i18n.ngettext(f.lang, "{n} token id", "{n} token ids", len(ids)))
    return Part(text, ("request",), chip, reached=bool(arrive or f.body))


def routed(f: Facts, route: dict | None) -> str:
    """One replica of several (--replicas) ran it: which one, and why the router chose it."""
    if not route:
        return ""
    return said(f, "The model runs on {replicas} replicas, each its own engine and KV pool: the {policy} router sent "
                   "this request to replica {replica} ({reason}).", replicas=n(int(route["of"])),
                policy=esc(route["policy"]), replica="<b>" + str(int(route["replica"]) + 1) + "</b>",
                reason=esc(route.get("reason") or ""))


def tokenize(f: Facts) -> Part:
    """Converted to the catalogs (issue 42): the pattern for the other stages. Whole sentences
    with named numbers, one entry per form, so a language may order them its own way."""
    tok = f.first.get("tokenize")
    chip = esc(i18n.ngettext(f.lang, "{n} token", "{n} tokens", f.n_prompt if not tok else int(tok["count"])))
    if not tok:
        if f.n_prompt:  # capture level off: the usage still counts the prompt's tokens
            return Part(p(said_n(f, "The tokenizer cut the prompt into {n} token; this request's capture level (off) "
                                   "records no more of them.",
                                "The tokenizer cut the prompt into {n} tokens; this request's capture level (off) "
                                "records no more of them.", f.n_prompt)), ("tokens",), chip)
        return Part(p(not_yet(f), said(f, "The chat template wraps the messages in role markers; byte-level BPE cuts "
                                         "the text into integer ids.")), ("tokens",), reached=False)
    special = sum(1 for t in tok["tokens"] if t.get("special"))
    vocab = n(int(tok.get("tokenizer_size") or f.model["vocab_size"]))
    total_tokens = int(tok["count"])
    if id_prompt(f.body) is not None:  # token ids sent: no template, no tokenizer
        cut = said_n(f, "The client sent {n} token id itself, so neither a chat template nor the tokenizer ran: "
                        "the id goes to the model as it is, an integer in a vocabulary of {vocab}.",
                     "The client sent the {n} token ids themselves, so neither a chat template nor the tokenizer "
                     "ran: the ids go to the model as they are, each an integer in a vocabulary of {vocab}.",
                     total_tokens, vocab=vocab)
        marks = said_n(f, "{n} of them is a special token (highlighted).", "{n} of them are special tokens "
                       "(highlighted).", special)
    elif tok.get("chat_template", True):
        cut = said_n(f, "The chat template wrapped the messages in role markers, then the tokenizer (byte-pair "
                       "encoding) cut the text into {n} token, each an integer id in a vocabulary of {vocab}.",
                    "The chat template wrapped the messages in role markers, then the tokenizer (byte-pair encoding) "
                    "cut the text into {n} tokens, each an integer id in a vocabulary of {vocab}.", total_tokens,
                    vocab=vocab)
        marks = said_n(f, "{n} of them is a special token that marks whose turn it is (highlighted).",
                      "{n} of them are special tokens that mark whose turn it is (highlighted).", special)
    else:
        cut = said_n(f, "A plain prompt gets no chat template: the tokenizer (byte-pair encoding) cut its text into "
                       "{n} token, each an integer id in a vocabulary of {vocab}.",
                    "A plain prompt gets no chat template: the tokenizer (byte-pair encoding) cut its text into {n} "
                    "tokens, each an integer id in a vocabulary of {vocab}.", total_tokens, vocab=vocab)
        marks = said_n(f, "{n} of them is a special token that marks where the text begins (highlighted).",
                      "{n} of them are special tokens that mark where the text begins (highlighted).", special)
    return Part(p(i18n.sentences(f.lang, cut, marks), said(f, "The model never sees letters: only these ids.")),
                ("tokens",), chip)


def _mark(f: Facts, word: str) -> str:
    """HIT or MISS, in bold, in the stage's language."""
    return "<b>" + esc(i18n.gettext(f.lang, word)) + "</b>"


def prefix(f: Facts) -> Part:
    look = f.first.get("prefix_cache.lookup")
    bs = f.model["block_size"]
    if not look and f.untraced:
        usage = (f.finish or {}).get("usage") or {}
        cached = int(usage.get("cached_tokens") or (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                     or 0)
        said_usage = said(f, "Its usage says {cached} of its {prompt} prompt tokens came from the prefix cache.",
                          cached=n(cached), prompt=n(f.n_prompt))
        return Part(p(untraced_words(f), said_usage if usage else ""), ("prefix",),
                    esc(i18n.gettext(f.lang, "{cached} cached", cached=i18n.number(f.lang, cached))) if usage else "")
    if not look:
        return Part(p(not_yet(f), said(f, "When the scheduler admits a request, the engine looks its prompt's blocks up "
                                          "in the prefix cache.")), ("prefix",), reached=False)
    total, cached, full = look["prompt_tokens"], look.get("cached_tokens", 0), look.get("full_blocks", 0)
    if look["hit"]:
        rest, hits, hit = total - cached, len(look["cached_blocks"]), _mark(f, N_("HIT"))
        found = said_n(f, "A {hit}. The engine hashed the prompt in blocks of {size} tokens and found {hits} of them "
                          "already in the cache, left by an earlier request that began the same way (a shared system "
                          "prompt, or the same conversation so far): {cached} of the {total} prompt tokens reuse those "
                          "K/V blocks and skip prefill; only the other {n} is computed now.",
                       "A {hit}. The engine hashed the prompt in blocks of {size} tokens and found {hits} of them "
                       "already in the cache, left by an earlier request that began the same way (a shared system "
                       "prompt, or the same conversation so far): {cached} of the {total} prompt tokens reuse those "
                       "K/V blocks and skip prefill; only the other {n} are computed now.", rest,
                       hit=hit, size=n(bs), hits=n(hits), cached=n(cached), total=n(total))
        text = p(found, said(f, "The blocks are shared, not copied: each one's reference count went up by one, and it "
                                "stays in the pool for as long as any request holds it."))
        return Part(text, ("prefix",), esc(i18n.ngettext(f.lang, "{n} block hit", "{n} blocks hit", hits)))
    miss = _mark(f, N_("MISS"))
    if not full:
        text = p(said(f, "A {miss}, with nothing to look up: only full blocks of {size} tokens are cached (and never a "
                         "prompt's last token), and this prompt's {total} tokens do not fill one, so every one is "
                         "computed now.", miss=miss, size=n(bs), total=n(total)), later_words(f, bs))
    else:
        text = p(said_n(f, "A {miss}. The engine hashed the prompt's {n} full block of {size} tokens and looked each "
                           "hash up: none was in the cache (no earlier request began the same way, or its blocks have "
                           "been evicted since), so all {total} prompt tokens are computed now.",
                        "A {miss}. The engine hashed the prompt's {n} full blocks of {size} tokens and looked each hash "
                        "up: none was in the cache (no earlier request began the same way, or its blocks have been "
                        "evicted since), so all {total} prompt tokens are computed now.", full,
                        miss=miss, size=n(bs), total=n(total)), later_words(f, bs))
    return Part(text, ("prefix",), esc(i18n.gettext(f.lang, "miss")))


def _asked(f: Facts) -> tuple[list | None, str | None]:
    return asked(f.first.get("request.arrive"), f.body)


def second_request(f: Facts) -> NextHit | None:
    """The second request that will hit this one's blocks (the page's button sends it)."""
    msgs, prompt = _asked(f)
    return next_hit(f.first.get("tokenize"), msgs, prompt, int(f.model["block_size"]))


def later_words(f: Facts, bs: int) -> str:
    """What a later request will find, as the block manager counts it: full blocks of the
    prefix it shares, never a promise that cannot hold."""
    msgs, _ = _asked(f)
    sys_n = system_tokens(f.first.get("tokenize"), msgs)
    words = []
    if sys_n is not None and any(isinstance(m, dict) and m.get("role") == "system" for m in msgs or []):
        if sys_n < bs:
            words.append(said_n(f, "This system prompt with its template is {n} token, less than one full block of "
                                   "{size}: another question under the same system prompt shares only those, fills no "
                                   "full block, and misses too.",
                                "This system prompt with its template is {n} tokens, less than one full block of "
                                "{size}: another question under the same system prompt shares only those, fills no "
                                "full block, and misses too.", sys_n, size=n(bs)))
        else:
            words.append(said_n(f, "Another question under the same system prompt shares its first {n} token (the "
                                   "system prompt with its template): it will find {blocks} ({tokens} tokens), a HIT.",
                                "Another question under the same system prompt shares its first {n} tokens (the "
                                "system prompt with its template): it will find {blocks} ({tokens} tokens), a HIT.",
                                sys_n, blocks=said_n(f, "{n} full block", "{n} full blocks", sys_n // bs),
                                tokens=n(sys_n // bs * bs)))
    words.append(_second(f, msgs, bs))
    return i18n.sentences(f.lang, *words)


def _second(f: Facts, msgs: list | None, bs: int) -> str:
    """The second request the page can send, and what it will find."""
    plan = second_request(f)
    if plan is None:
        return said(f, "No later request can reuse this prompt's K/V: a prompt must fill a full block ({tokens} tokens "
                       "or more) before another can share it.", tokens=n(bs + 1))
    values = {"shared": n(plan.shared), "blocks": said_n(f, "{n} block", "{n} blocks", plan.blocks),
              "tokens": n(plan.blocks * bs)}
    if plan.kind == "follow-up" and msgs:
        return said(f, "A follow-up that keeps this system prompt and question and adds «{follow}» begins with the "
                       "same {shared} tokens: it will find {blocks} ({tokens} tokens), a HIT. On the page, «Send the "
                       "second request» under this stage sends it.", follow=esc(FOLLOW_UP.strip()), **values)
    if plan.kind == "follow-up":
        return said(f, "A follow-up that keeps this prompt and adds «{follow}» begins with the same {shared} tokens: it "
                       "will find {blocks} ({tokens} tokens), a HIT. On the page, «Send the second request» under this "
                       "stage sends it.", follow=esc(FOLLOW_UP.strip()), **values)
    return said(f, "Sent again, the same prompt begins with all {shared} of these tokens: it will find {blocks} "
                   "({tokens} tokens; never the last token's), a HIT. On the page, «Send the second request» under "
                   "this stage sends it.", **values)


def cut_sentence(f: Facts) -> str:
    """Where the trace's byte cap stopped the tensor captures (the token, when the event says it)."""
    t = f.truncated
    if not t:
        return ""
    if isinstance(t.get("token"), int):
        return said(f, "The trace reached the server's size cap at engine step {step} (token {token}): the tensor "
                       "captures (embedding rows, attention, MoE routing, the lens) stop there, so those panels show "
                       "the steps before it.", step=n(int(t["step"])), token=n(int(t["token"])))
    return said(f, "The trace reached the server's size cap at engine step {step}: the tensor captures (embedding "
                   "rows, attention, MoE routing, the lens) stop there, so those panels show the steps before it.",
                step=n(int(t["step"])))


def embed(f: Facts) -> Part:
    d, b = f.model["hidden_size"], f.model["dtype_bytes"]
    np_ = f.n_prompt
    picks = said(f, "Each id picks one row of the embedding matrix ({rows} rows × {numbers} numbers).",
                 rows=n(int(f.model["vocab_size"])), numbers=n(d))
    if f.idle:  # the model's matrix; no prompt, no rows yet
        return Part(p(picks), ("embedding",), reached=False)
    reached = bool(f.steps or f.kept["embed"] or f.generated)
    # not run yet (or never: stopped while it waited): no rows were looked up, whatever its capture level
    lookups = _lookups(f) if reached else [not_yet(f)]
    shape = f"{np_:,} × {d:,}"
    size = said(f, "This request's prompt is {tokens} tokens: a [{shape}] matrix, {numbers} numbers, {bytes} in "
                   "{dtype}.", tokens=n(np_), shape=shape, numbers=n(np_ * d),
                bytes=esc(fmt_bytes(np_ * d * b)), dtype=esc(f.model["dtype"]))
    text = p(i18n.sentences(f.lang, picks, size), *lookups, cut_sentence(f))
    return Part(text, ("embedding",), shape, reached=reached)


def _lookups(f: Facts) -> list[str]:
    """Which rows the panel shows (one per position looked up) and how many went in."""
    embeds, d, cached = f.kept["embed"], f.model["hidden_size"], f.cached_tokens
    if not embeds:
        return [said(f, "This request was traced without tensors, so the rows themselves were not kept.")]
    seen: dict[int, int] = {}
    for e in embeds:
        for i in range(len(e["token_ids"])):
            seen[e["start"] + i] = seen.get(e["start"] + i, 0) + 1
    shown, total = len(seen), sum(seen.values())
    in_prompt = sum(1 for pos in seen if pos < f.n_prompt)
    spec = bool(f.kept["spec"])
    skipped = (said(f, " (the first {cached} came from the prefix cache: their rows were not looked up again)",
                    cached=n(cached)) if cached else "")
    fed = (said(f, "each generated token is looked up when it goes back in as the next step's input, and a verify "
                   "pass also looks up the draft's proposals") if spec else
           said(f, "each generated token is looked up when it goes back in as the next step's input"))
    shape = f"{shown:,} × {d:,}"
    words = [said(f, "The panel shows the rows this request looked up, one per position: [{shape}], that is {shown} "
                     "of the {prompt} prompt positions{skipped} and {after} after the prompt ({fed}).",
                  shape=shape, shown=n(in_prompt), prompt=n(f.n_prompt), skipped=skipped,
                  after=n(shown - in_prompt), fed=fed)]
    if total > shown:
        why = [w for w, on in ((said(f, "a rejected proposal's position is looked up again with the token the target "
                                        "chose"), spec),
                               (said(f, "a preempted request recomputes its tokens"),
                                bool((f.finish or {}).get("preemptions")))) if on]
        if why:
            words.append(said(f, "Counting every forward pass, {total} rows went in: {again} lookups were of a "
                                 "position already looked up ({why}).", total=n(total), again=n(total - shown),
                              why=said(f, "; ").join(why)))
        else:
            words.append(said(f, "Counting every forward pass, {total} rows went in: {again} lookups were of a "
                                 "position already looked up.", total=n(total), again=n(total - shown)))
    return words
