"""The Scenes set: it loads like any VQA v2 + COCO folder, every answer is right (recomputed from the scene
metadata by a parser written apart from the generator), answers are balanced per question string, builds are
deterministic (serial = parallel), its wordings share no template with Shapes'. `vqa data scenes`:
test_data_shapes.py's CLI test, which runs for both sets."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict

import numpy as np
import pytest
from PIL import Image

from vqa.data.readers.formats import find_splits, load_split
from vqa.data.synthetic.generator import FAMILIES, PARALLEL_FROM
from vqa.data.synthetic.scenes import build_split, generate_scenes
from vqa.data.synthetic.scenes_layout import COLOURS
from vqa.data.transforms import mentions_left_right

SIDE = 64


def _build(path, **kw):
    generate_scenes(path, **{"n_train": 24, "n_val": 8, "seed": 3, "progress": False, "workers": 1, **kw})
    return path


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("scenes"))


def _load(d, name):
    return json.loads((d / name).read_text())


@pytest.mark.parametrize("split,n", [("train", 24), ("val", 8)])
def test_loads_as_vqa_v2_and_coco(scenes, split, n):
    assert find_splits(scenes) == ["train", "val"]
    sd = load_split(scenes, split)
    qs = _load(scenes, f"v2_OpenEnded_mscoco_{split}_questions.json")["questions"]
    caps = _load(scenes, f"captions_{split}.json")["annotations"]
    assert not sd.skipped and len(sd.vqa) == len(qs) and len(sd.captions) == len(caps) == 4 * n
    assert 5 * n <= len(qs) <= 6 * n and len({q["question_id"] for q in qs}) == len(qs)
    images = sd.images()
    assert len(images) == n
    for path in images:
        with Image.open(path) as img:
            assert img.mode == "RGB" and img.size == (SIDE, SIDE)
    anns = _load(scenes, f"v2_mscoco_{split}_annotations.json")["annotations"]
    types = {"attribute_color": "other", "attribute_shape": "other", "count": "number"}
    for a in anns:
        assert a["question_type"] in FAMILIES and a["answer_type"] == types.get(a["question_type"], "yes/no")
        assert len(a["answers"]) == 10
    assert _load(scenes, f"captions_{split}.json")["info"]["description"] == "vqa built-in Scenes set"


# ---- an independent checker: parse each question and recompute its answer from the scene objects ----

KINDS = {"star": "stars", "heart": "hearts", "cross": "crosses", "ring": "rings", "hexagon": "hexagons",
         "arrow": "arrows", "thing": "things"}
NOUN = {**{k: k for k in KINDS}, **{p: k for k, p in KINDS.items()}}
DESC = re.compile(r"^(?:(biggest|smallest) )?(?:(pink|brown|cyan|white|black|lime) )?(\w+)$")


def _match(desc: str, objs: list[dict]) -> list[dict]:
    m = DESC.match(desc)
    assert m and m[3] in NOUN, desc
    most, colour, kind = m[1], m[2], NOUN[m[3]]
    found = [o for o in objs if colour in (None, o["color"]) and kind in ("thing", o["kind"])]
    if most:
        ds = sorted((o["d"] for o in found), reverse=most == "biggest")
        assert len(ds) >= 2, f"'{desc}': a superlative of fewer than two"
        assert max(ds[0], ds[1]) >= 1.25 * min(ds[0], ds[1]), f"'{desc}': not clearly the {most}"
        found = [o for o in found if o["d"] == ds[0]]
    return found


def _one(desc: str, objs: list[dict]) -> dict:
    found = _match(desc, objs)
    assert len(found) == 1, f"'{desc}' does not pick out exactly one object"
    return found[0]


FORMS = [
    ("attribute_color", r"which colour is the (.+)\?|what colour does the (.+) have\?|the (.+) is which colour\?"),
    ("attribute_shape", r"which kind of shape is the (.+)\?|what is the (.+)\?|the (.+) has which shape\?"),
    ("existence", r"can you see an? (.+)\?|does the picture contain an? (.+)\?|is any (.+) visible\?"),
    ("count", r"how many (.+) are in the picture\?|what number of (.+) can you see\?"
              r"|how many (.+) does the picture show\?"),
]
REL = r"(further left|further right|higher up|lower down)"


def _answer(q: str, objs: list[dict]) -> tuple[str, str]:
    """(family, answer) of question q about these objects."""
    yn = lambda b: "yes" if b else "no"  # noqa: E731
    for family, form in FORMS:
        if m := re.fullmatch(form, q):
            desc = next(g for g in m.groups() if g)
            if family == "attribute_color":
                assert not re.search(r"pink|brown|cyan|white|black|lime", desc), q  # the answer is not in the question
                return family, _one(desc, objs)["color"]
            if family == "attribute_shape":
                assert desc.split()[-1] == "thing", q
                return family, _one(desc, objs)["kind"]
            found = _match(desc, objs)
            return family, (yn(found) if family == "existence" else str(len(found)))
    m = re.fullmatch(rf"is the (.+) {REL} than the (.+)\?", q)
    a, rel, b = (m[1], m[2], m[3]) if m else (None, None, None)
    if m := re.fullmatch(rf"compared with the (.+), is the (.+) {REL}\?", q):
        a, rel, b = m[2], m[3], m[1]
    if a:
        oa, ob = _one(a, objs), _one(b, objs)
        d = {"further left": ob["x"] - oa["x"], "further right": oa["x"] - ob["x"],
             "higher up": ob["y"] - oa["y"], "lower down": oa["y"] - ob["y"]}[rel]
        assert abs(d) >= 0.1 * SIDE, f"'{q}': centres too close to say"
        return "spatial", yn(d > 0)
    for form, test in ((r"is the number of (.+) greater than the number of (.+)\?", lambda x, y: x > y),
                       (r"are the (.+) outnumbered by the (.+)\?", lambda x, y: x < y),
                       (r"are there as many (.+) as (.+)\?", lambda x, y: x == y)):
        if m := re.fullmatch(form, q):
            return "comparison", yn(test(len(_match(m[1], objs)), len(_match(m[2], objs))))
    raise AssertionError(f"unknown question form: {q}")


@pytest.mark.parametrize("split", ["train", "val"])
def test_every_answer_is_right(scenes, split):
    objs = {s["image_id"]: s["objects"] for s in _load(scenes, f"scenes_{split}_scenes.json")["scenes"]}
    qs = {q["question_id"]: q for q in _load(scenes, f"v2_OpenEnded_mscoco_{split}_questions.json")["questions"]}
    for a in _load(scenes, f"v2_mscoco_{split}_annotations.json")["annotations"]:
        q = qs[a["question_id"]]
        assert q["image_id"] == a["image_id"]
        family, expected = _answer(q["question"], objs[a["image_id"]])
        assert (a["question_type"], a["multiple_choice_answer"]) == (family, expected), q["question"]
        assert {x["answer"] for x in a["answers"]} == {expected}


def test_many_answers_are_right_and_every_template_is_used():
    """The checker over 300 scenes' worth of questions (no images needed), and every wording shows up."""
    data = build_split("train", 300, SIDE, 4)
    objs = {s["image_id"]: s["objects"] for s in data["scenes"]}
    used = Counter()
    for q in data["questions"]:
        assert _answer(q["question"], objs[q["image_id"]]) == (q["family"], q["answer"]), q["question"]
        used[_skeleton(q["question"])] += 1
    assert len(used) >= 3 * 4 + 2 + 3, sorted(used)  # 3 templates x 4 families, 2 spatial, 3 comparison


def test_more_questions_per_family_are_right_and_distinct():
    data = build_split("val", 40, SIDE, 5, per_family=3)
    objs = {s["image_id"]: s["objects"] for s in data["scenes"]}
    per_image = defaultdict(list)
    for q in data["questions"]:
        assert _answer(q["question"], objs[q["image_id"]]) == (q["family"], q["answer"]), q["question"]
        per_image[q["image_id"]].append(q["question"])
    assert all(len(qs) == len(set(qs)) <= 18 for qs in per_image.values())
    assert sum(map(len, per_image.values())) > 14 * 40


def test_scenes_are_valid_and_pictures_match(scenes):
    for s in _load(scenes, "scenes_train_scenes.json")["scenes"]:
        objs = s["objects"]
        assert 1 <= len(objs) <= 6
        img = np.asarray(Image.open(scenes / "train" / s["file_name"])).astype(int)
        for i, o in enumerate(objs):
            r = o["d"] / 2
            assert min(o["x"], o["y"], SIDE - o["x"], SIDE - o["y"]) - r >= 3  # clear of the border
            assert all(np.hypot(o["x"] - p["x"], o["y"] - p["y"]) - r - p["d"] / 2 >= 2 for p in objs[i + 1:])
            x = o["x"] + (0.75 * r if o["kind"] == "ring" else 0)  # a ring's middle is background
            px = img[int(o["y"]), int(x)]
            assert np.abs(px - np.array(COLOURS[o["color"]])).max() < 60, (s["file_name"], o, px)


def _collapse(seq: list) -> list:
    return [x for i, x in enumerate(seq) if i == 0 or x != seq[i - 1]]


def test_captions_list_the_objects_along_each_axis(scenes):
    """Caption 0 names every object left to right, caption 1 top to bottom (neighbours alike merged)."""
    caps = defaultdict(list)
    for c in _load(scenes, "captions_train.json")["annotations"]:
        caps[c["image_id"]].append(c["caption"])
    checked = 0
    for s in _load(scenes, "scenes_train_scenes.json")["scenes"]:
        if len(s["objects"]) < 2:
            continue
        for caption, axis, head in ((caps[s["image_id"]][0], "x", "going left to right: "),
                                    (caps[s["image_id"]][1], "y", "top to bottom: ")):
            assert caption.startswith(head), caption
            named = re.findall(r"(pink|brown|cyan|white|black|lime) (star|heart|cross|ring|hexagon|arrow)", caption)
            along = [(o["color"], o["kind"]) for o in sorted(s["objects"], key=lambda o: o[axis])]
            assert _collapse(named) == _collapse(along), (caption, along)
        checked += 1
    assert checked >= 10


def test_answers_are_balanced_per_question():
    """A blind model that answers each question string with its most common train answer scores near chance."""
    train, val = build_split("train", 1000, SIDE, 0)["questions"], build_split("val", 300, SIDE, 0)["questions"]
    counts = Counter(q["family"] for q in train)
    assert set(counts) == set(FAMILIES) and max(counts.values()) < 1.6 * min(counts.values())
    per_q, per_f = defaultdict(Counter), defaultdict(Counter)
    for q in train:
        per_q[q["question"]][q["answer"]] += 1
        per_f[q["family"]][q["answer"]] += 1
    hits, total = Counter(), Counter()
    for q in val:
        guess = (per_q[q["question"]] or per_f[q["family"]]).most_common(1)[0][0]
        hits[q["family"]] += guess == q["answer"]
        total[q["family"]] += 1
    acc = {f: hits[f] / total[f] for f in FAMILIES}
    chance = {"attribute_color": 1 / 6, "attribute_shape": 1 / 6, "count": 1 / 7}
    for f in FAMILIES:
        assert acc[f] < chance.get(f, 0.5) + 0.12, (f, acc)
    assert {q["answer"] for q in train if q["family"] == "count"} == {str(k) for k in range(7)}


def test_deterministic_for_a_seed(tmp_path):
    a, b = _build(tmp_path / "a", n_train=6, n_val=3), _build(tmp_path / "b", n_train=6, n_val=3)
    c = _build(tmp_path / "c", n_train=6, n_val=3, seed=4)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert len(files) == 6 + 3 + 9
    assert all((a / f).read_bytes() == (b / f).read_bytes() for f in files)
    assert sum((a / f).read_bytes() != (c / f).read_bytes() for f in files) >= 6 + 3 + 6


def test_parallel_rendering_gives_the_same_files(tmp_path):
    n = PARALLEL_FROM
    _build(tmp_path / "p", n_train=n, n_val=0, size=32, workers=2)
    _build(tmp_path / "s", n_train=n, n_val=0, size=32, workers=1)
    files = sorted(p.relative_to(tmp_path / "p") for p in (tmp_path / "p").rglob("*") if p.is_file())
    assert len(files) == n + 5
    assert all((tmp_path / "p" / f).read_bytes() == (tmp_path / "s" / f).read_bytes() for f in files)
    with Image.open(tmp_path / "p" / "train" / "COCO_train_000001000001.png") as img:
        assert img.mode == "RGB" and img.size == (32, 32)


VOCAB = re.compile(r"\b(pink|brown|cyan|white|black|lime|red|orange|yellow|green|blue|purple|gray|grey|light|dark|"
                   r"sand|slate|sage|mauve|stars?|hearts?|cross(es)?|rings?|hexagons?|arrows?|things?|circles?|squares?|"
                   r"triangles?|diamonds?|objects?|small|large|big|little|biggest|smallest|an?|zero|one|two|three|four|"
                   r"five|six|\d+)\b")


def _skeleton(text: str) -> str:
    """The template of a text: its words about this scene replaced by ~, runs of them (and lists) collapsed."""
    s = VOCAB.sub("~", text)
    s = re.sub(r"~( ~)*", "~", s)
    return re.sub(r"~(, ~| and ~)+", "~", s)


def test_wordings_share_no_template_with_shapes(scenes, tmp_path):
    from vqa.data.synthetic.shapes import build_split as shapes_split

    shapes = shapes_split("train", 200, SIDE, 0)
    ours = build_split("train", 200, SIDE, 0)
    for key, field in (("questions", "question"), ("captions", "caption")):
        theirs = {_skeleton(x[field]) for x in shapes[key]}
        mine = {_skeleton(x[field]) for x in ours[key]}
        assert len(mine) >= 8 and not theirs & mine, (key, sorted(theirs & mine))


def test_every_left_right_text_stops_a_horizontal_flip():
    """A horizontal flip (--hflip) would make a left / right text wrong: every such Scenes text is seen."""
    data = build_split("train", 100, SIDE, 1)
    texts = [q["question"] for q in data["questions"]] + [c["caption"] for c in data["captions"]]
    sided = [t for t in texts if re.search(r"\b(left|right)\b", t)]
    assert sided and all(mentions_left_right([t]) for t in sided)
