"""The demo's memory as users come and go, through a served app: what gradio and the demo keep per user is
bounded (gradio keeps USERS_KEPT users, the explorer its last few explanations), so after a warm-up the
Python heap stops growing however many users open the explorer and close. The resident-memory bound of the
full app is measured by scripts/load_app.py (docs/demo.md)."""

from __future__ import annotations

import gc
import tracemalloc
import uuid

import pytest
from predict_fixtures import COLOR_Q, DEMO_WARNINGS, SHAPE_Q, demo_predictor, start_app, write_pictures

pytest.importorskip("gradio_client", reason="gradio_client is not installed (pip install -e '.[dev]')")
from gradio_client import Client, handle_file  # noqa: E402

from vqa.demo.explorer import EXPLANATIONS_KEPT  # noqa: E402

pytestmark = [*DEMO_WARNINGS, pytest.mark.slow]

KEPT = 1  # users the app keeps here (its USERS_KEPT): each round of users is more than that
ROUND = 3  # users per round
# what the heap may still grow by over two rounds after the first: gradio's per-event records (bounded by its
# own caps); a user kept costs ~160 KiB (gradio's record of the page's 68 blocks, ~110 KiB, and its answer),
# so users kept without limit (6 more here) fail it, and so would a kept explanation (MiBs)
GROWTH_BOUND = 2**20 // 2


def test_memory_plateaus_as_explorer_users_come_and_go(tmp_path, monkeypatch):
    import vqa.demo.server as server

    monkeypatch.setattr(server, "USERS_KEPT", KEPT)
    # gradio's upload cache of its own: other apps on this machine delete the same pictures from the shared one
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path / "gradio"))
    pictures = list(write_pictures(tmp_path).values())
    demo, url = start_app(demo_predictor())
    try:
        client = Client(url, verbose=False)

        def users(n: int) -> None:
            for i in range(n):
                client.session_hash = uuid.uuid4().hex  # a new user: gradio keys what it keeps for a user by this
                client.predict(handle_file(str(pictures[i % len(pictures)])), (COLOR_Q, SHAPE_Q)[i % 2], 3,
                               api_name="/ask")
                client.predict(api_name="/explain")

        def heap() -> int:
            gc.collect()
            return tracemalloc.get_traced_memory()[0]

        # traced from the first user: an object made before tracing and replaced after it (matplotlib's figure
        # of the heatmaps, 7.5 MiB) would count as growth
        tracemalloc.start()
        try:
            users(EXPLANATIONS_KEPT)  # warm-up: the explorer's recent explanations full, gradio's first records
            users(ROUND)
            first = heap()
            users(2 * ROUND)
            grew = heap() - first
        finally:
            tracemalloc.stop()
        assert len(demo.state_holder.session_data) <= KEPT
        assert grew < GROWTH_BOUND, f"the heap grew by {grew / 2**20:.2f} MiB over {2 * ROUND} more users"
    finally:
        demo.close()
