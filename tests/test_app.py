"""The Gradio demo through its API (`gradio_client`), as served by `vqa.demo.server`: ask, caption, the heatmap as
an image, the encoding reused between questions, concurrent questions answered in shared batches, bad input
answered with a message that names the upload as the user called it (never a server path) while the server
keeps serving, the attention explorer's endpoint, the warning for unfamiliar pictures, the how-to page without
a model, and `python app.py` (its `main`) printing its address. The handlers without a server:
tests/test_demo_handlers.py."""

from __future__ import annotations

import os
import re
import time

import pytest
from PIL import Image
from predict_fixtures import (
    COLOR_Q,
    DEMO_WARNINGS,
    SHAPE_Q,
    demo_predictor,
    draw,
    free_port,
    load_app_module,
    shared_checkpoint,
    start_app,
    write_pictures,
)

gradio_client = pytest.importorskip("gradio_client", reason="gradio_client is not installed (pip install -e '.[dev]')")
from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from vqa.demo.app import build_app  # noqa: E402
from vqa.demo.server import serve  # noqa: E402

pytestmark = DEMO_WARNINGS


@pytest.fixture(scope="module")
def pred():
    return demo_predictor()


@pytest.fixture(scope="module")
def running(pred):
    demo, url = start_app(pred)
    yield demo, url
    demo.close()


@pytest.fixture(scope="module")
def server(running):
    return running[1]


@pytest.fixture()
def client(server):
    return Client(server, verbose=False)


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    return write_pictures(tmp_path_factory.mktemp("pictures"))


def _ask(client, image, question=COLOR_Q, top_k=3):
    return client.predict(image, question, top_k, api_name="/ask")


def _caption(client, image, method="greedy", submit=False, **settings):
    """/caption with the decoding controls the app shows (GenerationConfig's `ui` fields) at their defaults,
    `settings` changed."""
    import dataclasses

    from vqa.config import GenerationConfig

    defaults = GenerationConfig.for_task("caption")
    values = [settings.get(f.name, getattr(defaults, f.name) if getattr(defaults, f.name) is not None else 0)
              for f in dataclasses.fields(GenerationConfig) if f.metadata.get("ui")]
    call = client.submit if submit else client.predict
    return call(image, method, *values, api_name="/caption")


def test_the_api_names_are_stable(client):
    names = set(client.view_api(return_format="dict", print_info=False)["named_endpoints"])
    assert {"/ask", "/caption", "/point", "/heatmap"} <= names


def test_ask_answers_with_top_k_scores_and_a_heatmap_image(client, pictures):
    answer, label, word, note = _ask(client, handle_file(str(pictures["red_circle"])))
    assert answer == "red"
    conf = label["confidences"]
    assert conf[0]["label"] == "red" and 1 <= len(conf) <= 3
    assert [c["confidence"] for c in conf] == sorted((c["confidence"] for c in conf), reverse=True)
    assert sum(c["confidence"] for c in conf) <= 1 + 1e-6
    assert word["value"] == 0 and [c[0] for c in word["choices"]] == ["1. red"]
    assert note == ""
    heat = client.predict(0, -1, -1, api_name="/heatmap")  # drawn when asked for (the page asks right after)
    with Image.open(heat) as im:  # the heatmap is drawn on the picture (48 x 36) scaled to 480 px wide
        assert im.size == (480, 360) and im.mode == "RGB"
    answer, *_ = _ask(client, handle_file(str(pictures["blue_square"])), SHAPE_Q, 1)
    assert answer == "square"


def test_caption_and_its_decoding_settings(client, pictures):
    img = handle_file(str(pictures["blue_square"]))
    text, details, word, = _caption(client, img)
    assert text == "a blue square" and "greedy" in details
    assert [c[0] for c in word["choices"]] == ["1. a", "2. blue", "3. square"]
    assert Image.open(client.predict(2, -1, -1, api_name="/heatmap")).size == (480, 360)
    text, details, *_ = _caption(client, img, "beam", num_beams=3)
    assert text and details.startswith("1. ") and "3. " in details  # beam search lists its beams
    a = _caption(client, img, "sample", temperature=2.0, seed=7)
    b = _caption(client, img, "sample", temperature=2.0, seed=7)
    assert a[:2] == b[:2] and "seed 7" in a[1]  # a seeded sample is reproducible
    assert {_caption(client, img, "sample", temperature=2.0, seed=s)[0] for s in range(3)} | {a[0]} != {a[0]}


def test_the_heatmap_endpoint_redraws_a_chosen_word_layer_and_head(client, pictures):
    _caption(client, handle_file(str(pictures["blue_square"])))
    mean = client.predict(2, -1, -1, api_name="/heatmap")  # the word "square", all layers and heads
    one = client.predict(2, 1, 3, api_name="/heatmap")  # layer 2, head 4
    with Image.open(mean) as a, Image.open(one) as b:
        assert a.size == b.size == (480, 360)
        assert a.tobytes() != b.tobytes()


def test_a_second_question_about_the_same_picture_reuses_its_encoding(client, pred, pictures, monkeypatch):
    pred.encodings.clear()
    calls = []
    real = pred.model.encode
    monkeypatch.setattr(pred.model, "encode", lambda x: calls.append(1) or real(x))
    assert _ask(client, handle_file(str(pictures["red_circle"])), COLOR_Q)[0] == "red"
    assert _ask(client, handle_file(str(pictures["red_circle"])), SHAPE_Q)[0] == "circle"
    assert len(calls) == 1


def test_bad_input_gets_a_message_and_the_server_keeps_serving(client, pred, pictures, tmp_path):
    good = handle_file(str(pictures["red_circle"]))
    with pytest.raises(AppError, match="upload a picture"):
        _ask(client, None)
    with pytest.raises(AppError, match="upload a picture"):
        _caption(client, None)
    fake = tmp_path / "notes.png"
    fake.write_text("this is not a picture")
    with pytest.raises(AppError, match="as a picture"):
        _ask(client, handle_file(str(fake)))
    for q in ("", "   "):
        with pytest.raises(AppError, match="type a question"):
            _ask(client, good, q)
    answer, _, _, note = _ask(client, good, "what color " * 1000)  # 10,000 characters
    assert answer and "cut" in note
    answer, _, _, note = _ask(client, good, "what color is the shape? 🙂🎨")
    assert answer == "red" and "<unk>" not in note  # byte fallback: the emoji are read as their bytes
    for q in ("ما لون الشكل؟", "מה הצבע של הצורה?"):
        answer, *_ = _ask(client, good, q)
        assert isinstance(answer, str)
    big = Image.new("RGB", (300, 200), (90, 90, 90))
    big.save(tmp_path / "big.png")
    old = pred.max_pixels
    pred.max_pixels = 50_000  # stand-in for the 40-megapixel limit
    try:
        with pytest.raises(AppError, match="over the limit"):
            _ask(client, handle_file(str(tmp_path / "big.png")))
    finally:
        pred.max_pixels = old
    with pytest.raises(AppError, match="less than minimum"):  # a decoding setting out of its slider's range
        _caption(client, good, "sample", top_p=0.0)
    assert _ask(client, good)[0] == "red"  # still serving


def _no_server_path(message: str) -> None:
    import tempfile

    assert tempfile.gettempdir() not in message and "/gradio/" not in message, message


def test_upload_errors_name_the_file_as_the_user_called_it_never_a_server_path(client, pred, pictures, tmp_path):
    whole = (pictures["red_circle"]).read_bytes()
    cases = {}
    (tmp_path / "t.png").write_bytes(whole[: len(whole) // 2])  # truncated: the header reads, the pixels do not
    cases["t.png"] = "truncated"
    (tmp_path / "notes.png").write_text("this is not a picture")
    cases["notes.png"] = "as a picture"
    (tmp_path / "drawing.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")  # gradio passes .svg on
    cases["drawing.svg"] = "not an image"
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8\xff\xe0" + os.urandom(2000))  # a JPEG that is noise
    cases["photo.jpg"] = "picture|image"
    for name, what in cases.items():
        with pytest.raises(AppError) as err:
            _ask(client, handle_file(str(tmp_path / name)))
        msg = str(err.value)
        assert f'"{name}"' in msg and re.search(what, msg), msg
        _no_server_path(msg)
    Image.new("RGB", (300, 200), (90, 90, 90)).save(tmp_path / "big.png")
    old = pred.max_pixels
    pred.max_pixels = 50_000  # stand-in for the 64-megapixel limit
    try:
        for api in ("/ask", "/caption"):
            with pytest.raises(AppError) as err:
                (_ask if api == "/ask" else _caption)(client, handle_file(str(tmp_path / "big.png")))
            assert '"big.png"' in str(err.value) and "over the limit" in str(err.value)
            _no_server_path(str(err.value))
    finally:
        pred.max_pixels = old
    assert _ask(client, handle_file(str(pictures["red_circle"])))[0] == "red"  # still serving


def test_concurrent_questions_are_answered_in_shared_batches(running, client, pred, pictures):
    demo, _ = running
    batcher = demo.batching.batcher
    jobs = [(pictures["red_circle"], COLOR_Q), (pictures["blue_square"], SHAPE_Q), (pictures["blue_square"], COLOR_Q),
            (pictures["red_circle"], SHAPE_Q), (pictures["red_circle"], COLOR_Q), (pictures["blue_square"], COLOR_Q)]
    from test_serving import _count_submissions

    submitted = _count_submissions(batcher)
    sizes, real = [], batcher.run_batch  # this test's own batched calls (the counters are the whole module's)
    batcher.run_batch = lambda key, items: sizes.append(len(items)) or real(key, items)
    with pred._lock:  # hold the model: the requests gather in the batching layer meanwhile
        futures = [client.submit(handle_file(str(p)), q, 2, api_name="/ask") for p, q in jobs]
        deadline = time.monotonic() + 60
        while len(submitted) < len(jobs) and time.monotonic() < deadline:
            time.sleep(0.01)
    del batcher.submit  # back to the class's own method
    try:
        out = [f.result(timeout=60)[0] for f in futures]
    finally:
        batcher.run_batch = real
    assert out == ["red", "square", "blue", "circle", "red", "blue"]
    # the first request may start a batch of its own before the others arrive; the rest share one call
    assert sum(sizes) == len(jobs) and len(sizes) <= 2 and max(sizes) >= len(jobs) // 2, sizes


def test_the_explorer_shows_the_matrix_the_maps_and_exports_them(client, pictures):
    empty = client.predict(api_name="/explain")  # before any question: a hint, no pictures
    assert "Ask a question" in empty[5] and empty[6] is None
    _ask(client, handle_file(str(pictures["blue_square"])), COLOR_Q)
    (token, layer, head, row, col, info, self_img, cross_img, qk_img, vit_img,
     cross) = client.predict(api_name="/explain")
    assert '"what color is the shape?" → "blue"' in info
    for path in (self_img, cross_img, qk_img, vit_img):
        with Image.open(path) as im:
            assert im.width > 300 and im.height > 150
    value = lambda update: update["value"] if isinstance(update, dict) else update  # noqa: E731
    assert value(token) == 0 and value(head) == -1 and 1 <= value(row) <= 4 and 1 <= value(col) <= 4
    files = client.predict(*(value(x) for x in (token, layer, head, row, col, cross)), api_name="/export")
    names = sorted(os.path.basename(f) for f in files)
    assert "attention.npz" in names and "self_attention_layer1.png" in names
    assert any(n.startswith("cross_attention_01_blue") for n in names)
    import numpy as np

    with np.load(next(f for f in files if f.endswith(".npz"))) as z:
        assert z["tokens"][-1] == "blue" and z["self_weights"].shape[-1] == len(z["tokens"])


def test_unusual_pictures_get_a_warning_with_their_answer(pred, pictures):
    from vqa.demo.familiarity import Familiarity

    # a reference of red circles only: a blue square is unlike all of them, a red circle is not
    ref = Familiarity.from_images(pred, [draw("red_circle", (48, 36)), draw("red_circle", (52, 40)),
                                         draw("red_circle", (40, 40))], source="3 red circles")
    demo = build_app(pred, reference=ref)
    _, url, _ = serve(demo, port=free_port(), block=False, quiet=True)
    try:
        c = Client(url, verbose=False)
        answer, _, _, note = c.predict(handle_file(str(pictures["blue_square"])), COLOR_Q, 1, api_name="/ask")
        assert answer == "blue" and "looks unlike the pictures the model was trained on" in note
        answer, _, _, note = c.predict(handle_file(str(pictures["red_circle"])), COLOR_Q, 1, api_name="/ask")
        assert answer == "red" and "unlike" not in note
    finally:
        demo.close()


def test_a_slow_start_up_check_is_tried_again_and_never_suggests_sharing(pred, pictures, monkeypatch):
    """gradio checks its own address after launching and, when that fails (a busy machine), tells the user to
    set share=True. serve() launches again instead, and after the last try says what happened."""
    import gradio.networking

    real, calls = gradio.networking.url_ok, []

    def slow_once(url):
        calls.append(url)
        return len(calls) > 1 and real(url)

    monkeypatch.setattr(gradio.networking, "url_ok", slow_once)
    demo = build_app(pred)
    _, url, _ = serve(demo, port=free_port(), block=False, quiet=True)
    try:
        assert len(calls) == 2  # the second launch passed the check
        answer, *_ = Client(url, verbose=False).predict(handle_file(str(pictures["red_circle"])), COLOR_Q, 1,
                                                         api_name="/ask")
        assert answer == "red"
    finally:
        demo.close()
    monkeypatch.setattr(gradio.networking, "url_ok", lambda url: False)
    demo = build_app(pred)
    with pytest.raises(RuntimeError, match="did not answer its own start-up check 3 times") as e:
        serve(demo, port=free_port(), block=False, quiet=True)
    assert "share" not in str(e.value)


def test_uploads_over_the_size_limit_are_refused(server, tmp_path, client, pictures):
    import httpx

    blob = tmp_path / "huge.png"
    blob.write_bytes(os.urandom(11 * 1024 * 1024))
    with open(blob, "rb") as f:
        r = httpx.post(server + "gradio_api/upload", files={"files": ("huge.png", f, "image/png")}, timeout=60)
    assert r.status_code == 413
    with pytest.raises(ValueError, match="exceeds the maximum file size"):
        _ask(client, handle_file(str(blob)))
    assert _ask(client, handle_file(str(pictures["red_circle"])))[0] == "red"


def test_queue_sizes_follow_the_batch_size():
    from vqa.demo.server import queue_sizes

    assert queue_sizes(16) == (32, 64)
    assert queue_sizes(4, concurrency=6) == (6, 12)
    assert queue_sizes(4, 3, 1) == (3, 1)
    for bad in ((4, 0), (4, 3, 0)):
        with pytest.raises(ValueError):
            queue_sizes(*bad)


def test_concurrent_asks_and_a_caption_each_get_their_own_result(client, pictures):
    img = handle_file(str(pictures["blue_square"]))
    jobs = [client.submit(img, COLOR_Q, 2, api_name="/ask") for _ in range(3)]
    jobs.append(_caption(client, img, submit=True))
    out = [j.result(timeout=60)[0] for j in jobs]
    assert out == ["blue", "blue", "blue", "a blue square"]


def test_without_a_model_the_page_says_how_to_train_one(tmp_path, monkeypatch):
    from vqa.demo import server

    monkeypatch.setattr(server, "DEFAULT_RUN", tmp_path / "runs" / "tiny")
    assert server.load_predictor(None) is None
    demo = build_app(None)
    texts = [getattr(b, "value", "") or "" for b in demo.blocks.values()]
    # commands a pip install has: no make, no app.py
    how = [t for t in texts if isinstance(t, str) and "vqa train" in t]
    assert how and all("vqa demo --checkpoint" in t and "make demo" not in t and "app.py" not in t for t in how)
    from vqa.errors import CheckpointError

    with pytest.raises(CheckpointError):
        server.load_predictor(str(tmp_path / "nothing"))


def test_app_py_is_the_entry_point_over_vqa_demo():
    from vqa.demo import server

    assert load_app_module().main is server.main


def test_main_serves_on_127_0_0_1_and_prints_the_address(monkeypatch, capsys, tmp_path):
    import gradio as gr

    from vqa.demo import server as srv  # what `python app.py` runs

    built = {}
    real_build = srv.build_app
    monkeypatch.setattr(srv, "build_app", lambda p, **kw: built.update(demo=real_build(p, **kw)) or built["demo"])
    monkeypatch.setattr(gr.Blocks, "block_thread", lambda self: None)  # return instead of serving forever
    port = free_port()
    try:
        assert srv.main(["--checkpoint", str(shared_checkpoint()), "--port", str(port)]) == 0
        out = capsys.readouterr().out
        assert f"serving model {shared_checkpoint()} on cpu (float32) at http://127.0.0.1:{port}/" in out, out
        assert "batches of up to 16, 32 at once, 64 waiting" in out
        img = handle_file(str(write_pictures(tmp_path)["red_circle"]))
        assert Client(f"http://127.0.0.1:{port}/", verbose=False).predict(img, COLOR_Q, 1, api_name="/ask")[0] == "red"
    finally:
        if "demo" in built:
            built["demo"].close()
    assert srv.main(["--checkpoint", str(tmp_path / "none")]) == 1
    assert "no checkpoint" in capsys.readouterr().err
    port = free_port()
    try:
        assert srv.main(["--checkpoint", str(shared_checkpoint()), "--port", str(port), "--max-batch", "4",
                                "--queue-size", "5"]) == 0
        assert "batches of up to 4, 8 at once, 5 waiting" in capsys.readouterr().out
        assert built["demo"].batching.batcher.max_batch == 4
    finally:
        built["demo"].close()
    with pytest.raises(SystemExit):
        srv.main(["--checkpoint", str(shared_checkpoint()), "--max-batch", "0"])
