"""The Shapes set: official layout, determinism, every answer right (recomputed from the scene metadata with
an independent parser), pictures that match the metadata, low question-only priors, and `vqa data`."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from data_fixtures import build_shapes
from PIL import Image

from vqa.cli import main
from vqa.data.readers.formats import find_splits, load_split
from vqa.data.synthetic.shapes import build_split, prior_baselines
from vqa.data.synthetic.shapes_layout import COLORS
from vqa.data.synthetic.shapes_text import FAMILIES

SIDE = 64


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    return build_shapes(tmp_path_factory.mktemp("shapes"), n_train=24, n_val=8, seed=3)


def _load(d, name):
    return json.loads((d / name).read_text())


def test_layout_follows_vqa_v2_and_coco(shapes):
    assert find_splits(shapes) == ["train", "val"]
    q = _load(shapes, "v2_OpenEnded_mscoco_train_questions.json")
    a = _load(shapes, "v2_mscoco_train_annotations.json")
    c = _load(shapes, "captions_train.json")
    assert set(q) == {"info", "task_type", "data_type", "license", "data_subtype", "questions"}
    assert set(q["questions"][0]) == {"image_id", "question", "question_id"}
    assert set(a) == {"info", "license", "data_subtype", "annotations"}
    ann = a["annotations"][0]
    assert set(ann) == {"question_type", "multiple_choice_answer", "answers", "image_id", "answer_type", "question_id"}
    assert len(ann["answers"]) == 10 and set(ann["answers"][0]) == {"answer", "answer_confidence", "answer_id"}
    assert {x["answer_type"] for x in a["annotations"]} <= {"yes/no", "number", "other"}
    assert {x["question_type"] for x in a["annotations"]} <= set(FAMILIES)
    assert set(c) >= {"info", "images", "licenses", "annotations"}
    assert set(c["images"][0]) >= {"id", "file_name", "height", "width"}
    ids = [x["question_id"] for x in q["questions"]]
    assert len(ids) == len(set(ids)) and 5 * 24 <= len(ids) <= 8 * 24
    im = c["images"][0]
    assert im["file_name"] == f"COCO_train_{im['id']:012d}.png"
    img = Image.open(shapes / "train" / im["file_name"])
    assert img.size == (SIDE, SIDE) and img.mode == "RGB"
    sd = load_split(shapes, "train")
    assert not sd.skipped and len(sd.vqa) == len(ids) and len({r.image for r in sd.vqa}) == 24
    assert all(len(ids) >= 3 for ids in _by_image(c["annotations"]).values())


def _by_image(anns):
    out = {}
    for a in anns:
        out.setdefault(a["image_id"], []).append(a["caption"])
    return out


def test_deterministic_for_a_seed(tmp_path):
    a = build_shapes(tmp_path / "a", n_train=6, n_val=3, seed=11)
    b = build_shapes(tmp_path / "b", n_train=6, n_val=3, seed=11)
    c = build_shapes(tmp_path / "c", n_train=6, n_val=3, seed=12)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert len(files) > 9
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    annotations = "v2_mscoco_train_annotations.json"
    assert (a / annotations).read_bytes() != (c / annotations).read_bytes()


def test_parallel_rendering_gives_the_same_images(tmp_path, monkeypatch):
    import multiprocessing

    import vqa.data.synthetic.generator as generator
    import vqa.data.synthetic.shapes as shapes

    pools = []  # the worker count of each process pool generate_shapes starts

    class Recording:
        def get_context(self, method=None):
            ctx = multiprocessing.get_context(method)

            class Ctx:
                def Pool(self, n):  # noqa: N802 (multiprocessing's name)
                    pools.append(n)
                    return ctx.Pool(n)
            return Ctx()

    monkeypatch.setattr(generator, "mp", Recording())  # the shared parallel build
    shapes.generate_shapes(tmp_path / "p", n_train=200, n_val=0, size=32, seed=2, progress=False, workers=2)
    # the parallel run really rendered in 2 processes: were the set too small for a pool (a raised
    # threshold), this test would compare serial with serial
    assert pools == [2]
    shapes.generate_shapes(tmp_path / "s", n_train=200, n_val=0, size=32, seed=2, progress=False, workers=1)
    assert pools == [2]  # the serial run started none
    files = sorted(p.relative_to(tmp_path / "p") for p in (tmp_path / "p").rglob("*") if p.is_file())
    assert len(files) == 200 + 5
    assert all((tmp_path / "p" / f).read_bytes() == (tmp_path / "s" / f).read_bytes() for f in files)


# ---- an independent checker: parse each question and recompute its answer from the scene objects ----

DESC = re.compile(r"^(?:(small|large) )?(?:(red|orange|yellow|green|blue|purple) )?"
                  r"(circle|square|triangle|diamond|object)s?$")


def _match(desc: str, objs: list[dict]) -> list[dict]:
    m = DESC.match(desc)
    assert m, desc
    size, color, shape = m.groups()
    return [o for o in objs if (not size or o["size"] == size) and (not color or o["color"] == color)
            and (shape == "object" or o["shape"] == shape)]


def _one(desc, objs):
    found = _match(desc, objs)
    assert len(found) == 1, f"'{desc}' does not pick out exactly one object"
    return found[0]


def _answer(q: str, objs: list[dict]) -> str:
    yn = lambda b: "yes" if b else "no"  # noqa: E731
    if m := re.fullmatch(r"what color is the (.+)\?", q):
        return _one(m[1], objs)["color"]
    if m := re.fullmatch(r"what shape is the (.+)\?", q):
        return _one(m[1], objs)["shape"]
    if m := re.fullmatch(r"is there an? (.+)\?", q):
        return yn(_match(m[1], objs))
    if m := re.fullmatch(r"how many (.+) are there\?", q):
        return str(len(_match(m[1], objs)))
    if m := re.fullmatch(r"is the (.+) (left of|right of|above|below) the (.+)\?", q):
        a, b = _one(m[1], objs), _one(m[3], objs)
        d = {"left of": b["x"] - a["x"], "right of": a["x"] - b["x"],
             "above": b["y"] - a["y"], "below": a["y"] - b["y"]}[m[2]]
        assert abs(d) >= 0.1 * SIDE, f"'{q}': centres too close to say"
        return yn(d > 0)
    if m := re.fullmatch(r"are there (more|fewer) (.+) than (.+)\?", q):
        nx, ny = len(_match(m[2], objs)), len(_match(m[3], objs))
        return yn(nx > ny if m[1] == "more" else nx < ny)
    raise AssertionError(f"unknown question form: {q}")


@pytest.mark.parametrize("split", ["train", "val"])
def test_every_answer_is_right(shapes, split):
    scenes = {s["image_id"]: s for s in _load(shapes, f"shapes_{split}_scenes.json")["scenes"]}
    qs = {q["question_id"]: q for q in _load(shapes, f"v2_OpenEnded_mscoco_{split}_questions.json")["questions"]}
    anns = _load(shapes, f"v2_mscoco_{split}_annotations.json")["annotations"]
    assert len(anns) == len(qs)
    for a in anns:
        q = qs[a["question_id"]]
        assert q["image_id"] == a["image_id"]
        expected = _answer(q["question"], scenes[a["image_id"]]["objects"])
        assert a["multiple_choice_answer"] == expected, q["question"]
        assert {x["answer"] for x in a["answers"]} == {expected}


def test_scenes_are_valid_and_pictures_match(shapes):
    scenes = _load(shapes, "shapes_train_scenes.json")["scenes"]
    assert {len(s["objects"]) for s in scenes} <= set(range(1, 7))
    for s in scenes:
        objs = s["objects"]
        for i, o in enumerate(objs):
            h = o["d"] / 2
            assert min(o["x"] - h, o["y"] - h, SIDE - o["x"] - h, SIDE - o["y"] - h) >= 3  # 3 px clear of the border
            for p in objs[i + 1:]:
                gap = max(abs(o["x"] - p["x"]), abs(o["y"] - p["y"])) - (o["d"] + p["d"]) / 2
                assert gap >= 2, "objects overlap"
        img = np.asarray(Image.open(shapes / "train" / s["file_name"])).astype(int)
        for o in objs:
            px = img[int(round(o["y"])), int(round(o["x"]))]
            assert np.abs(px - np.array(COLORS[o["color"]])).max() < 40, (s["file_name"], o)
    caps = _by_image(_load(shapes, "captions_train.json")["annotations"])
    for s in scenes:
        first = caps[s["image_id"]][0]
        for o in s["objects"]:
            assert f"{o['color']} {o['shape']}" in first, first


def test_two_captions_list_the_objects_along_each_axis(shapes):
    """Caption 0 lists the objects left to right, caption 1 top to bottom: the two orders that teach the
    spatial relations."""
    scenes = _load(shapes, "shapes_train_scenes.json")["scenes"]
    caps = _by_image(_load(shapes, "captions_train.json")["annotations"])
    checked = 0
    for s in scenes:
        if len(s["objects"]) < 2:
            continue
        for caption, axis in ((caps[s["image_id"]][0], "x"), (caps[s["image_id"]][1], "y")):
            names = list(dict.fromkeys(f"{o['size']} {o['color']} {o['shape']}"
                                       for o in sorted(s["objects"], key=lambda o: o[axis])))
            where = [caption.find(n) for n in names]
            assert -1 not in where and where == sorted(where), (axis, caption, names)
        assert caps[s["image_id"]][1].startswith("from top to bottom: ")
        checked += 1
    assert checked >= 10


def test_question_only_priors_are_low():
    train = build_split("train", 1200, SIDE, 0)["questions"]
    val = build_split("val", 400, SIDE, 0)["questions"]
    fams = {q["family"] for q in train}
    assert fams == set(FAMILIES)
    counts = {f: sum(q["family"] == f for q in train) for f in FAMILIES}
    assert max(counts.values()) < 1.6 * min(counts.values())  # families roughly balanced
    p = prior_baselines(train, val)
    for fam in ("existence", "spatial", "comparison"):
        assert p[fam]["prior_accuracy"] < 0.62, (fam, p[fam])
    assert p["attribute_color"]["prior_accuracy"] < 0.3
    assert p["attribute_shape"]["prior_accuracy"] < 0.38
    assert p["count"]["prior_accuracy"] < 0.4
    count_answers = {q["answer"] for q in train if q["family"] == "count"}
    assert count_answers == {str(k) for k in range(7)}


# the other built-in sets (test_data_scenes.py, test_data_glyphs.py, test_data_corpus.py)
@pytest.mark.parametrize("name", ["shapes", "scenes", "glyphs", "corpus"])
def test_cli_shapes_and_info(tmp_path, capsys, name):
    out = tmp_path / "s"
    assert main(["data", name, "--out", str(out), "--train", "10", "--val", "5", "--seed", "1", "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "train: 10 images, 60 questions, 40 captions" in text
    assert "question-only prior" in text and all(f in text for f in FAMILIES)
    assert [p.name for p in out.glob("*_info.json")] == [f"{name}_info.json"]
    assert main(["data", "info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "splits train, val" in text and "60 questions on 10 images" in text
    bad = out / "val" / "COCO_val_000002000001.png"
    bad.write_bytes(bad.read_bytes()[:60])
    assert main(["data", "info", str(out), "--split", "val", "--check-images"]) == 1
    assert "COCO_val_000002000001.png: truncated" in capsys.readouterr().out
    assert main(["data", name, "--out", str(out), "--size", "16"]) == 2
    assert f"too small for {name.title()}" in capsys.readouterr().err


def test_more_questions_per_family(tmp_path):
    from collections import Counter

    from vqa.data.synthetic.shapes import generate_shapes

    generate_shapes(tmp_path, n_train=30, n_val=0, seed=3, progress=False, workers=1, questions_per_family=2)
    scenes = {s["image_id"]: s for s in _load(tmp_path, "shapes_train_scenes.json")["scenes"]}
    qs = _load(tmp_path, "v2_OpenEnded_mscoco_train_questions.json")["questions"]
    anns = {a["question_id"]: a for a in _load(tmp_path, "v2_mscoco_train_annotations.json")["annotations"]}
    per_image = Counter(q["image_id"] for q in qs)
    assert sum(per_image.values()) / len(per_image) > 8  # up to 12 per image, fewer for sparse scenes
    assert max(per_image.values()) <= 12
    for img in per_image:  # no question twice about one image
        texts = [q["question"] for q in qs if q["image_id"] == img]
        assert len(texts) == len(set(texts))
    for q in qs:
        expected = _answer(q["question"], scenes[q["image_id"]]["objects"])
        assert anns[q["question_id"]]["multiple_choice_answer"] == expected
