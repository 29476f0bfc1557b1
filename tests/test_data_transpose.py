"""--transpose: training images with x and y swapped and their spatial phrases rewritten, so that what the
texts say stays true of the picture."""

from __future__ import annotations

import json
import re

import pytest
import torch
from data_fixtures import build_shapes

from vqa.config import TrainConfig
from vqa.data.dataset import ImageTextDataset
from vqa.data.formats import corpus_texts, load_split
from vqa.data.shapes_scene import relation_holds
from vqa.data.transforms import ImageTransform
from vqa.data.transpose import is_spatial, transpose_text
from vqa.errors import ConfigError
from vqa.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = build_shapes(tmp_path_factory.mktemp("shapes"), n_train=24, n_val=4, seed=3)
    train = load_split(root, "train")
    return root, train, Tokenizer.train(corpus_texts(train), vocab_size=300)


def test_known_phrases_swap_axes_and_anything_else_spatial_stops_it():
    q = "is the small red circle left of the blue object?"
    assert transpose_text(q, "question") == "is the small red circle above the blue object?"
    assert transpose_text("is the red object below the circle?", "question") == "is the red object right of the circle?"
    cap = "there are two objects: a yellow triangle at the bottom and a green triangle on the right"
    assert transpose_text(cap, "caption") == ("there are two objects: a yellow triangle on the right and a green "
                                              "triangle at the bottom")
    assert transpose_text("a red square to the right of a large purple square", "caption") == (
        "a red square below a large purple square")
    assert transpose_text("a red circle at the top right", "caption") == "a red circle at the bottom left"
    assert transpose_text("a red circle at the top left", "caption") == "a red circle at the top left"
    listing = "from top to bottom: a red circle and a blue square"  # the vertical order becomes the horizontal one
    assert transpose_text(listing, "caption") == "from left to right: a red circle and a blue square"
    assert transpose_text("how many red circles are there?", "question") == "how many red circles are there?"
    for text in ("what is on top of the table?", "the leftmost object", "the upper one", "a cat under a chair"):
        assert transpose_text(text, "question") is None and transpose_text(text, "caption") is None
    assert is_spatial("left") and not is_spatial("red") and not is_spatial("2")


def test_every_shapes_text_transposes_and_transposing_twice_gives_it_back(data):
    root, _, _ = data
    questions = json.loads((root / "v2_OpenEnded_mscoco_train_questions.json").read_text())["questions"]
    captions = json.loads((root / "captions_train.json").read_text())["annotations"]
    for kind, texts in (("question", [q["question"] for q in questions]), ("caption", [c["caption"] for c in captions])):
        changed = 0
        for text in texts:
            once = transpose_text(text, kind)
            assert once is not None, text
            assert transpose_text(once, kind) == text
            changed += once != text
        assert changed > 0, kind


def test_a_transposed_item_shows_the_transposed_scene_and_its_answers_stay_true(data):
    root, train, tok = data
    scenes = {s["file_name"]: s for s in json.loads((root / "shapes_train_scenes.json").read_text())["scenes"]}
    side = json.loads((root / "shapes_info.json").read_text())["size"]
    plain_t = ImageTransform(64, (0.5,) * 3, (0.5,) * 3, train=True, max_shift=0.0)  # no shift, no flip
    kw = dict(questions_per_image=6, captions_per_image=4, train=True, seed=0)
    never = ImageTextDataset(train, tok, plain_t, 48, **kw)
    always = ImageTextDataset(train, tok, plain_t, 48, transpose=1.0, **kw)
    checked = 0
    for i in range(len(always)):
        item, ref = always[i], never[i]
        assert all(r.get("transposed") for r in item["rows"]) and not any(r.get("transposed") for r in ref["rows"])
        assert torch.equal(item["image"], ref["image"].transpose(1, 2))
        scene = scenes[item["rows"][0]["meta"]["image"].split("/")[-1]]
        swapped = [dict(o, x=o["y"], y=o["x"]) for o in scene["objects"]]  # the scene as the picture now shows it
        for row in item["rows"]:
            text = tok.decode(row["input_ids"])
            m = re.match(r"is the (.+) (left of|right of|above|below) the (.+)\? (yes|no)$", text)
            if not m:
                continue
            a, b = (_find(m.group(k), swapped) for k in (1, 3))
            assert relation_holds(a, b, m.group(2), side) == (m.group(4) == "yes"), text
            checked += 1
    assert checked >= 10


def _find(phrase: str, objects: list[dict]) -> dict:
    words = phrase.split()
    hits = [o for o in objects if all(w in (o["size"], o["color"], o["shape"], "object") for w in words)]
    assert len(hits) == 1, phrase
    return hits[0]


def test_evaluation_never_transposes_and_the_chance_is_validated(data):
    _, train, tok = data
    t = ImageTransform(64, (0.5,) * 3, (0.5,) * 3, train=False)
    ds = ImageTextDataset(train, tok, t, 48, train=False, transpose=1.0)
    assert not any(r.get("transposed") for i in range(len(ds)) for r in ds[i]["rows"])
    half = ImageTextDataset(train, tok, ImageTransform(64, (0.5,) * 3, (0.5,) * 3, train=True), 48, transpose=0.5)
    share = sum(bool(half[i]["rows"][0].get("transposed")) for i in range(len(half))) / len(half)
    assert 0.2 < share < 0.8
    with pytest.raises(ConfigError, match="transpose must be a chance between 0 and 1"):
        TrainConfig(transpose=1.5)
