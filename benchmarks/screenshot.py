"""Save a screenshot of the page after one request (the README's picture).

    python -m benchmarks.screenshot [--out assets/static/screenshot.png] [--prompt ...] [app options]
"""
from __future__ import annotations

import argparse
import io
from pathlib import Path

from app.__main__ import build_services, parse_args
from benchmarks.browser import launch
from benchmarks.local_server import LocalServer

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "assets" / "static" / "screenshot.png"


def main(argv: list[str] | None = None) -> None:
    own = argparse.ArgumentParser(prog="python -m benchmarks.screenshot", description=__doc__, add_help=False,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    own.add_argument("--out", type=Path, default=DEFAULT_OUT)
    own.add_argument("--prompt", default="Tell me a short story about a fox.")
    own.add_argument("--max-tokens", type=int, default=48)
    own.add_argument("--temperature", type=float, default=None, help="the page's temperature (0: greedy)")
    own.add_argument("--height", type=int, default=6000, help="pixels of the page to keep, from the top")
    ours, rest = own.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:  # this tool's options, then the app's (parse_args prints them)
        own.print_help()
        print("\nand the app's options:")
    from PIL import Image
    from playwright.sync_api import sync_playwright

    with LocalServer(build_services(parse_args(rest))) as server, sync_playwright() as pw:
        browser = launch(pw)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(server.url, wait_until="load")
        page.wait_for_selector("#tt-send")
        page.fill("#tt-user textarea", ours.prompt)
        box = page.locator("#tt-max-tokens input[type=number]")
        box.fill(str(ours.max_tokens))
        box.press("Enter")
        if ours.temperature is not None:
            temp = page.locator("#tt-temperature input[type=number]")
            temp.fill(str(ours.temperature))
            temp.press("Enter")
        page.click("#tt-send")
        page.wait_for_function("document.querySelector('#tt-status textarea').value.includes('finished')",
                               timeout=300_000)
        page.wait_for_timeout(500)
        png = page.screenshot(full_page=True)
        browser.close()
    img = Image.open(io.BytesIO(png)).convert("RGB")
    img = img.crop((0, 0, img.width, min(img.height, ours.height)))
    img = img.resize((img.width * 3 // 4, img.height * 3 // 4), Image.LANCZOS)
    ours.out.parent.mkdir(parents=True, exist_ok=True)
    img.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(ours.out, optimize=True)
    print(f"{ours.out}: {img.width}x{img.height}, {ours.out.stat().st_size / 1024:.0f} KB")


if __name__ == "__main__":
    main()
