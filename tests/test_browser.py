"""Real-browser tests: headless Debian chromium (driven by Playwright's Python package, pointed at the system
browser: Playwright's own browser download is never used) opens the demo, uploads a picture, asks a question
and sees the answer and the heatmap on the page; then opens the attention explorer and sees the self-attention
matrix and the other views. Skips, saying why, when chromium or playwright is missing."""

from __future__ import annotations

import os
import shutil

import pytest
from predict_fixtures import COLOR_Q, shared_checkpoint, start_app, write_pictures

pytestmark = [
    pytest.mark.browser,
    pytest.mark.filterwarnings("ignore:.*no_silent_downcasting"),
    pytest.mark.filterwarnings("ignore:The copy keyword is deprecated"),
]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def find_chromium() -> str | None:
    for cand in (os.environ.get("VQA_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


@pytest.fixture(scope="module")
def browser():
    exe = find_chromium()
    if exe is None:
        pytest.skip("no chromium found (looked at $VQA_CHROMIUM, /usr/bin/chromium, PATH); "
                    "install it with `apt-get install -y chromium` (.ci/run does)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright Python package is not installed (pip install -e '.[dev]')")
    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, timeout=30_000)
    except Exception as e:  # a browser that cannot start here is an environment problem, not a vqa bug
        pw.stop()
        pytest.skip(f"{exe} did not start in headless mode: {str(e).splitlines()[0]}")
    yield b
    b.close()
    pw.stop()


def test_upload_a_picture_ask_and_see_the_answer_and_heatmap(browser, tmp_path):
    from playwright.sync_api import expect

    from vqa.inference.predict import Predictor

    pred = Predictor.from_pretrained(shared_checkpoint(), device="cpu")
    demo, url = start_app(pred)
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    try:
        page.goto(url, wait_until="domcontentloaded", timeout=30_000)
        picture = write_pictures(tmp_path)["blue_square"]
        page.locator("#picture input[type=file]").set_input_files(str(picture), timeout=20_000)
        page.locator("#question textarea").fill(COLOR_Q)
        page.locator("#ask-button").click()
        expect(page.locator("#answer textarea")).to_have_value("blue", timeout=30_000)
        expect(page.locator("#top-answers")).to_contain_text("blue")
        expect(page.locator("#heatmap img")).to_be_visible(timeout=10_000)
        expect(page.locator("#word")).to_contain_text("1. blue")
        # an empty question gets a message on the page, and the next question still works
        page.locator("#question textarea").fill("")
        page.locator("#ask-button").click()
        expect(page.get_by_text("Please type a question about the picture.")).to_be_visible(timeout=10_000)
        page.locator("#question textarea").fill("what shape is it?")
        page.locator("#ask-button").click()
        expect(page.locator("#answer textarea")).to_have_value("square", timeout=30_000)
    finally:
        page.close()
        demo.close()


def _natural_width(page, selector: str) -> int:
    return page.locator(selector).evaluate("img => img.complete ? img.naturalWidth : 0")


def test_the_attention_explorer_shows_the_matrix(browser, tmp_path):
    from playwright.sync_api import expect

    from vqa.inference.predict import Predictor

    pred = Predictor.from_pretrained(shared_checkpoint(), device="cpu")
    demo, url = start_app(pred)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    try:
        page.goto(url, wait_until="domcontentloaded", timeout=30_000)
        page.locator("#picture input[type=file]").set_input_files(str(write_pictures(tmp_path)["red_circle"]),
                                                                   timeout=20_000)
        page.locator("#question textarea").fill(COLOR_Q)
        page.locator("#ask-button").click()
        expect(page.locator("#answer textarea")).to_have_value("red", timeout=30_000)
        page.get_by_role("tab", name="Attention explorer").click()
        expect(page.locator("#explorer-info")).to_contain_text('"what color is the shape?" → "red"', timeout=30_000)
        for view in ("#self-attention img", "#cross-grid img", "#query-keys img", "#vit-attention img"):
            expect(page.locator(view)).to_be_visible(timeout=30_000)
        page.wait_for_function("document.querySelector('#self-attention img').naturalWidth > 300", timeout=10_000)
        assert _natural_width(page, "#self-attention img") > 300
        # another head redraws the matrix (the picture changes)
        before = page.locator("#self-attention img").get_attribute("src")
        page.locator("#ex-head input").click()
        page.get_by_role("option", name="head 1").click()
        page.wait_for_function(f"document.querySelector('#self-attention img').src != {before!r}", timeout=30_000)
    finally:
        page.close()
        demo.close()


# ------------------------------------------------------------------------------------------ the README screenshot


def take_screenshot(checkpoint: str, out: str, picture: str | None = None, question: str | None = None,
                    explorer_out: str | None = None) -> None:
    """Serve `checkpoint`, ask about `picture` (default: the first Shapes sample and its question) in headless
    chromium and save a screenshot of the page showing the answer and the heatmap to `out`; with
    `explorer_out`, also one of the attention explorer explaining that answer."""
    import json
    from pathlib import Path

    from playwright.sync_api import expect, sync_playwright

    from vqa.inference.predict import Predictor

    root = Path(__file__).resolve().parents[1]
    if picture is None:
        meta = json.loads((root / "vqa" / "samples" / "samples.json").read_text())
        first = next(m for m in meta if m["kind"] == "shapes")
        picture, question = str(root / "vqa" / "samples" / first["file"]), question or first["question"]
    pred = Predictor.from_pretrained(checkpoint)
    demo, url = start_app(pred)
    exe = find_chromium()
    if exe is None:
        raise SystemExit("no chromium found: apt-get install -y chromium")
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
            page.goto(url, wait_until="domcontentloaded")
            page.locator("#picture input[type=file]").set_input_files(picture)
            page.locator("#question textarea").fill(question)
            page.locator("#ask-button").click()
            expect(page.locator("#answer textarea")).not_to_have_value("", timeout=60_000)
            expect(page.locator("#heatmap img")).to_be_visible(timeout=10_000)
            page.wait_for_timeout(1000)  # let the label bars and the image finish drawing
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=out, full_page=False)
            print(f"answer: {page.locator('#answer textarea').input_value()!r}; screenshot: {out}")
            if explorer_out:
                page.set_viewport_size({"width": 1400, "height": 1600})
                page.get_by_role("tab", name="Attention explorer").click()
                for view in ("#self-attention img", "#cross-grid img", "#query-keys img", "#vit-attention img"):
                    expect(page.locator(view)).to_be_visible(timeout=60_000)
                page.wait_for_timeout(1500)
                page.screenshot(path=explorer_out, full_page=True)
                print(f"explorer screenshot: {explorer_out}")
            browser.close()
    finally:
        demo.close()


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="Screenshot the demo for the README.")
    p.add_argument("--checkpoint", default="runs/tiny")
    p.add_argument("--out", default="docs/screenshot.png")
    p.add_argument("--picture", default=None)
    p.add_argument("--question", default=None)
    p.add_argument("--explorer-out", default="docs/explorer.png", help="the explorer's screenshot ('' for none)")
    a = p.parse_args()
    take_screenshot(a.checkpoint, a.out, a.picture, a.question, a.explorer_out or None)
