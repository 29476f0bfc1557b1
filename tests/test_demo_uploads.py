"""Large uploads cannot take the demo's memory (`vqa.demo.uploads`): the picture input never decodes an upload
and refuses one whose header is over the pixel limit, and all requests' decoded pictures share one budget
(scripts/upload_memory.py measures the same at full size)."""

from __future__ import annotations

import os

import pytest
from PIL import Image
from predict_fixtures import COLOR_Q, DEMO_WARNINGS, demo_predictor

gr = pytest.importorskip("gradio", reason="gradio is not installed (pip install -e '.[dev]')")

from vqa.demo import handlers as h  # noqa: E402
from vqa.demo.uploads import picture_input  # noqa: E402

pytestmark = DEMO_WARNINGS


@pytest.fixture(scope="module")
def pred():
    return demo_predictor()


def test_an_upload_is_never_decoded_by_the_input_and_is_refused_by_its_header(tmp_path, monkeypatch):
    """gradio's gr.Image decoded (and re-encoded) every upload that was not RGB in the request's thread,
    bounded only by PIL's own limit of 179 megapixels. The input now hands the file over as uploaded, and one
    whose header is over the pixel limit is refused before anything decodes it."""
    from gradio.data_classes import ImageData
    from PIL import ImageFile

    from vqa.data import images

    decoded = []
    real_load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda im: decoded.append(im.size) or real_load(im))
    image = picture_input()
    rgba = tmp_path / "screenshot.png"
    Image.new("RGBA", (300, 200), (10, 200, 30, 128)).save(rgba)
    assert image.preprocess(ImageData(path=str(rgba), orig_name="shot.png")) == str(rgba)  # the file itself
    monkeypatch.setattr(images, "MAX_PIXELS", 50_000)  # stand-in for the 64-megapixel limit
    for mode in ("RGB", "P", "RGBA"):
        big = tmp_path / f"big-{mode}.png"
        Image.new(mode, (400, 300)).save(big)
        decoded.clear()
        with pytest.raises(gr.Error) as caught:
            image.preprocess(ImageData(path=str(big), orig_name="wall.png"))
        err = caught.value
        assert err.title == "Picture too large" and decoded == []
        assert err.message.startswith('"wall.png" is 400x300 = 120,000 pixels, over the demo\'s limit of 50,000')


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_concurrent_large_uploads_stay_within_the_decode_budget(pred, tmp_path):
    """32 requests at once, each a small file that decodes to a large picture: their decoded pictures are
    held within the budget, never all at once, and the process's memory (RSS, sampled while they run) grows by
    the budget and the allocator's slack (0.3-0.6 GiB), not by 32 pictures (1.1-1.3 GiB without it)."""
    import sys
    import threading

    from vqa.demo.uploads import DecodeBudget, decoded_bytes
    from vqa.inference.serving import SharedPredictor

    if not sys.platform.startswith("linux"):
        pytest.skip("reads the RSS from /proc")
    path = tmp_path / "wide.png"
    Image.new("RGB", (2400, 2400), (220, 40, 40)).save(path)  # ~20 KB on disk, 22 MiB decoded (4 B a pixel)
    each = decoded_bytes(str(path))  # counted twice over: load_image holds a copy as it decodes
    assert path.stat().st_size < 100_000 and each == 2400 * 2400 * 8
    budget = DecodeBudget(max_bytes=2 * each, wait=60.0)
    handlers = h.Handlers(pred, SharedPredictor(pred, max_wait=0.0, attention=True), budget=budget)
    peak, done = [_rss()], threading.Event()

    def sample():
        while not done.is_set():
            peak.append(_rss())
            done.wait(0.001)

    base = _rss()
    sampler = threading.Thread(target=sample)
    sampler.start()
    answers = [None] * 32
    threads = [threading.Thread(target=lambda i=i: answers.__setitem__(i, handlers.ask(str(path), COLOR_Q, 1,
                                                                                         None)[0]))
               for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    done.set()
    sampler.join()
    assert answers == ["red"] * 32
    assert budget.peak <= budget.max_bytes and budget.held == 0
    grew = max(peak) - base
    # without the budget the 32 decodes grow the process by 1.1-1.3 GiB (32 x 2 copies of 22 MiB); with it by 0.3-0.6
    # GiB, depending on what the process's allocator already holds (more inside a long test run)
    assert grew < 0.6 * 32 * each, f"RSS grew by {grew / 2**20:.0f} MiB"


def test_the_decode_budget_waits_then_says_busy_and_lets_a_huge_picture_run_alone(monkeypatch):
    from PIL import Image as PILImage

    from vqa.demo import uploads
    from vqa.inference.serving import Busy

    budget = uploads.DecodeBudget(max_bytes=100, wait=0.0)
    with budget.hold(60):
        with pytest.raises(Busy, match="busy reading other large pictures"):
            with budget.hold(50):
                pass
        with budget.hold(40):
            assert budget.held == 100
    with budget.hold(500):  # larger than the whole budget: it runs, alone
        assert budget.held == 500
    assert budget.held == 0 and budget.peak == 500
    with pytest.raises(ValueError):
        uploads.DecodeBudget(max_bytes=0)
    assert uploads.decoded_bytes("/nowhere.png") == 0 and uploads.decoded_bytes(object()) == 0
    saved = PILImage.core.get_block_size()
    try:
        monkeypatch.setenv("PILLOW_BLOCK_SIZE", "16m")  # the operator's own setting wins
        uploads.give_back_decoded_memory()
        assert PILImage.core.get_block_size() == saved
        monkeypatch.delenv("PILLOW_BLOCK_SIZE")
        uploads.give_back_decoded_memory()
        assert PILImage.core.get_block_size() == uploads.PIL_BLOCK_SIZE
    finally:
        PILImage.core.set_block_size(saved)
