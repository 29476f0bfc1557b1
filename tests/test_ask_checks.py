"""What the Predictor checks before it decodes: a model answers only if it was trained for questions and captions
only if it was trained for captions (its card's tasks, as `vqa eval` checks), top_k > 1 needs beam search,
answers and captions have at least one token, and an image array with no pixels is refused -- each with a
clear error, through the Predictor, `vqa ask` / `vqa caption`, collections and the app."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from predict_fixtures import COLOR_Q, DEMO_WARNINGS, draw, shared_checkpoint, write_pictures

from vqa.cli import main
from vqa.config import GenerationConfig
from vqa.errors import InputError
from vqa.inference.predict import Predictor


def _with_tasks(folder, tasks: list[str]):
    """A copy of the shared checkpoint whose card says it was trained for `tasks`."""
    shutil.copytree(shared_checkpoint(), folder)
    card = json.loads((folder / "card.json").read_text())
    card["tasks"] = tasks
    (folder / "card.json").write_text(json.dumps(card))
    return folder


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    return dict(caption=_with_tasks(root / "captioner", ["caption"]), vqa=_with_tasks(root / "answerer", ["vqa"]))


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    return write_pictures(tmp_path_factory.mktemp("pictures"))


@pytest.fixture(scope="module")
def pred():
    return Predictor.from_pretrained(shared_checkpoint(), device="cpu", compile=False)


# ------------------------------------------------------------------------------------------------ tasks


def test_a_captioner_does_not_answer_and_an_answerer_does_not_caption(ckpts):
    captioner = Predictor.from_pretrained(ckpts["caption"], device="cpu", compile=False)
    assert captioner.tasks == ("caption",) and captioner.caption(draw("red_circle")).caption == "a red circle"
    for call in (lambda: captioner.answer(draw("red_circle"), COLOR_Q),
                 lambda: captioner.answer_batch([draw("red_circle")], [COLOR_Q]),
                 lambda: captioner.rank(draw("red_circle"), COLOR_Q, ["red", "blue"]),
                 lambda: captioner.explain(draw("red_circle"), COLOR_Q)):
        with pytest.raises(InputError, match="captioner, trained to caption only.*does not answer questions"):
            call()
    answerer = Predictor.from_pretrained(ckpts["vqa"], device="cpu", compile=False)
    assert answerer.answer(draw("red_circle"), COLOR_Q).answer == "red"
    for call in (lambda: answerer.caption(draw("red_circle")), lambda: answerer.caption_batch([draw("red_circle")]),
                 lambda: answerer.explain(draw("red_circle"))):
        with pytest.raises(InputError, match="trained to answer questions only.*does not caption"):
            call()


def test_vqa_ask_and_caption_refuse_a_model_not_trained_for_the_task(ckpts, pictures, tmp_path, capsys):
    img = str(pictures["red_circle"])
    assert main(["ask", "--checkpoint", str(ckpts["caption"]), img, COLOR_Q]) == 1
    err = capsys.readouterr().err
    assert "trained to caption only" in err and "Traceback" not in err
    assert main(["caption", "--checkpoint", str(ckpts["vqa"]), img]) == 1
    assert "does not caption" in capsys.readouterr().err
    # a collection stops before any work: no records of errors, one line
    out = tmp_path / "answers.jsonl"
    assert main(["ask", "--checkpoint", str(ckpts["caption"]), img, str(pictures["blue_square"]), COLOR_Q,
                 "--out", str(out), "--workers", "0"]) == 1
    assert "trained to caption only" in capsys.readouterr().err and not out.exists()
    assert main(["caption", "--checkpoint", str(ckpts["vqa"]), img, str(pictures["blue_square"]),
                 "--out", str(tmp_path / "captions.jsonl"), "--workers", "0"]) == 1
    assert "does not caption" in capsys.readouterr().err


@DEMO_WARNINGS[0]
@DEMO_WARNINGS[1]
@DEMO_WARNINGS[2]
def test_the_app_disables_the_ask_tab_of_a_captioner_and_its_handler_shows_why(ckpts, pictures):
    gr = pytest.importorskip("gradio", reason="gradio is not installed (pip install -e '.[dev]')")
    from vqa.demo.app import build_app
    from vqa.demo.handlers import Handlers
    from vqa.inference.serving import SharedPredictor

    captioner = Predictor.from_pretrained(ckpts["caption"], device="cpu", compile=False)
    handlers = Handlers(captioner, SharedPredictor(captioner, max_wait=0.0))
    with pytest.raises(gr.Error) as err:
        handlers.ask(str(pictures["red_circle"]), COLOR_Q, 3, None)
    assert "does not answer questions" in err.value.message and err.value.title == "Cannot do that"
    demo = build_app(captioner, reference=None)
    blocks = {getattr(b, "elem_id", None): b for b in demo.blocks.values()}
    assert blocks["ask-button"].interactive is False and blocks["question"].interactive is False
    assert "does not answer questions" in blocks["ask-untrained"].value
    assert blocks["caption-button"].interactive is not False and "caption-untrained" not in blocks
    answerer = Predictor.from_pretrained(ckpts["vqa"], device="cpu", compile=False)
    blocks = {getattr(b, "elem_id", None): b for b in build_app(answerer, reference=None).blocks.values()}
    assert blocks["caption-button"].interactive is False and "ask-untrained" not in blocks
    assert blocks["ask-button"].interactive is not False


# ------------------------------------------------------------------------------------------------ top_k


def test_top_k_above_one_needs_beam_search(pred, pictures, capsys):
    img = draw("red_circle")
    for method in ("greedy", "sample"):
        with pytest.raises(InputError, match=f"top_k=3 .*only beam search.*{method} decoding gives one answer"):
            pred.answer(img, COLOR_Q, top_k=3, method=method)
        with pytest.raises(InputError, match="only beam search"):
            pred.answer(img, COLOR_Q, top_k=2, generation=GenerationConfig(method=method))
    assert pred.answer(img, COLOR_Q, top_k=1, method="greedy").top_k[0][0] == "red"
    assert len(pred.answer(img, COLOR_Q, top_k=3).top_k) >= 1  # beam search, the default
    assert main(["ask", "--checkpoint", str(shared_checkpoint()), str(pictures["red_circle"]), COLOR_Q,
                 "--top-k", "2", "--method", "greedy"]) == 2
    err = capsys.readouterr().err
    assert "only beam search" in err and "Traceback" not in err


def test_top_k_is_allowed_by_the_registry_not_by_a_method_name(monkeypatch):
    """A method the registry marks `ranked` lists top-k answers; the check names the ranking methods it reads."""
    from vqa.config import DECODING_METHODS, DecodingMethod

    p = object.__new__(Predictor)
    p.tasks = ("vqa",)
    with pytest.raises(InputError, match="only beam search"):
        p.answer_settings(3, changes={"method": "greedy"})
    monkeypatch.setitem(DECODING_METHODS, "greedy", DecodingMethod(random=False, ranked=True))
    assert p.answer_settings(3, changes={"method": "greedy", "num_beams": 3}).method == "greedy"
    with pytest.raises(InputError, match="num_beams=2 cannot return top_k=3"):
        p.answer_settings(3, changes={"method": "greedy", "num_beams": 2})
    with pytest.raises(InputError, match="only greedy or beam search.*use method=.greedy.,"):
        p.answer_settings(3, changes={"method": "sample"})


# ------------------------------------------------------------------------------------------------ never empty


def test_answers_and_captions_have_at_least_one_token_whatever_the_config():
    assert GenerationConfig.for_task("vqa").min_new_tokens == GenerationConfig.for_task("caption").min_new_tokens == 1
    assert GenerationConfig().min_new_tokens == 0  # generate's own default: the textbook method
    p = object.__new__(Predictor)
    p.tasks = ("vqa", "caption")
    assert p.answer_settings(1, GenerationConfig(method="greedy")).min_new_tokens == 1
    assert p.answer_settings(1, changes=dict(min_new_tokens=0)).min_new_tokens == 1
    assert p.answer_settings(1, changes=dict(min_new_tokens=3)).min_new_tokens == 3
    assert p.caption_settings(GenerationConfig(method="beam")).min_new_tokens == 1


def test_an_answer_never_ends_before_its_first_token(pred, monkeypatch):
    """A model whose first choice is <eos>: the answer is its likeliest non-empty one."""
    model, eos = pred.model, pred.tokenizer.eos_id
    logits = type(model.decoder).logits

    def eos_first(self, hidden):
        out = logits(self, hidden).clone()
        out[..., eos] = out.max() + 50.0
        return out

    monkeypatch.setattr(type(model.decoder), "logits", eos_first)
    for method in ("greedy", "beam"):
        res = pred.answer(draw("red_circle"), COLOR_Q, method=method)
        assert res.ids and res.answer, method
    assert pred.caption(draw("red_circle")).caption


# ------------------------------------------------------------------------------------------------ images


def test_an_image_array_without_pixels_is_a_clear_error(pred):
    for shape in ((0, 10, 3), (10, 0, 3), (0, 0), (0, 7)):
        with pytest.raises(InputError, match=r"no pixels"):
            pred.answer(np.zeros(shape, dtype=np.uint8), COLOR_Q)
    import torch

    with pytest.raises(InputError, match="no pixels"):
        pred.caption(torch.zeros(0, 10, 3, dtype=torch.uint8))
    from PIL import Image

    with pytest.raises(InputError, match="empty"):
        pred.caption(Image.new("RGB", (0, 4)))
