"""Streaming seen in a real browser: headless Debian chromium asks the demo for a caption (several tokens with the
test model) and records the caption box's value every few milliseconds; the text grows in more than one step,
every value on the way is a prefix of the last, and the last equals the Predictor's non-streamed caption.
Skips like tests/test_browser.py when chromium or playwright is missing."""

from __future__ import annotations

import time

import pytest
import torch
from predict_fixtures import DEMO_WARNINGS, shared_checkpoint, start_app, write_pictures
from test_browser import browser  # noqa: F401  (the headless chromium fixture)

pytestmark = [pytest.mark.browser, *DEMO_WARNINGS]

# records every distinct value of the caption box into window.__seen (a textarea's value is no DOM mutation,
# so it is polled)
WATCH = """() => { window.__seen = []; setInterval(() => {
  const t = document.querySelector('#caption-text textarea'); const v = t ? t.value : '';
  if (v && window.__seen[window.__seen.length - 1] !== v) window.__seen.push(v); }, 2); }"""


def test_the_caption_fills_in_as_it_is_decoded_and_ends_as_the_predictor_says(browser, tmp_path):  # noqa: F811
    from playwright.sync_api import expect

    from vqa.inference.predict import Predictor

    pred = Predictor.from_pretrained(shared_checkpoint(), device="cpu")
    picture = write_pictures(tmp_path)["blue_square"]
    expected = pred.caption(picture).caption  # greedy, the demo's default method
    assert len(pred.tokenizer.encode(expected)) > 1, "the test needs a caption of several tokens"
    # the tiny model decodes a caption faster than the page redraws: each decoding step (one call of the
    # decoder's token embedding) is slowed, as a large model is, so every token reaches the page on its own
    embed = next(m for n, m in pred.model.named_modules() if n.endswith("embed") and isinstance(m, torch.nn.Embedding))
    embed.register_forward_hook(lambda *_: time.sleep(0.3))
    demo, url = start_app(pred)
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    try:
        page.goto(url, wait_until="domcontentloaded", timeout=30_000)
        page.locator("#picture input[type=file]").set_input_files(str(picture), timeout=20_000)
        page.get_by_role("tab", name="Caption", exact=True).click()
        page.evaluate(WATCH)
        page.locator("#caption-button").click()
        expect(page.locator("#caption-text textarea")).to_have_value(expected, timeout=30_000)
        page.wait_for_timeout(200)
        seen = page.evaluate("window.__seen")
    finally:
        page.close()
        demo.close()
    assert seen[-1] == expected, seen
    assert len(set(seen[:-1])) > 1, f"the caption appeared in {len(seen)} step(s): {seen}"
    assert all(expected.startswith(v) for v in seen), seen
