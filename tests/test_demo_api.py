"""The demo as an API: `vqa demo` started as a user starts it, on a free port, answers /ask, /caption and /point
through `gradio_client` exactly as the Predictor does (docs/demo.md's examples, with this test's checkpoint), the
answers streamed as generators and returned whole to a client."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image
from predict_fixtures import COLOR_Q, SHAPE_Q, free_port, shared_checkpoint, write_pictures

pytestmark = pytest.mark.slow
gradio_client = pytest.importorskip("gradio_client", reason="gradio_client is not installed (pip install '.[dev]')")

ROOT = Path(__file__).resolve().parents[1]


def test_ask_and_caption_through_gradio_client_equal_the_predictor(tmp_path):
    from vqa.inference.predict import Predictor

    run = shared_checkpoint()
    pictures = write_pictures(tmp_path / "pictures")
    pred = Predictor.from_pretrained(run, device="cpu")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", GRADIO_ANALYTICS_ENABLED="False")
    proc = subprocess.Popen([sys.executable, "-m", "vqa.cli", "demo", "--checkpoint", str(run), "--port", str(port),
                             "--device", "cpu"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        line, t0 = "", time.time()
        while "serving" not in line and time.time() - t0 < 300 and proc.poll() is None:
            line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}/" in line, line
        client = gradio_client.Client(f"http://127.0.0.1:{port}/", verbose=False)
        for picture in pictures.values():
            image = gradio_client.handle_file(str(picture))
            for question in (COLOR_Q, SHAPE_Q):
                answer, top, *_ = client.predict(image, question, 2, api_name="/ask")
                expected = pred.answer(picture, question, top_k=2)
                assert answer == expected.answer
                assert [c["label"] for c in top["confidences"]] == [a for a, _ in expected.top_k]
            # the decoding controls: num_beams, length_penalty, temperature, top_k, top_p, seed
            caption, details, *_ = client.predict(image, "beam", 3, 1.0, 1.0, 0, 1.0, 0, api_name="/caption")
            expected = pred.caption(picture, method="beam", num_beams=3, length_penalty=1.0)
            assert caption == expected.caption and expected.beams[0][0] in details
            assert client.predict(image, "greedy", 3, 1.0, 1.0, 0, 1.0, 0, api_name="/caption")[0] == \
                pred.caption(picture).caption
            marked, line = client.predict(image, "the red circle", api_name="/point")  # the picture, marked
            x, y = pred.point(picture, "the red circle").point
            assert f"found at ({x:.0f}, {y:.0f})" in line and Image.open(marked).size == Image.open(picture).size
    finally:
        proc.terminate()
        proc.wait(timeout=30)
