"""The Glyphs set: byte-identical for a seed, it loads like any VQA v2 + COCO folder, every answer is right
(recomputed from the scene file by a parser written apart from the generator), the captions name every glyph,
no picture is another set's, the glyph drawn is the character (matched against Pillow's own text mask among
all characters), every object box holds its glyph's ink, and no picture is ever mirrored (--hflip)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections import Counter

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from vqa.config import TrainConfig
from vqa.data.readers.formats import find_splits, load_split
from vqa.data.synthetic import generator
from vqa.data.synthetic.corpus import CORPUS_SET
from vqa.data.synthetic.generator import FAMILIES, mirror_safe
from vqa.data.synthetic.glyphs import GLYPHS_SET, build_split, generate_glyphs
from vqa.data.synthetic.glyphs_layout import CHARS, MIN_SIZE, K
from vqa.data.synthetic.glyphs_render import render
from vqa.data.synthetic.scenes import generate_scenes
from vqa.data.synthetic.shapes import generate_shapes
from vqa.data.transforms import mentions_left_right
from vqa.errors import ConfigError
from vqa.train.build import check_flips

SIDE = 64


def _build(path, seed=3):
    generate_glyphs(path, n_train=24, n_val=6, seed=seed, progress=False, workers=1)
    return path


@pytest.fixture(scope="module")
def glyphs(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("glyphs"))


def _load(d, name):
    return json.loads((d / name).read_text())


def _digests(folder) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_same_seed_same_bytes_other_seed_other_pictures(glyphs, tmp_path):
    assert _digests(_build(tmp_path / "again")) == _digests(glyphs)
    other = {h for f, h in _digests(_build(tmp_path / "other", seed=4)).items() if f.endswith(".png")}
    assert not other & {h for f, h in _digests(glyphs).items() if f.endswith(".png")}


@pytest.mark.parametrize("split,n", [("train", 24), ("val", 6)])
def test_loads_as_vqa_v2_and_coco(glyphs, split, n):
    assert find_splits(glyphs) == ["train", "val"]
    sd = load_split(glyphs, split)
    qs = _load(glyphs, f"v2_OpenEnded_mscoco_{split}_questions.json")["questions"]
    assert not sd.skipped and len(sd.images()) == n and len(sd.vqa) == len(qs) == 6 * n
    assert len(sd.captions) == 4 * n
    for path in sd.images():
        with Image.open(path) as img:
            assert img.mode == "RGB" and img.size == (SIDE, SIDE)
    types = {"attribute_color": "other", "attribute_shape": "other", "count": "number"}
    for a in _load(glyphs, f"v2_mscoco_{split}_annotations.json")["annotations"]:
        assert a["question_type"] in FAMILIES and a["answer_type"] == types.get(a["question_type"], "yes/no")
    assert _load(glyphs, f"captions_{split}.json")["info"]["description"] == "vqa built-in Glyphs set"


# ---- an independent checker: parse each question and recompute its answer from the scene objects ----

INK = r"(black|red|blue|green|purple|orange)"
SYMBOL = {"ampersand": "&", "question mark": "?", "hash": "#"}
KIND = {"letter": str.isalpha, "digit": str.isdigit, "symbol": lambda c: c in "&?#", "character": lambda c: True}
DESC = re.compile(rf"^(?:{INK} )?(?:(letter|digit) )?"
                  r"([A-Z0-9]|ampersand|question mark|hash|letter|digit|symbol|character)s?$")


def _match(desc: str, objs: list[dict]) -> list[dict]:
    m = DESC.match(desc)
    assert m, desc
    ink, said_kind, last = m[1], m[2], m[3]
    if last in KIND:
        return [o for o in objs if ink in (None, o["color"]) and KIND[last](o["char"])]
    char = SYMBOL.get(last, last)
    assert said_kind is None or KIND[said_kind](char), desc
    return [o for o in objs if ink in (None, o["color"]) and o["char"] == char]


def _one(desc: str, objs: list[dict]) -> dict:
    found = _match(desc, objs)
    assert len(found) == 1, f"'{desc}' does not pick out exactly one glyph"
    return found[0]


def _said(char: str) -> str:
    return {v: k for k, v in SYMBOL.items()}.get(char, char.lower())


SPATIAL = {"come before the (.+), reading left to right": ("x", -1),
           "come after the (.+), reading left to right": ("x", 1),
           "written above the (.+)": ("y", -1), "written below the (.+)": ("y", 1),
           "higher on the page than the (.+)": ("y", -1), "lower on the page than the (.+)": ("y", 1)}


def _answer(q: str, objs: list[dict]) -> tuple[str, str]:
    """(family, answer) of question q about these glyphs."""
    yn = lambda b: "yes" if b else "no"  # noqa: E731
    if m := re.fullmatch(r"what colour is the (.+)\?|which colour is the (.+)\?"
                         r"|the (.+) is written in which colour\?", q):
        desc = next(g for g in m.groups() if g)
        assert not re.search(INK, desc), q  # the answer is not in the question
        return "attribute_color", _one(desc, objs)["color"]
    if m := re.fullmatch(r"which (letter|digit|symbol) is in the picture\?"
                         r"|what is the only (letter|digit|symbol)\?", q):
        return "attribute_shape", _said(_one(m[1] or m[2], objs)["char"])
    if m := re.fullmatch(rf"which character is {INK}\?|what is written in {INK}\?", q):
        return "attribute_shape", _said(_one(f"{m[1] or m[2]} character", objs)["char"])
    if m := re.fullmatch(rf"which (letter|digit|symbol) is {INK}\?"
                         rf"|what (letter|digit|symbol) is written in {INK}\?", q):
        return "attribute_shape", _said(_one(f"{m[2] or m[4]} {m[1] or m[3]}", objs)["char"])
    if m := re.fullmatch(r"is there an? (.+)\?|does the picture show an? (.+)\?|can you find an? (.+)\?", q):
        return "existence", yn(_match(next(g for g in m.groups() if g), objs))
    if m := re.fullmatch(r"how many (.+) are there\?|how many (.+) can you count\?", q):
        return "count", str(len(_match(m[1] or m[2], objs)))
    for form, (axis, sign) in SPATIAL.items():
        m = re.fullmatch(rf"does the (.+) {form}\?|is the (.+) {form}\?", q)
        m2 = re.fullmatch(r"reading left to right, is the (.+) (before|after) the (.+)\?", q)
        if m or (m2 and axis == "x" and (m2[2] == "before") == (sign < 0)):
            a, b = (m[1] or m[3], m[2] or m[4]) if m else (m2[1], m2[3])
            d = sign * (_one(a, objs)[axis] - _one(b, objs)[axis])
            assert abs(d) >= 0.1 * SIDE, f"'{q}': centres too close to say"
            return "spatial", yn(d > 0)
    for form, test in ((r"are there more (.+) than (.+)\?", lambda x, y: x > y),
                       (r"are there fewer (.+) than (.+)\?", lambda x, y: x < y),
                       (r"are there as many (.+) as (.+)\?", lambda x, y: x == y)):
        if m := re.fullmatch(form, q):
            return "comparison", yn(test(len(_match(m[1], objs)), len(_match(m[2], objs))))
    raise AssertionError(f"unparsed question: {q}")


def test_every_answer_is_right():
    data = build_split("train", 150, SIDE, 7)
    objs = {s["image_id"]: s["objects"] for s in data["scenes"]}
    families = Counter()
    for q in data["questions"]:
        family, answer = _answer(q["question"], objs[q["image_id"]])
        assert (family, answer) == (q["family"], q["answer"]), q
        families[family] += 1
    assert set(families) == set(FAMILIES)


def test_the_scene_file_is_the_questions_source(glyphs):
    """Every answer of the written files is recomputed from the written scene file alone."""
    for split in ("train", "val"):
        objs = {s["image_id"]: s["objects"] for s in _load(glyphs, f"glyphs_{split}_scenes.json")["scenes"]}
        qs = _load(glyphs, f"v2_OpenEnded_mscoco_{split}_questions.json")["questions"]
        anns = {a["question_id"]: a for a in _load(glyphs, f"v2_mscoco_{split}_annotations.json")["annotations"]}
        for q in qs:
            a = anns[q["question_id"]]
            assert _answer(q["question"], objs[q["image_id"]]) == (a["question_type"], a["multiple_choice_answer"])


def test_captions_name_every_glyph(glyphs):
    scenes = {s["image_id"]: s for s in _load(glyphs, "glyphs_train_scenes.json")["scenes"]}
    caps = Counter()
    for c in _load(glyphs, "captions_train.json")["annotations"]:
        objs = sorted(scenes[c["image_id"]]["objects"], key=lambda o: o["x"])
        if c["caption"].startswith("reading left to right"):
            caps[c["image_id"]] += 1
            named = re.findall(rf"an? {INK} ([A-Z0-9]|ampersand|question mark|hash)\b", c["caption"])
            assert named == [(o["color"], {v: k for k, v in SYMBOL.items()}.get(o["char"], o["char"])) for o in objs], c
    assert caps == dict.fromkeys(scenes, 1)


def test_answers_are_balanced_so_the_question_alone_says_little():
    spec = dataclasses.replace(GLYPHS_SET, object_box=None)  # the boxes play no part here
    train = generator.build_split(spec, "train", 1000, SIDE, 0)["questions"]
    p = generator.prior_baselines(train, generator.build_split(spec, "val", 250, SIDE, 0)["questions"])
    for fam in ("existence", "spatial", "comparison"):
        assert p[fam]["prior_accuracy"] < 0.62, (fam, p[fam])
    assert p["attribute_color"]["prior_accuracy"] < 0.3 and p["attribute_shape"]["prior_accuracy"] < 0.15
    assert p["count"]["prior_accuracy"] < 0.36
    assert {q["answer"] for q in train if q["family"] == "count"} == {str(k) for k in range(5)}


def test_no_picture_is_a_shapes_scenes_or_corpus_picture(glyphs, tmp_path):
    generate_shapes(tmp_path / "shapes", 24, 6, seed=3, progress=False, workers=1)
    generate_scenes(tmp_path / "scenes", 24, 6, seed=3, progress=False, workers=1)
    generator.generate(CORPUS_SET, tmp_path / "corpus", 24, 6, size=SIDE, seed=3, progress=False, workers=1)
    ours = {h for f, h in _digests(glyphs).items() if f.endswith(".png")}
    theirs = {h for d in ("shapes", "scenes", "corpus") for f, h in _digests(tmp_path / d).items()
              if f.endswith(".png")}
    assert len(ours) == 30 and len(theirs) == 90 and not ours & theirs


def _ink(scene: dict) -> np.ndarray:
    """[S, S] how far each pixel of the scene is from its bare page."""
    drawn = np.asarray(render(scene, SIDE), np.float32)
    page = np.asarray(render({**scene, "objects": []}, SIDE), np.float32)
    return np.abs(drawn - page).sum(-1)


def _pillow_mask(char: str, size: int, left: float, top: float) -> np.ndarray:
    """[S, S] Pillow's own mask of `char`, its ink's corner at (left, top) pixels, drawn at 4x and reduced."""
    k = 4
    alone = Image.new("L", (2 * size, 2 * size), 0)
    ImageDraw.Draw(alone).text((size // 2, size // 2), char, font=ImageFont.load_default(size=size), fill=255)
    img = Image.new("L", (SIDE * k, SIDE * k), 0)
    img.paste(alone.crop(alone.getbbox()), (round(left * k), round(top * k)))
    return np.asarray(img.reduce(k), np.float32)


def test_the_glyph_drawn_is_the_character():
    """An upright glyph drawn alone matches Pillow's own mask of its character better than any other's."""
    for char in CHARS:
        o = dict(char=char, kind="x", color="black", style="solid", size=100, angle=0.0, x=32.0, y=32.0)
        scene = dict(objects=[o], page="paper", line=False, texture_seed=1)
        ink = _ink(scene).ravel()
        box = GLYPHS_SET.object_box(o)
        score = {c: np.corrcoef(ink, _pillow_mask(c, 100, box[0], box[1]).ravel())[0, 1] for c in CHARS}
        assert max(score, key=score.get) == char and score[char] > 0.99, (
            char, sorted(score.items(), key=lambda kv: -kv[1])[:3])


def test_object_boxes_hold_the_glyph_ink(glyphs):
    scenes = _load(glyphs, "glyphs_train_scenes.json")["scenes"]
    assert {o["style"] for s in scenes for o in s["objects"]} == {"solid", "bold", "outlined"}
    assert any(abs(o["angle"]) > 10 for s in scenes for o in s["objects"])
    for s in scenes:
        for o in s["objects"]:
            ys, xs = np.nonzero(_ink({**s, "objects": [o]}) > 3)
            left, top, right, bottom = o["box"]
            assert len(xs) and xs.min() >= np.floor(left) and xs.max() < np.ceil(right), (o, xs.min(), xs.max())
            assert ys.min() >= np.floor(top) and ys.max() < np.ceil(bottom), (o, ys.min(), ys.max())
            assert xs.min() <= left + 1.5 and ys.min() <= top + 1.5
            assert xs.max() >= right - 2.5 and ys.max() >= bottom - 2.5


def test_glyph_pictures_are_never_mirrored(glyphs, tmp_path):
    """Every picture has a caption that says left or right (the per-image flip guard), and the folder itself is
    marked mirror-unsafe: `vqa train --hflip` refuses it, even with captions off."""
    caps = _load(glyphs, "captions_train.json")["annotations"]
    sided = {c["image_id"] for c in caps if mentions_left_right([c["caption"]])}
    assert sided == {c["image_id"] for c in caps}
    assert _load(glyphs, "glyphs_info.json")["mirror_safe"] is False and not mirror_safe(glyphs)
    with pytest.raises(ConfigError, match="--hflip: .* must never be mirrored"):
        check_flips(TrainConfig(data=str(glyphs), out=str(tmp_path / "run"), hflip=True, tasks=("vqa",)))
    check_flips(TrainConfig(data=str(glyphs), out=str(tmp_path / "run"), hflip=False))
    shapes = tmp_path / "shapes"
    generate_shapes(shapes, 4, 0, seed=0, progress=False, workers=1)
    assert "mirror_safe" not in _load(shapes, "shapes_info.json") and mirror_safe(shapes)
    check_flips(TrainConfig(data=str(shapes), out=str(tmp_path / "run"), hflip=True))


def test_a_smaller_build_is_the_first_pictures_of_a_larger_one(glyphs, tmp_path):
    """--train 500 / 2,000 / all: the small-data curve trains on prefixes of one set and scores on one val."""
    small = tmp_path / "small"
    generate_glyphs(small, n_train=8, n_val=6, seed=3, progress=False, workers=1)
    big, few = _digests(glyphs), _digests(small)
    assert {f: h for f, h in few.items() if f.endswith(".png")} == {f: big[f] for f in few if f.endswith(".png")}
    assert few["v2_mscoco_val_annotations.json"] == big["v2_mscoco_val_annotations.json"]
    qs = _load(small, "v2_OpenEnded_mscoco_train_questions.json")["questions"]
    assert qs == _load(glyphs, "v2_OpenEnded_mscoco_train_questions.json")["questions"][: len(qs)] and len(qs) == 48


def test_ink_boxes_never_touch_stay_clear_of_the_border_and_fonts_stay_above_a_fifth_of_the_side():
    """docs/glyphs.md's layout rules: boxes apart, 5% of the side clear of the border, a glyph shrunk to fit
    stops once it reaches 24% of the side, so none is under 0.85 x 24% (the last 15% step)."""
    scenes = build_split("train", 300, SIDE, 7)["scenes"]
    sizes = [o["size"] / (SIDE * K) for s in scenes for o in s["objects"]]
    assert min(sizes) >= 0.85 * MIN_SIZE - 1 / (SIDE * K) and min(sizes) < MIN_SIZE  # the shrinking is reached
    for s in scenes:
        boxes = [o["box"] for o in s["objects"]]
        for left, top, right, bottom in boxes:
            assert min(left, top, SIDE - right, SIDE - bottom) >= 0.05 * SIDE, (s["image_id"], boxes)
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                assert max(b[0] - a[2], a[0] - b[2], b[1] - a[3], a[1] - b[3]) > 0, (s["image_id"], a, b)
