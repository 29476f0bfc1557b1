"""`vqa eval --grounding`: the box scores computed by hand, the object a word names, and the command's files."""

import json
import re

import numpy as np
import pytest
from conftest import tiny_set_flags
from helpers import tiny_model
from PIL import Image

from vqa.cli import main
from vqa.data.synthetic.scene_objects import SETS, SceneFile, caption_mentions, load_scenes, referent
from vqa.data.synthetic.scenes_layout import COLOURS as SCENES_COLOURS
from vqa.data.synthetic.shapes_layout import COLORS as SHAPES_COLORS
from vqa.errors import ConfigError, DataError
from vqa.evaluation.grounding import (
    Grounding,
    Tally,
    box_on_grid,
    chance,
    mass_in_box,
    pointing_hits,
    words_of,
)

SHAPES, SCENES, _CORPUS = SETS


def _map(**weights) -> np.ndarray:
    """A 4 x 4 map with the given weights at "r<row>c<col>"."""
    m = np.zeros((4, 4))
    for at, w in weights.items():
        m[int(at[1]), int(at[3])] = w
    return m


def test_mass_in_the_box_by_hand():
    m = _map(r1c1=0.5, r1c2=0.3, r3c0=0.2)
    # the box covers patch (1, 1) whole and the left half of patch (1, 2): 0.5 + 0.3 / 2
    assert mass_in_box(m, (1, 1, 2.5, 2)) == pytest.approx(0.65)
    assert mass_in_box(m, (2, 1, 3.5, 2)) == pytest.approx(0.3)  # one patch to the right: (1, 2) whole
    assert mass_in_box(m, (1, 1, 2, 2.5)) == pytest.approx(0.5)  # rows and columns swapped: (1, 1) and half of (2, 1)
    assert mass_in_box(2 * m, (1, 1, 2.5, 2)) == pytest.approx(0.65)  # a share of the patches' mass, not the mass
    assert mass_in_box(np.zeros((4, 4)), (0, 0, 4, 4)) == 0
    per_head = mass_in_box(np.stack([m, _map(r0c0=1.0)]), (0, 0, 1, 1))  # [2, 4, 4] -> [2]
    assert per_head.tolist() == pytest.approx([0.0, 1.0])


def test_pointing_game_by_hand():
    m = _map(r3c0=0.9, r0c3=0.1)  # the most-attended patch: row 3, column 0, centre (x, y) = (0.5, 3.5)
    assert pointing_hits(m, (0, 3, 1, 4))
    assert not pointing_hits(m, (3, 0, 4, 1))  # rows and columns swapped
    assert not pointing_hits(m, (1, 3, 2, 4))  # one patch to the right
    assert pointing_hits(m, (0.5, 3.5, 0.6, 3.6))  # no tolerance, edges included
    assert not pointing_hits(m, (0.51, 3, 2, 4))
    assert pointing_hits(np.zeros((4, 4)), (0, 0, 1, 1))  # a tie: the first patch in reading order


def test_chance_and_the_picture_to_grid_scale():
    assert box_on_grid([8, 16, 24, 40], side=64, grid=8) == (1, 2, 3, 5)
    mass, point = chance((1, 1, 2.5, 2), 4)
    assert mass == pytest.approx(1.5 / 16)  # a uniform map: the box's area over the grid's
    assert point == pytest.approx(2 / 16)  # the centres x = 1.5, 2.5 at y = 1.5


def test_words_join_pieces_and_keep_their_tokens():
    assert words_of([" a", " sm", "all", " red", " circle", ","]) == [
        ("a", [0]), ("small", [1, 2]), ("red", [3]),
        ("circle,", [4, 5])]  # punctuation stays: caption_mentions strips it


def _scene(*objs) -> dict:
    return dict(image_id=1, file_name="x.png", background="gray", style="plain", texture_seed=1, objects=list(objs))


def _obj(shape, color, size, x, y):
    d = 16 if size == "large" else 9
    return dict(shape=shape, color=color, size=size, x=x, y=y, d=d, box=[x - d / 2, y - d / 2, x + d / 2, y + d / 2])


def test_the_object_a_question_names():
    scene = _scene(_obj("square", "red", "large", 40, 40), _obj("circle", "red", "small", 12, 12),
                   _obj("circle", "blue", "large", 20, 50))
    # two red objects: the question names the small circle, the second red one
    assert referent(SHAPES, scene, 64, "attribute_color", "what color is the small circle?", "red") == 1
    assert referent(SHAPES, scene, 64, "attribute_color", "what color is the square?", "red") == 0
    assert referent(SHAPES, scene, 64, "attribute_shape", "what shape is the blue object?", "circle") == 2
    assert referent(SHAPES, scene, 64, "attribute_color", "what color is the small circle?", "green") is None


def test_the_objects_a_caption_names():
    scene = _scene(_obj("circle", "red", "small", 12, 12), _obj("circle", "red", "large", 40, 40),
                   _obj("square", "blue", "small", 20, 50))
    words = "a small red circle, a red circle and two blue squares next to a blue square".split()
    # "red circle" fits two objects and "squares" is plural: only two phrases name one object
    assert caption_mentions(SHAPES, scene, words) == [([1, 2, 3], 0), ([14, 15], 2)]
    assert caption_mentions(SHAPES, scene, "a large red circle".split()) == [([1, 2, 3], 1)]
    assert caption_mentions(SHAPES, scene, "a blue red circle".split()) == []
    star = dict(kind="star", color="pink", x=20, y=20, d=12, angle=0)
    assert caption_mentions(SCENES, _scene(star), "just one big pink star, in the middle".split()) == [([2, 3, 4], 0)]


def _vqa(path):
    return json.loads(path.read_text())


def test_every_colour_and_shape_question_names_the_object_a_parser_finds(shapes_dir):
    """`referent` (the generator asked again) against a reading of the question written apart from it."""
    sf = load_scenes(shapes_dir, "val", "--grounding")
    qs = {q["question_id"]: q for q in _vqa(shapes_dir / "v2_OpenEnded_mscoco_val_questions.json")["questions"]}
    checked = 0
    for a in _vqa(shapes_dir / "v2_mscoco_val_annotations.json")["annotations"]:
        if a["question_type"] not in ("attribute_color", "attribute_shape"):
            continue
        q = qs[a["question_id"]]["question"]
        words = re.fullmatch(r"what (?:color|shape) is the (.+)\?", q)[1].split()
        objs = sf.scenes[a["image_id"]]["objects"]
        fits = [i for i, o in enumerate(objs) if all(w in (o["size"], o["color"], o["shape"], "object") for w in words)]
        assert len(fits) == 1, q
        assert referent(SHAPES, sf.scenes[a["image_id"]], sf.side, a["question_type"], q,
                        a["multiple_choice_answer"]) == fits[0]
        checked += 1
    assert checked >= 8


SCENES_REF = re.compile(r"(?:which colour is the|what colour does the|the|which kind of shape is the|what is the) "
                        r"(.+?)(?: have| is which colour| has which shape)?\?")


def test_every_scenes_colour_and_shape_question_names_the_object_a_parser_finds(scenes_dir):
    """Scenes names an object by colour and / or kind, or as the biggest / smallest of such things."""
    sf = load_scenes(scenes_dir, "val", "--grounding")
    qs = {q["question_id"]: q for q in _vqa(scenes_dir / "v2_OpenEnded_mscoco_val_questions.json")["questions"]}
    checked = 0
    for a in _vqa(scenes_dir / "v2_mscoco_val_annotations.json")["annotations"]:
        if a["question_type"] not in ("attribute_color", "attribute_shape"):
            continue
        q = qs[a["question_id"]]["question"]
        words = SCENES_REF.fullmatch(q)[1].split()
        objs = sf.scenes[a["image_id"]]["objects"]
        most = words.pop(0) if words[0] in ("biggest", "smallest") else None
        group = [i for i, o in enumerate(objs) if all(w in (o["color"], o["kind"], "thing") for w in words)]
        if most:
            group = [max(group, key=lambda i: objs[i]["d"] * (1 if most == "biggest" else -1))]
        assert len(group) == 1, q
        assert sf.referent(a["image_id"], a["question_type"], q, a["multiple_choice_answer"]) == group[0], q
        checked += 1
    assert checked >= 8


@pytest.mark.parametrize("which", ["shapes", "scenes"])
def test_boxes_hold_their_objects(which, shapes_dir, scenes_dir):
    """Every pixel of an object's fill colour near it lies in its box, and they reach close to each of its
    edges."""
    root = shapes_dir if which == "shapes" else scenes_dir
    sf = load_scenes(root, "val", "--grounding")
    palette = dict(SHAPES_COLORS if which == "shapes" else SCENES_COLOURS)
    for scene in sf.scenes.values():
        img = np.asarray(Image.open(root / "val" / scene["file_name"])).astype(int)
        ys, xs = np.mgrid[0 : sf.side, 0 : sf.side] + 0.5  # pixel centres
        for o in scene["objects"]:
            near = np.hypot(xs - o["x"], ys - o["y"]) <= o["d"] / 2 + 1
            own = near & (np.abs(img - np.array(palette[o["color"]])).max(-1) < 30)
            x0, y0, x1, y1 = o["box"]
            px, py = xs[own], ys[own]
            assert px.size and px.min() >= x0 - 0.5 and px.max() <= x1 + 0.5, (scene["file_name"], o)
            assert py.min() >= y0 - 0.5 and py.max() <= y1 + 0.5, (scene["file_name"], o)
            slack = 5 if o.get("kind") in ("star", "heart", "arrow") else 3.5  # thin tips: outline, no fill
            assert max(px.min() - x0, x1 - px.max(), py.min() - y0, y1 - py.max()) < slack, (scene["file_name"], o)


def test_attention_on_the_named_object_scores_every_hit(shapes_dir):
    """Head 0 looks at the patch under each object's centre, head 1 two patches to its right: head 0 hits
    every time, head 1 never (at most 16 px wide, no box reaches 12 px past its centre)."""
    sf = load_scenes(shapes_dir, "val", "--grounding")
    g = Grounding(tiny_model(vit_image_size=64, vit_patch_size=8), None, sf)  # an 8 x 8 grid of 8 px patches
    words = 0
    for image_id, scene in sf.scenes.items():
        for i, o in enumerate(scene["objects"]):
            maps = np.zeros((1, 2, 2, 8, 8))  # [G, L, H, grid, grid]
            row, col = int(o["y"] // 8), int(o["x"] // 8)
            maps[0, :, 0, row, col] = 1
            maps[0, :, 1, row, (col + 2) % 8] = 1
            g.score("captions", maps, image_id, [([0], i)])
            words += 1
    s = g.summary()
    assert s["captions"]["words"] == s["all"]["words"] == words and s["answers"] == {"words": 0}
    assert s["all"]["pointing"] == [[100.0, 0.0], [100.0, 0.0]]
    assert s["all"]["best_head"]["head"] == 0 and s["all"]["mass"][0][1] == 0.0
    assert 0 < s["all"]["chance"]["pointing"] < 10


def test_merged_tallies_add_up():
    a, b = Tally(), Tally()
    a.add(_map(r0c0=1.0)[None, None], (0, 0, 1, 1), 4)  # a hit, all its mass in the box
    b.add(_map(r3c3=1.0)[None, None], (0, 0, 1, 1), 4)  # a miss
    s = a.merged(b).summary()
    assert (s["words"], s["mass"], s["pointing"]) == (2, [[50.0]], [[50.0]])
    assert s["chance"] == {"mass": 6.25, "pointing": 6.25}  # a box of 1 patch of 16
    assert s["mean_map"] == {"mass": 50.0, "pointing": 50.0}


def test_vqa_eval_grounding_writes_its_scores(shapes_dir, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--data", str(shapes_dir), "--out", str(run), "--batch-size", "4", "--eval-images", "0",
                 "--max-steps", "1", *tiny_set_flags()]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run), "--data", str(shapes_dir), "--grounding", "--batch-size", "3"]) == 0
    printed = capsys.readouterr().out
    g = json.loads((run / "best-eval-val" / "grounding.json").read_text())
    anns = _vqa(shapes_dir / "v2_mscoco_val_annotations.json")["annotations"]
    attribute = sum(a["question_type"] in ("attribute_color", "attribute_shape") for a in anns)
    assert 0 < g["answers"]["words"] <= attribute  # every colour or shape answer the model gave words to
    assert np.asarray(g["all"]["mass"]).shape == (1, 2)  # the tiny flags' 1 layer x 2 heads
    assert "pointing-game hits" in printed and "best head: layer" in printed


def test_grounding_needs_boxes_and_a_synthetic_folder(shapes_dir, tmp_path):
    with pytest.raises(ConfigError, match="needs a Shapes or Scenes folder"):  # a usage error
        load_scenes(tmp_path, "val", "--grounding")
    doc = json.loads((shapes_dir / "shapes_val_scenes.json").read_text())
    for s in doc["scenes"]:
        for o in s["objects"]:
            del o["box"]
    (tmp_path / "shapes_val_scenes.json").write_text(json.dumps(doc))
    with pytest.raises(DataError, match="no 'box', which --grounding needs; build the set again"):
        Grounding(None, None, load_scenes(tmp_path, "val", "--grounding"))
    assert isinstance(load_scenes(shapes_dir, "val", "--grounding"), SceneFile)
