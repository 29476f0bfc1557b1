"""The demo's handlers called directly, without a Gradio server (`vqa.demo.handlers`; the explorer's:
tests/test_demo_explorer.py): ask
returns the answer, its top answers and per-word heatmaps; caption its text and decoding details; bad input
(no picture, an empty question, a picture over the pixel limit, a file that is not a picture, a bad decoding
setting, a busy server) raises the gr.Error the page shows, naming the upload as the user called it. Also
what the page is built from: the upload names and messages (`vqa.demo.uploads`), the model card and the
familiarity reference (`vqa.demo.card`), the examples and the decoding controls. Through a running server:
tests/test_app.py."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile

import pytest
from demo_fixtures import error as _error
from PIL import Image
from predict_fixtures import COLOR_Q, DEMO_WARNINGS, ROOT, SHAPE_Q

gr = pytest.importorskip("gradio", reason="gradio is not installed (pip install -e '.[dev]')")

from vqa.demo import handlers as h  # noqa: E402
from vqa.demo.uploads import Upload, picture_input, user_message  # noqa: E402

pytestmark = DEMO_WARNINGS


def _defaults() -> list:
    """The caption tab's decoding controls at their defaults (an empty number box: 0, as the page sends)."""
    from vqa.config import GenerationConfig

    d = GenerationConfig.for_task("caption")
    return [0 if getattr(d, f.name) is None else getattr(d, f.name) for f in h.ui_fields()]



def test_ask_returns_the_answer_its_top_answers_and_a_heatmap_per_word(handlers, pictures):
    answer, label, words, note, state = handlers.ask(str(pictures["red_circle"]), COLOR_Q, 3, None)
    assert answer == "red" and note == ""
    assert list(label)[0] == "red" and 1 <= len(label) <= 3 and sum(label.values()) <= 1 + 1e-6
    assert [c[0] for c in words.choices] == ["1. red"] and words.value == 0
    assert state["words"] == ["red"] and len(state["maps"]) == 1 and state["image"] is None
    heat = handlers.heatmap(0, h.MEAN, h.MEAN, state)  # drawn on the picture (48 x 36) scaled to 480 px wide
    assert isinstance(heat, Image.Image) and heat.size == (480, 360)
    # the display copy, made on first use and kept as the user's one copy of the picture: a JPEG
    assert isinstance(state["image"], bytes) and len(state["image"]) < 100_000
    assert h.display_image(handlers.pred, state).size == (480, 360)
    one = handlers.heatmap(0, 1, 3, state)  # layer 2, head 4
    assert one.size == heat.size and one.tobytes() != heat.tobytes()
    assert handlers.heatmap(5, None, None, state).size == heat.size  # a word out of range: the first
    assert handlers.heatmap(0, h.MEAN, h.MEAN, None) is None  # nothing asked yet: no heatmap
    assert handlers.ask(str(pictures["blue_square"]), SHAPE_Q, 1, state)[0] == "square"


def test_caption_returns_the_text_its_details_and_a_heatmap_per_word(handlers, pictures):
    text, details, words, state = handlers.caption(str(pictures["blue_square"]), "greedy", *_defaults(), None)
    assert text == "a blue square" and "(greedy)" in details
    assert [c[0] for c in words.choices] == ["1. a", "2. blue", "3. square"]
    assert handlers.heatmap(2, h.MEAN, h.MEAN, state).size == (480, 360)
    values = _defaults()
    names = [f.name for f in h.ui_fields()]
    values[names.index("num_beams")] = 3
    text, details, *_ = handlers.caption(str(pictures["blue_square"]), "beam", *values, None)
    assert text and details.startswith("1. ") and "3. " in details  # beam search lists its beams
    values = _defaults()
    values[names.index("seed")] = 7
    assert "seed 7" in handlers.caption(str(pictures["blue_square"]), "sample", *values, None)[1]


def test_bad_input_raises_the_message_the_page_shows(handlers, pred, pictures, tmp_path):
    good = str(pictures["red_circle"])
    for err in (_error(handlers.ask, None, COLOR_Q, 3, None),
                _error(handlers.caption, None, "greedy", *_defaults(), None)):
        assert "upload a picture" in err.message and err.title == "No picture"
    for q in ("", "   ", None):
        err = _error(handlers.ask, good, q, 3, None)
        assert "type a question" in err.message and err.title == "The question is empty"
    answer, _, _, note, _ = handlers.ask(good, "what color " * 1000, 3, None)  # 10,000 characters
    assert answer and f"first {h.MAX_QUESTION_CHARS} characters" in note
    answer, _, _, note, _ = handlers.ask(good, "what color is the shape? 🙂🎨", 3, None)
    assert answer == "red" and "<unk>" not in note  # byte fallback: the emoji are read as their bytes
    Image.new("RGB", (300, 200), (90, 90, 90)).save(tmp_path / "big.png")
    upload = Upload(str(tmp_path / "big.png"), '"holiday.png"')  # the server's path, the user's name
    old = pred.max_pixels
    pred.max_pixels = 50_000  # stand-in for the 64-megapixel limit
    try:
        for err in (_error(handlers.ask, upload, COLOR_Q, 3, None),
                    _error(handlers.caption, upload, "greedy", *_defaults(), None)):
            assert '"holiday.png"' in err.message and "over the limit" in err.message, err.message
            assert str(tmp_path) not in err.message and err.title == "Cannot do that"
    finally:
        pred.max_pixels = old
    values = _defaults()
    values[[f.name for f in h.ui_fields()].index("top_p")] = 0.0
    assert "top_p" in _error(handlers.caption, good, "sample", *values, None).message
    err = _error(handlers.caption, good, "nonsense", *_defaults(), None)
    assert "choose one of: greedy, beam, sample" in err.message
    values = _defaults()
    values[[f.name for f in h.ui_fields()].index("temperature")] = "warm"
    assert "Bad decoding setting" in _error(handlers.caption, good, "sample", *values, None).message
    assert handlers.ask(good, COLOR_Q, 3, None)[0] == "red"


def test_api_callers_are_held_to_the_bounds_the_controls_show(handlers, pred, pictures):
    """A caller of /ask or /caption can send any number (gradio_client, curl): top_k far above the slider's
    maximum would ask for that many beams while holding the model lock, a temperature near zero gave NaN
    probabilities. Every value is checked against its control's bounds before anything reaches the model."""
    from vqa.config import GenerationConfig

    class Untouchable:
        def answer(self, *args):
            raise AssertionError("a value out of bounds reached the model")

        caption = answer

    guarded, good, names = h.Handlers(pred, Untouchable()), str(pictures["red_circle"]), [f.name for f in h.ui_fields()]
    for top_k in (1000, 0, -3, 2.5, float("nan"), float("inf"), "many", None):
        err = _error(guarded.ask, good, COLOR_Q, top_k, None)
        assert err.message.startswith("top_k (answers to list) must be a whole number from 1 to 5, got"), err.message
    bad = dict(temperature=[1e-9, 0.0, float("nan"), 2.5], top_p=[0.0, 1.5], top_k=[51, -1, 1.5],
               num_beams=[1000, 0], length_penalty=[-1.0, float("inf")], seed=[-1, 2**63, float("inf"), 0.5])
    for name, values in bad.items():
        lo, hi = GenerationConfig.ui_bounds(name)
        for v in values:
            settings = _defaults()
            settings[names.index(name)] = v
            err = _error(guarded.caption, good, "sample", *settings, None)
            assert err.message.startswith(f"Bad decoding setting: {name} must be")
            assert f"from {lo} to {hi}" in err.message
            assert err.title == "Bad setting"
    # the sliders' own ends are served (the smallest temperature samples real words, no NaN)
    for name in ("temperature", "top_p", "top_k", "num_beams", "length_penalty"):
        for end in GenerationConfig.ui_bounds(name):
            settings = _defaults()
            settings[names.index(name)] = end
            settings[names.index("seed")] = 2**63 - 1
            assert handlers.caption(good, "sample", *settings, None)[0]
    assert len(handlers.ask(good, COLOR_Q, 5.0, None)[1]) <= 5  # a slider sends floats: a whole one is fine


def test_a_busy_server_says_so(pred, pictures):
    from vqa.inference.serving import Busy

    class Full:
        def answer(self, *args):
            raise Busy("the demo is busy: try again in a moment")

        caption = answer

    busy = h.Handlers(pred, Full())
    for err in (_error(busy.ask, str(pictures["red_circle"]), COLOR_Q, 3, None),
                _error(busy.caption, str(pictures["red_circle"]), "greedy", *_defaults(), None)):
        assert err.title == "Busy" and "busy" in err.message


def test_a_file_that_is_not_a_picture_is_named_as_the_user_called_it(tmp_path, pictures):
    from gradio.data_classes import ImageData

    image = picture_input()
    fake = tmp_path / "upload-cache" / "notes.png"
    fake.parent.mkdir()
    fake.write_text("this is not a picture")
    err = _error(image.preprocess, ImageData(path=str(fake), orig_name="notes.png"))
    assert 'Could not read "notes.png" as a picture' in err.message and err.title == "Not a picture"
    assert str(tmp_path) not in err.message
    good = image.preprocess(ImageData(path=str(pictures["red_circle"]), orig_name="/home/me/circle.png"))
    assert isinstance(good, Upload) and good.display_name == '"circle.png"' and os.path.isfile(good)
    assert image.preprocess(None) is None


def test_messages_lose_server_paths_even_without_a_name():
    path = os.path.join(tempfile.gettempdir(), "gradio", "abc123", "t.png")
    msg = user_message(f"{path}: truncated image file", path)
    assert msg == "the uploaded file: truncated image file"
    named = Upload(path, '"holiday.png"')
    assert user_message(f"{path}: truncated", named) == '"holiday.png": truncated'
    other = os.path.join(tempfile.gettempdir(), "elsewhere", "x.png")
    assert tempfile.gettempdir() not in user_message(f"cannot read {other}, sorry", None)


def test_the_card_says_what_the_model_was_trained_on(pred, shapes_dir):
    from types import SimpleNamespace

    from vqa.demo.card import card_markdown, start_reference, training_data

    card = card_markdown(pred)
    assert "test-tiny" in card and f"{pred.model.num_parameters():,}" in card and "| VQA accuracy |" in card
    assert "two made-up pictures" in card
    saved = dict(pred.card)
    try:
        pred.card["data"] = str(shapes_dir)
        card = card_markdown(pred)
        assert "**Shapes**" in card and "guesses" in card
        assert training_data(pred.card)[1] == shapes_dir
        stub = SimpleNamespace(familiarity=None)  # "auto": built from the training pictures the card names
        assert "compared with 24 pictures of" in start_reference(stub, pred, "auto")
        assert stub.familiarity.reference.shape[0] == 24 and stub.familiarity.threshold > 0
        assert start_reference(SimpleNamespace(familiarity=None), pred, None) == ""
        pred.card["data"] = "/nowhere/shapes"
        assert "not on this machine" in start_reference(stub, pred, "auto")
        assert "**Shapes**" in card_markdown(pred)  # named shapes: still described
        assert "circle" in card_markdown(pred)  # the set's own vocabulary, read from the generator
        pred.card["data"] = "/nowhere/scenes"
        card = card_markdown(pred)
        assert "**Scenes**" in card and "hexagon" in card and "**Shapes**" not in card
        pred.card["data"] = "/nowhere/glyphs"
        card = card_markdown(pred)
        assert "**Glyphs**" in card and "built-in font" in card and "**Scenes**" not in card
    finally:
        pred.card.clear()
        pred.card.update(saved)


def test_the_examples_and_the_decoding_controls():
    from vqa.config import GenerationConfig
    from vqa.demo.ask_tab import decoding_controls, examples

    ex = examples()
    assert len(ex) >= 6 and all(os.path.isfile(p) and q.endswith("?") for p, q in ex)
    meta = json.loads((ROOT / "vqa" / "samples" / "samples.json").read_text())
    assert {m["kind"] for m in meta} == {"picture", "shapes"}
    controls = decoding_controls()
    assert [c.elem_id for c in controls] == [f"gen-{f.name}" for f in h.ui_fields()]
    for c, f in zip(controls, h.ui_fields(), strict=True):  # each control shows the bounds the server checks
        assert (c.minimum, c.maximum) == GenerationConfig.ui_bounds(f.name)
    settings = h.decoding_settings("greedy", [c.value for c in controls])  # an empty seed box shows 0
    assert settings == dataclasses.replace(GenerationConfig.for_task("caption"), seed=0)
    assert h.decoding_settings("beam", [None if c.elem_id == "gen-seed" else c.value for c in controls]) == \
        GenerationConfig.for_task("caption", method="beam")


def test_the_caption_tab_shows_the_controls_of_the_chosen_method_only():
    from vqa.demo.ask_tab import decoding_controls, shown_for

    names = [f.name for f in h.ui_fields()]
    assert [n for n, v in zip(names, shown_for("greedy"), strict=True) if v] == []
    assert [n for n, v in zip(names, shown_for("beam"), strict=True) if v] == ["num_beams", "length_penalty"]
    assert [n for n, v in zip(names, shown_for("sample"), strict=True) if v] == ["temperature", "top_k", "top_p",
                                                                                   "seed"]
    assert [c.visible for c in decoding_controls("beam")] == shown_for("beam")


def test_the_card_scores_read_as_words_on_one_scale():
    from vqa.demo.card import score_rows

    rows = dict(score_rows({"images": 1000, "questions": 6000, "seconds": 12.3, "vqa_accuracy": 96.18,
                            "per_answer_type": {"number": 88.61}, "per_question_type": {"count": 44.44},
                            "BLEU-4": 0.6112, "CIDEr-D": 3.424}))
    assert rows == {"images scored": "1,000", "questions scored": "6,000", "scoring time": "12 s",
                    "VQA accuracy": "96.2%", 'VQA accuracy, answers of type "number"': "88.6%",
                    'VQA accuracy, questions of type "count"': "44.4%", "BLEU-4": "61.1", "CIDEr-D": "342.4"}


def test_a_failed_ask_or_caption_clears_the_heatmap(pred):
    from vqa.demo.app import build_app

    demo = build_app(pred)
    try:
        deps = demo.config["dependencies"]
        heat = next(b._id for b in demo.blocks.values() if getattr(b, "elem_id", None) == "heatmap")
        for api in ("ask", "caption"):
            request = next(d["id"] for d in deps if d.get("api_name") == api)
            on_failure = [d for d in deps if d.get("trigger_after") == request and d.get("trigger_only_on_failure")]
            assert [d["outputs"] for d in on_failure] == [[heat]], api
    finally:
        demo.close()
