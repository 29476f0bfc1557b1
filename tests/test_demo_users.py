"""What the demo keeps per user, through a served app: gradio's user capacity and the states' time to
live, and a user holding a handle to its explanation, never the Explanation (the handles and the shared
explanations without a server: tests/test_demo_handlers.py)."""

from __future__ import annotations

import time

import pytest
from predict_fixtures import COLOR_Q, DEMO_WARNINGS, demo_predictor, start_app, write_pictures

pytest.importorskip("gradio_client", reason="gradio_client is not installed (pip install -e '.[dev]')")
from gradio_client import Client, handle_file  # noqa: E402

pytestmark = DEMO_WARNINGS


def test_users_are_bounded_and_their_state_goes_after_its_time_to_live(tmp_path, monkeypatch):
    """Gradio keeps 10,000 users and a gr.State for as long as the server runs, unless told otherwise:
    the demo keeps USERS_KEPT, each user's state goes STATE_TTL seconds after it was last set (2 s
    here), and what a user holds is its answer and a handle, never an Explanation."""
    import vqa.demo.app as app
    from vqa.demo.explorer import Explained
    from vqa.inference.explain import Explanation

    monkeypatch.setattr(app, "STATE_TTL", 2)
    picture = write_pictures(tmp_path)["blue_square"]
    demo, url = start_app(demo_predictor())
    try:
        assert demo.state_session_capacity == app.USERS_KEPT < 10_000
        client = Client(url, verbose=False)
        client.predict(handle_file(str(picture)), COLOR_Q, 3, api_name="/ask")
        client.predict(api_name="/explain")

        def held():
            return [v for s in demo.state_holder.session_data.values() for v in s.state_data.values()
                    if v is not None]

        values = held()
        assert any(isinstance(v, Explained) for v in values)  # (the answer's state may have expired already)
        assert not any(isinstance(v, Explanation) for v in values)
        deadline = time.monotonic() + 30
        while held() and time.monotonic() < deadline:  # gradio drops expired state every second
            time.sleep(0.5)
        assert held() == []
    finally:
        demo.close()
