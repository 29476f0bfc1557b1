"""The pretraining corpus: byte-identical for a seed, none of its scenes a Shapes or Scenes one, the listing
caption names every object with its attributes and place, every relation statement holds in the drawn
objects, and every question's answer is right (recomputed here from the scene)."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter

import numpy as np
import pytest

from vqa.data.readers.formats import find_splits, load_split
from vqa.data.synthetic import generator
from vqa.data.synthetic.corpus import CORPUS_SET
from vqa.data.synthetic.corpus_layout import BACKGROUNDS, COLOURS, KINDS
from vqa.data.synthetic.corpus_render import K, object_mask
from vqa.data.synthetic.scenes import generate_scenes
from vqa.data.synthetic.scenes_layout import PALETTES
from vqa.data.synthetic.shapes import generate_shapes
from vqa.data.synthetic.shapes_layout import BACKGROUNDS as GREYS

SIDE = 64


def _build(path, seed=5):
    generator.generate(CORPUS_SET, path, 30, 6, size=SIDE, seed=seed, progress=False, workers=1)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return _build(tmp_path_factory.mktemp("corpus"))


def _digests(folder) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _scenes(d, split="train"):
    return json.loads((d / f"corpus_{split}_scenes.json").read_text())["scenes"]


def test_same_seed_same_bytes_other_seed_other_pictures(corpus, tmp_path):
    again = _build(tmp_path / "again")
    assert _digests(again) == _digests(corpus)
    other = _build(tmp_path / "other", seed=6)
    assert _digests(other) != _digests(corpus)


def test_loads_as_vqa_v2_and_coco(corpus):
    assert find_splits(corpus) == ["train", "val"]
    sd = load_split(corpus, "train")
    assert not sd.skipped and len(sd.images()) == 30 and len(sd.captions) == 4 * 30 and len(sd.vqa) >= 5 * 30


def test_shares_no_scene_with_shapes_or_scenes(corpus, tmp_path):
    """Its backgrounds are neither Shapes' greys nor Scenes' palette (by name and by colour), and no picture
    of the three sets built with one seed is another's."""
    for name, rgb in BACKGROUNDS.items():
        assert name not in GREYS and name not in PALETTES
        assert max(rgb) - min(rgb) >= 40, f"{name} is near grey"
        assert all(np.abs(np.subtract(rgb, p)).sum() >= 60 for p in PALETTES.values()), name
    assert {s["background"] for s in _scenes(corpus)} <= set(BACKGROUNDS)
    shapes = _digests(generate_shapes(tmp_path / "shapes", 30, 6, seed=5, progress=False, workers=1)
                      and tmp_path / "shapes")
    scenes = _digests(generate_scenes(tmp_path / "scenes", 30, 6, seed=5, progress=False, workers=1)
                      and tmp_path / "scenes")
    pictures = [{h for f, h in d.items() if f.endswith(".png")} for d in (_digests(corpus), shapes, scenes)]
    assert pictures[0] and not pictures[0] & (pictures[1] | pictures[2])


def test_corpus_is_broad():
    scenes = generator.make_scenes(CORPUS_SET, "train", 400, SIDE, 0)
    objs = [o for s in scenes for o in s["objects"]]
    assert {o["kind"] for o in objs} == set(KINDS) and {o["color"] for o in objs} == set(COLOURS)
    assert len({o["fill"] for o in objs}) == 5 and len({s["style"] for s in scenes}) == 4
    assert len({s["pattern"] for s in scenes}) == 6 and len({s["background"] for s in scenes}) == len(BACKGROUNDS)
    assert Counter(len(s["objects"]) for s in scenes).keys() == {1, 2, 3, 4, 5}
    close = [(a, b) for s in scenes for i, a in enumerate(s["objects"]) for b in s["objects"][i + 1:]
             if np.hypot(a["x"] - b["x"], a["y"] - b["y"]) < (a["d"] + b["d"]) / 2]
    assert close, "no two objects ever overlap"


# ---- an independent reading of the captions ----

ITEM = re.compile(r"^(small|medium|large) (\w+) (?:(hollow|striped|dotted|checked) )?(\w+) "
                  r"(top left|top right|bottom left|bottom right|top|bottom|left|right|centre)$")


def _where(o):
    col, row = min(2, int(3 * o["x"] / SIDE)), min(2, int(3 * o["y"] / SIDE))
    return " ".join(w for w in (("top", "", "bottom")[row], ("left", "", "right")[col]) if w) or "centre"


def _size(o):
    return "small" if o["d"] < 0.19 * SIDE else "medium" if o["d"] < 0.27 * SIDE else "large"


def _captions(d, split="train"):
    caps = json.loads((d / f"captions_{split}.json").read_text())["annotations"]
    out: dict[int, list[str]] = {}
    for c in sorted(caps, key=lambda c: c["id"]):
        out.setdefault(c["image_id"], []).append(c["caption"])
    return out


def test_listing_names_every_object_with_size_colour_fill_and_place(corpus):
    caps = _captions(corpus)
    for s in _scenes(corpus):
        listing = caps[s["image_id"]][0]
        assert listing.startswith("left to right: ")
        items = [ITEM.match(x) for x in listing.removeprefix("left to right: ").split(", ")]
        assert all(items), listing
        said = Counter((m[1], m[2], m[3] or "solid", m[4], m[5]) for m in items)
        truth = Counter((_size(o), o["color"], o["fill"], o["kind"], _where(o)) for o in s["objects"])
        assert said == truth, listing


def _named(objs, name):
    words = name.split()
    found = [o for o in objs if o["kind"] == words[-1] and all(w in (o["color"], o["fill"]) for w in words[:-1])]
    assert len(found) == 1, f"'{name}' names {len(found)} objects"
    return found[0]


def test_relation_statements_hold_in_the_drawn_objects(corpus):
    """Each 'the A is REL the B' read against the masks the renderer draws: their centroids (left / right /
    above / below by more than a few pixels) and areas (bigger / smaller)."""
    caps, checked = _captions(corpus), 0
    for s in _scenes(corpus):
        for cap in caps[s["image_id"]][2:]:
            m = re.match(r"^the (.+) is (left of|right of|above|below|bigger than|smaller than) the (.+)$", cap)
            if not m:
                continue
            a, b = (_named(s["objects"], n) for n in (m[1], m[3]))
            ma, mb = (object_mask(o, SIDE * K, K) for o in (a, b))
            (ya, xa), (yb, xb) = (np.argwhere(mask).mean(0) / K for mask in (ma, mb))
            holds = {"left of": xa < xb - 3, "right of": xa > xb + 3, "above": ya < yb - 3, "below": ya > yb + 3,
                     "bigger than": ma.sum() > 1.3 * mb.sum(), "smaller than": mb.sum() > 1.3 * ma.sum()}[m[2]]
            assert holds, cap
            checked += 1
    assert checked >= 20


def test_answers_follow_from_the_scene(corpus):
    qs = json.loads((corpus / "v2_OpenEnded_mscoco_train_questions.json").read_text())["questions"]
    anns = {a["question_id"]: a
            for a in json.loads((corpus / "v2_mscoco_train_annotations.json").read_text())["annotations"]}
    scenes = {s["image_id"]: s["objects"] for s in _scenes(corpus)}
    plural = {("crosses" if k == "cross" else k + "s"): k for k in KINDS}

    def matching(objs, phrase):
        words = phrase.split()
        kind = plural.get(words[-1], words[-1] if words[-1] in KINDS else None)
        colour = words[0] if words[0] in COLOURS else None
        return [o for o in objs if kind in (None, o["kind"]) and colour in (None, o["color"])]

    for q in qs:
        objs, a, text = scenes[q["image_id"]], anns[q["question_id"]], q["question"]
        fam, ans = a["question_type"], a["multiple_choice_answer"]
        if fam == "count":
            phrase = re.match(r"^(?:how many (.+) are there\?|count the (.+)\.)$", text)
            assert str(len(matching(objs, phrase[1] or phrase[2]))) == ans, text
        elif fam == "existence":
            phrase = re.match(r"^(?:is there|can you see) an? (.+)\?$", text)[1]
            assert ("yes" if matching(objs, phrase) else "no") == ans, text
        elif fam == "attribute_color":
            kind = re.match(r"^(?:what color is the (\w+)\?|which colour does the (\w+) have\?)$", text)
            (o,) = [o for o in objs if o["kind"] == (kind[1] or kind[2])]
            assert o["color"] == ans, text
        elif fam == "comparison":
            m = re.match(r"^are there (more|fewer) (.+) than (.+)\?$", text)
            x, y = len(matching(objs, m[2])), len(matching(objs, m[3]))
            assert ("yes" if (x > y if m[1] == "more" else x < y) else "no") == ans, text


def test_every_objects_box_bounds_what_is_drawn(corpus):
    """The scenes file's box (pretraining's grounding targets) is the drawn object's extent: the supersampled
    mask reaches each edge of the box to within a pixel and never leaves it."""
    n = SIDE * K
    for s in _scenes(corpus):
        for o in s["objects"]:
            ys, xs = np.nonzero(object_mask(o, n, K))
            got = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]) / K
            assert np.abs(got - np.array(o["box"])).max() <= 1.0, (o, got)


def test_pretraining_grounds_the_corpus_words_on_their_objects(corpus):
    """`vqa.data.regions` reads the corpus like Shapes and Scenes: a listing caption's last token of each
    object it names alone is grounded on that object's box."""
    from vqa.data.dataset import ImageTextDataset
    from vqa.data.regions import Regions
    from vqa.data.sources import open_split
    from vqa.data.transforms import build_transform
    from vqa.weights import shipped

    model, tok, _ = shipped.load("tiny")
    cfg = model.cfg
    ds = ImageTextDataset(open_split(corpus, "train"), tok, build_transform(cfg, train=False), cfg.dec_max_len,
                          questions_per_image=6, captions_per_image=4, train=True)
    ds.maker.regions = Regions.of(corpus, "train", tok, cfg.vit_image_size, cfg.grid)
    mentions = 0
    for i in range(len(ds)):
        for row in ds[i]["rows"]:
            answers = range(row["prompt_len"] - 1, len(row["input_ids"])) if row["task"] == "vqa" else ()
            for at, target in zip(*row.get("regions", ([], [])), strict=True):
                assert target.sum() == pytest.approx(1, abs=1e-5)
                if at not in answers:  # a phrase's last token: the end of a kind's name
                    piece = tok.decode([row["input_ids"][at]]).strip()
                    assert any(k.endswith(piece) or f"{k}s".endswith(piece) for k in KINDS), piece
                    mentions += 1
    assert mentions > 50
