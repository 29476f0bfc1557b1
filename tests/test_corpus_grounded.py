"""The corpus's words of place, read independently of the generator: every relation statement in either order
holds, every spatial question in every wording (subject first, reference first) has the right answer, "which
is further left, the A or the B?" and "what is left of the B?" name the right object, and "where is the X?"
answers the centre's cell and the diameter on a 16 x 16 grid, or "nowhere" for what the picture lacks."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from vqa.data.synthetic import generator
from vqa.data.synthetic.corpus import CORPUS_SET
from vqa.data.synthetic.corpus_layout import COLOURS, KINDS
from vqa.data.synthetic.locations import parse_location

SIDE = 64
MARGIN = 0.1 * SIDE
AXIS = {"left": ("x", -1), "right": ("x", 1), "higher": ("y", -1), "lower": ("y", 1), "above": ("y", -1),
        "below": ("y", 1)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("grounded")
    generator.generate(CORPUS_SET, path, 120, 0, size=SIDE, seed=3, progress=False, workers=1)
    scenes = {s["image_id"]: s["objects"] for s in
              json.loads((path / "corpus_train_scenes.json").read_text())["scenes"]}
    qs = json.loads((path / "v2_OpenEnded_mscoco_train_questions.json").read_text())["questions"]
    anns = {a["question_id"]: a for a in json.loads((path / "v2_mscoco_train_annotations.json").read_text())["annotations"]}
    caps = json.loads((path / "captions_train.json").read_text())["annotations"]
    return scenes, [(q["question"], anns[q["question_id"]], scenes[q["image_id"]]) for q in qs], caps


def fits(objs, name):
    """The objects a name ('red striped star', 'ring', 'green heart') fits."""
    *adjs, kind = name.split()
    return [o for o in objs if o["kind"] == kind and all(a in (o["color"], o["fill"]) for a in adjs)]


def one(objs, name):
    found = fits(objs, name)
    assert len(found) == 1, f"'{name}' names {len(found)} objects"
    return found[0]


def clearly(a, b, word) -> bool | None:
    """a is `word` (left, right, higher, lower, above, below) of b by the margin; None when too close."""
    key, sign = AXIS[word]
    d = sign * (a[key] - b[key])
    return True if d >= MARGIN else False if d <= -MARGIN else None


def direction(rel: str) -> str:
    return rel.replace(" of", "").replace("further ", "").replace("to the ", "").replace(" up", "").replace(" down", "")


def test_the_corpus_asks_where_and_relations_in_every_order(corpus):
    _, rows, _ = corpus
    fams = Counter(a["question_type"] for _, a, _ in rows)
    assert fams["location"] > 0.09 * len(rows) and fams["relation"] > 0.05 * len(rows)
    assert fams["count"] >= 0.2 * len(rows)  # counting is asked twice a picture: it keeps its share
    starts = Counter(q.split(" the ")[0] for q, a, _ in rows if a["question_type"] == "spatial")
    assert {"is", "true or false:", "compared with", "relative to"} <= set(starts)
    nowhere = sum(a["multiple_choice_answer"] == "nowhere" for _, a, _ in rows if a["question_type"] == "location")
    assert 0 < nowhere < fams["location"] / 2


def test_every_spatial_answer_in_every_wording(corpus):
    _, rows, _ = corpus
    checked = 0
    for q, a, objs in rows:
        if a["question_type"] != "spatial":
            continue
        m = (re.match(r"^(?:true or false: )?(?:is )?the (.+?) (?:is )?(left of|right of|above|below) the (.+)\?$", q)
             or re.match(r"^(?:compared with|relative to) the (?P<b>.+), is the (?P<a>.+) "
                         r"(?P<rel>further left|further right|higher up|lower down|to the left|to the right|higher|lower)\?$", q))
        assert m, q
        subj, rel, ref = (m["a"], m["rel"], m["b"]) if m.groupdict() else (m[1], m[2], m[3])
        holds = clearly(one(objs, subj), one(objs, ref), direction(rel))
        assert holds is not None and ("yes" if holds else "no") == a["multiple_choice_answer"], q
        checked += 1
    assert checked >= 50


def test_which_and_what_name_the_right_object(corpus):
    _, rows, _ = corpus
    seen = Counter()
    for q, a, objs in rows:
        if a["question_type"] != "relation":
            continue
        ans = one(objs, a["multiple_choice_answer"])
        if m := re.match(r"^which is (further left|further right|higher up|lower down), the (.+) or the (.+)\?$", q):
            x, y = one(objs, m[2]), one(objs, m[3])
            other = y if ans is x else x
            assert ans in (x, y) and clearly(ans, other, direction(m[1])), q
            seen["which"] += 1
        else:
            m = re.match(r"^what is (left of|right of|above|below) the (.+)\?$", q)
            assert m, q
            ref = one(objs, m[2])
            says = [clearly(o, ref, direction(m[1])) for o in objs if o is not ref]
            assert clearly(ans, ref, direction(m[1])) and says.count(True) == 1 and None not in says, q
            seen["what"] += 1
    assert seen["which"] >= 20 and seen["what"] >= 3


def test_where_answers_the_cell_and_diameter_or_nowhere(corpus):
    _, rows, _ = corpus
    n = 0
    for q, a, objs in rows:
        if a["question_type"] != "location":
            continue
        name = re.match(r"^(?:where is the (.+)\?|point at the (.+)\.)$", q)
        name = name[1] or name[2]
        found, ans = fits(objs, name), a["multiple_choice_answer"]
        assert all(w in COLOURS or w in KINDS or w in ("hollow", "striped", "dotted", "checked", "solid")
                   for w in name.split()), q
        if not found:
            assert ans == "nowhere", q
            continue
        (o,) = found
        assert ans == f"{int(o['x'] * 16 // SIDE)} {int(o['y'] * 16 // SIDE)} {max(1, round(o['d'] * 16 / SIDE))}", q
        (x, y), (x0, y0, x1, y1) = parse_location(ans, SIDE, SIDE)
        assert abs(x - o["x"]) <= 2 and abs(y - o["y"]) <= 2  # the cell's centre: within half a 4-pixel cell
        assert x0 <= o["x"] <= x1 and y0 <= o["y"] <= y1
        n += 1
    assert n >= 60


def test_relation_statements_hold_in_either_order(corpus):
    scenes, _, caps = corpus
    forms = Counter()
    for c in caps:
        text, objs = c["caption"], scenes[c["image_id"]]
        if m := re.match(r"^the (.+) is (left of|right of|above|below) the (.+)$", text):
            a, rel, b = one(objs, m[1]), m[2], one(objs, m[3])
            forms["subject first"] += 1
        elif m := re.match(r"^(left of|right of|above|below) the (.+) is the (.+)$", text):
            a, rel, b = one(objs, m[3]), m[1], one(objs, m[2])
            forms["place first"] += 1
        else:
            continue
        assert clearly(a, b, direction(rel)), text
    assert forms["subject first"] >= 10 and forms["place first"] >= 10


def test_parse_location_reads_only_locations():
    assert parse_location("0 15 2", 64, 64) == ((2.0, 62.0), (0.0, 58.0, 6.0, 64.0))
    for text in ("nowhere", "5 11", "5 11 4 2", "16 3 2", "a b c", "5 11 0", ""):
        assert parse_location(text, 64, 64) is None, text
