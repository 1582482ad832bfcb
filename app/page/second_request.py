"""The prefix-cache stage's button, «Send the second request»: the request the stage sentence
promises will hit (visualizers.prefix_next.next_hit: a follow-up that keeps this request's
system prompt and question and adds to them, or the same prompt again), sent like Send on the
same model with the same settings, so its own prefix-cache stage shows the HIT."""
from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import gradio as gr

from app.page.controls import Controls
from app.page.language import tx
from visualizers.i18n import N_
from visualizers.prefix_next import NextHit, asked, next_hit

LABEL = N_("Send the second request (shares this prompt's prefix: a prefix-cache HIT)")  # in the catalogs


def controls_for(plan: NextHit, c: Controls, model: str | None) -> Controls | None:
    """The page's controls that post plan's request (None: the page's system prompt and one
    question cannot say it, e.g. a watched request of several turns)."""
    if plan.messages is None:
        return replace(c, user=plan.prompt or "", model=model)
    roles = [m.get("role") for m in plan.messages]
    if roles == ["user"]:
        return replace(c, system="", user=plan.messages[0]["content"], model=model)
    if roles == ["system", "user"]:
        return replace(c, system=plan.messages[0]["content"], user=plan.messages[1]["content"], model=model)
    return None


def send_second(ctl, key: str, c: Controls, client: str | None = None) -> Iterator[dict]:
    """ctl: the page's Controller. The tab's shown request -> its second request, streamed."""
    tab = ctl.sessions.get(key)
    view = tab.view if tab is not None else None
    if view is None or not view.request_id or tab.service is None:
        yield {"status": tx(key, "Send a request first: the second request shares its prefix")}
        return
    if not view.finished:
        yield {"status": tx(key, "{request} is still streaming: the second request waits for it to finish",
                            request=view.request_id)}
        return
    if view.first("tokenize") is None:
        yield {"status": tx(key, "no second request: this request's capture level (off) records no prompt tokens "
                                 "to share")}
        return
    msgs, prompt = asked(view.first("request.arrive"), view.body)
    plan = next_hit(view.first("tokenize"), msgs, prompt, int(view.model["block_size"]))
    mine = controls_for(plan, c, tab.service.model_name) if plan is not None else None
    if mine is None:
        yield {"status": tx(key, "no second request: this prompt fills no full block of the cache, so no second "
                                 "request can share it: type a longer one") if plan is None else
               tx(key, "no second request: the page sends a system prompt and one question; this request has other "
                       "turns")}
        return
    yield {"system": gr.update(value=mine.system), "user": gr.update(value=mine.user)}
    yield from ctl.run(key, mine, client)
