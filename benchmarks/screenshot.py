"""Screenshots of the page: the README's first picture (the map and the stages after one
request), or with --states every state of the page at 1,400 and 420 px for every served model.

    python -m benchmarks.screenshot [--out assets/static/screenshot.png] [--prompt ...] [app options]
    python -m benchmarks.screenshot --states DIR [--model smollm2 --model gemma3-270m ...]

--states DIR saves, per model (picked in the page) and width: idle, streaming, finished,
capture basic, capture off, stop, replay (a loaded trace scrubbed to its middle), watch (an
API request from another client), and the classroom's presenter, audience, question and
reveal; it prints one line per picture (what it shows, where). Look at them before saying a
layout is right.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import threading
import time
from pathlib import Path

import httpx

from app.__main__ import build_services, parse_args
from benchmarks.browser import launch
from benchmarks.local_server import LocalServer

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "assets" / "static" / "screenshot.png"
WIDTHS = (1400, 420)
STATUS = "document.querySelector('#tt-status textarea').value"


def status(page) -> str:
    return page.input_value("#tt-status textarea")


def wait_status(page, text: str, timeout_s: float = 120) -> str:
    page.wait_for_function(f"{STATUS}.includes({json.dumps(text)})", timeout=timeout_s * 1000)
    return status(page)


def set_number(page, elem: str, value) -> None:
    box = page.locator(f"#{elem} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def send(page, prompt: str, max_tokens: int, level: str = "full", wait: bool = True) -> str:
    page.check(f"#tt-level input[value={level}]")
    page.fill("#tt-user textarea", prompt)
    set_number(page, "tt-max-tokens", max_tokens)
    before = status(page)
    page.click("#tt-send")
    if not wait:
        return before
    page.wait_for_function(f"([old]) => {STATUS} !== old && {STATUS}.includes('finished')", arg=[before],
                           timeout=120_000)
    page.wait_for_timeout(800)
    return status(page)


def pick_model(page, name: str) -> None:
    page.locator("#tt-model input").click()
    page.locator(f"[role=option]:has-text('{name}')").first.click()
    wait_status(page, "Send goes to this model", 60)


class Pacer:
    """A sleep before each engine step of every served model while on (the embedded model answers
    in ~0.3 s: too fast to catch streaming or to stop), off for the other states."""

    def __init__(self, services, delay_s: float) -> None:
        self.delay_s, self.on = delay_s, False
        for svc in getattr(services, "services", [services]):
            step = svc.engine.step
            svc.engine.step = lambda step=step: (time.sleep(self.delay_s) if self.on else None, step())[1]

    @contextlib.contextmanager
    def paced(self):
        self.on = True
        try:
            yield
        finally:
            self.on = False


class Shots:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def take(self, page, name: str, what: str, full: bool = True) -> None:
        path = self.folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=full)
        print(f"{path}: {what}", flush=True)


def streaming_shot(page, shots: Shots, tag: str) -> bool:
    """The page mid-stream, said only when Status still says streaming once the picture is taken."""
    page.wait_for_function(f"/streaming, [3-9]|streaming, [1-9][0-9]/.test({STATUS})", timeout=120_000)
    # the window only, from the top (the map): a full page (7,000 px) takes seconds to shoot, and a
    # short answer ends meanwhile
    page.evaluate("window.scrollTo(0, 0)")
    shots.take(page, f"{tag}-streaming", "while the answer streams (the window's first screen)", full=False)
    if "streaming" in status(page):
        return True
    print(f"{tag}-streaming: the answer finished while the picture was taken (not a streaming picture)", flush=True)
    return False


def model_states(browser, url: str, model: str, width: int, shots: Shots, tag: str, pacer: Pacer) -> None:
    """Every state of the page for one model at one width."""
    ctx = browser.new_context(viewport={"width": width, "height": 1000}, accept_downloads=True)
    page = ctx.new_page()
    page.goto(url, wait_until="load")
    page.wait_for_selector("#tt-send")
    if model:
        pick_model(page, model)
    page.wait_for_timeout(800)
    shots.take(page, f"{tag}-idle", "before any request")
    before = send(page, "What is the capital of France?", 48, wait=False)
    try:
        caught = streaming_shot(page, shots, tag)
    except Exception:  # noqa: BLE001 - too fast to catch mid-stream: the paced story below is
        caught = False
        print(f"{tag}-streaming: the answer finished before a picture could be taken", flush=True)
    page.wait_for_function(f"([old]) => {STATUS} !== old && {STATUS}.includes('finished')", arg=[before],
                           timeout=120_000)
    page.wait_for_timeout(1000)
    shots.take(page, f"{tag}-finished", "after the request (Play offered if it was too fast to watch)")
    with page.expect_download() as d:
        page.click("#tt-export")
    trace = shots.folder / f"{tag}-trace.json"
    d.value.save_as(trace)
    send(page, "Name three colours.", 16, level="basic")
    shots.take(page, f"{tag}-basic", "capture level basic")
    send(page, "Name three colours.", 16, level="off")
    shots.take(page, f"{tag}-off", "capture level off")
    page.check("#tt-level input[value=full]")
    with pacer.paced():  # every engine step paced: Stop lands mid-stream even on the embedded model
        before = send(page, "Tell me a very long story about a fox and an owl.", 400, wait=False)
        # this request's own status (the last one's "finished" is still there): a few tokens streamed (Stop
        # then lands mid-answer, not before the first step: that picture showed a request that never ran), or over
        page.wait_for_function(f"([old]) => {STATUS} !== old && /streaming, ([3-9]|[1-9][0-9])|finished/"
                               f".test({STATUS})", arg=[before], timeout=120_000)
        if not caught:  # the first answer was too fast to catch: this one, paced, streams
            try:
                streaming_shot(page, shots, tag)
            except Exception:  # noqa: BLE001
                print(f"{tag}-streaming: even paced, the story ended before a picture", flush=True)
        page.click("#tt-stop")
        said = wait_status(page, "finished", 120)
    page.wait_for_timeout(800)
    shots.take(page, f"{tag}-stop", "a request stopped with Stop" if "abort" in said else
                f"Stop pressed, but the answer had ended first ({said})")
    ctx.close()

    ctx = browser.new_context(viewport={"width": width, "height": 1000})
    page = ctx.new_page()
    page.goto(url, wait_until="load")
    page.wait_for_selector("#tt-send")
    with page.expect_file_chooser() as chooser:
        page.click("#tt-load")
    chooser.value.set_files(str(trace))
    loaded = wait_status(page, "loaded")
    n = int(re.search(r"of (\d+) engine step", loaded).group(1))
    box = page.locator("#tt-step-box input")
    box.fill(str(max(1, n // 2)))
    box.press("Enter")
    wait_status(page, f"step {max(1, n // 2)} of {n}")
    page.wait_for_timeout(600)
    shots.take(page, f"{tag}-replay", f"a loaded trace at step {max(1, n // 2)} of {n} (controls read-only)")
    classroom(browser, page, url, width, shots, tag)
    ctx.close()
    watch(browser, url, model, width, shots, tag)


def watch(browser, url: str, model: str, width: int, shots: Shots, tag: str) -> None:
    """Watch API requests while another client streams one."""
    ctx = browser.new_context(viewport={"width": width, "height": 1000})
    page = ctx.new_page()
    page.goto(url, wait_until="load")
    page.wait_for_selector("#tt-send")
    page.click("#tt-watch")
    wait_status(page, "watching")
    name = model or page.input_value("#tt-model input").split(" — ")[0]
    body = {"model": name, "stream": True, "max_tokens": 40, "trace_level": "full",
            "messages": [{"role": "user", "content": "Why is the sky blue?"}]}
    def post() -> None:  # a base model has no chat template: its API is /v1/completions
        r = httpx.post(url + "v1/chat/completions", json=body, timeout=300)
        if r.status_code >= 400:
            plain = {k: v for k, v in body.items() if k != "messages"} | {"prompt": "The sky is blue because"}
            httpx.post(url + "v1/completions", json=plain, timeout=300)

    sender = threading.Thread(target=post)
    sender.start()
    try:
        page.wait_for_function(f"{STATUS}.includes('streaming')", timeout=120_000)
        shots.take(page, f"{tag}-watch", "watching an API request from another client")
    except Exception:  # noqa: BLE001
        print(f"{tag}-watch: the API request finished before a picture could be taken", flush=True)
    sender.join()
    wait_status(page, "waiting for the next request")
    page.wait_for_timeout(600)
    shots.take(page, f"{tag}-watched", "the watched request, finished")
    ctx.close()


def classroom(browser, page, url: str, width: int, shots: Shots, tag: str) -> None:
    """Classroom mode on the loaded trace: presenter, audience, the question and its reveal."""
    page.click("#tt-class-start")
    page.wait_for_selector("#tt-class-presenter")
    base = url.rstrip("/")
    presenter_href = page.get_attribute("#tt-class-presenter", "href")
    audience_href = page.get_attribute("#tt-class-audience", "href")
    tctx = browser.new_context(viewport={"width": max(width, 1280) if width > 420 else 420, "height": 900})
    actx = browser.new_context(viewport={"width": width, "height": 900})
    teacher, student = tctx.new_page(), actx.new_page()
    teacher.goto(base + presenter_href)
    student.goto(base + audience_href)
    teacher.wait_for_timeout(1500)
    shots.take(teacher, f"{tag}-class-presenter", "classroom: the presenter's first stage")
    shots.take(student, f"{tag}-class-audience", "classroom: an audience screen")
    opened = False
    for _ in range(20):
        if teacher.locator("#tt-q-open:not([hidden])").count():
            teacher.click("#tt-q-open")
            opened = True
            break
        teacher.keyboard.press("ArrowRight")
        teacher.wait_for_timeout(400)
    if opened:
        student.wait_for_timeout(1500)
        shots.take(teacher, f"{tag}-class-question", "classroom: the question, presenter")
        shots.take(student, f"{tag}-class-question-audience", "classroom: the question, audience")
        if teacher.locator("#tt-q-reveal").count():
            teacher.click("#tt-q-reveal")
            student.wait_for_timeout(1500)
            shots.take(student, f"{tag}-class-reveal", "classroom: the reveal, audience")
    else:
        print(f"{tag}-class-question: no 'predict the next token' button found", flush=True)
    tctx.close()
    actx.close()


def readme_picture(browser, url: str, ours) -> bytes:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url, wait_until="load")
    page.wait_for_selector("#tt-send")
    if ours.temperature is not None:
        set_number(page, "tt-temperature", ours.temperature)
    send(page, ours.prompt, ours.max_tokens)
    page.evaluate("window.scrollTo(0, 0)")
    return page.screenshot(full_page=True)


def main(argv: list[str] | None = None) -> None:
    own = argparse.ArgumentParser(prog="python -m benchmarks.screenshot", description=__doc__, add_help=False,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    own.add_argument("--out", type=Path, default=DEFAULT_OUT)
    own.add_argument("--states", type=Path, default=None, metavar="DIR", help="every state, every model, into DIR")
    own.add_argument("--widths", default=",".join(map(str, WIDTHS)), help="with --states: the widths, e.g. 420")
    own.add_argument("--pace", type=float, default=0.5, help="with --states: seconds slept before each engine "
                     "step of the story that Stop stops (and the streaming picture when the first answer was too fast)")
    own.add_argument("--prompt", default="What is the capital of France?")
    own.add_argument("--max-tokens", type=int, default=24)
    own.add_argument("--temperature", type=float, default=None, help="the page's temperature (0: greedy)")
    own.add_argument("--height", type=int, default=3200, help="pixels of the page to keep, from the top")
    ours, rest = own.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:  # this tool's options, then the app's (parse_args prints them)
        own.print_help()
        print("\nand the app's options:")
    from PIL import Image
    from playwright.sync_api import sync_playwright

    services = build_services(parse_args(rest))
    names = [s.model_name for s in getattr(services, "services", [services])]
    with LocalServer(services) as server, sync_playwright() as pw:
        browser = launch(pw)
        if ours.states is not None:
            shots, pacer = Shots(ours.states), Pacer(services, ours.pace)
            for name in names:
                for width in (int(w) for w in ours.widths.split(",")):
                    tag = f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}-{width}"
                    model_states(browser, server.url, name if len(names) > 1 else "", width, shots, tag, pacer)
            browser.close()
            return
        png = readme_picture(browser, server.url, ours)
        browser.close()
    img = Image.open(io.BytesIO(png)).convert("RGB")
    img = img.crop((0, 0, img.width, min(img.height, ours.height)))
    img = img.resize((img.width * 3 // 4, img.height * 3 // 4), Image.LANCZOS)
    ours.out.parent.mkdir(parents=True, exist_ok=True)
    img.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(ours.out, optimize=True)
    print(f"{ours.out}: {img.width}x{img.height}, {ours.out.stat().st_size / 1024:.0f} KB")


if __name__ == "__main__":
    main()
