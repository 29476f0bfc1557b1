"""The words of the pretraining corpus: dense captions, relation statements and questions about a scene.

Captions (four per image): every object left to right with its size, colour, fill, kind and place ("left to
right: large red striped star top left, small blue ring centre"); a tally with the background;
and two relation statements that hold in the picture ("the red star is left of the blue ring", "... is bigger
than ..."), an object named by the fewest words that pick it out alone. Questions: the six families of
`generator` from two templates each, so that the decoder also learns the answer format.
"""

from __future__ import annotations

from collections import Counter
from itertools import product

import numpy as np

from .corpus_layout import COLOURS, FILLS, KINDS, RELATIONS, relation_holds, size_word
from .generator import FAMILIES, NUMBERS, article, by_count

N_ANSWERS = {"attribute_color": len(COLOURS), "attribute_shape": len(KINDS), "count": 6}  # others: yes/no
PLURAL = {k: "crosses" if k == "cross" else f"{k}s" for k in KINDS}
FILL_WORD = {"solid": "", "hollow": "hollow", "striped": "striped", "dotted": "dotted", "checked": "checked"}

COLOUR_Q = ("what color is the {}?", "which colour does the {} have?")
KIND_Q = ("what shape is the {}?", "which kind of object is the {}?")
EXIST_Q = ("is there {}?", "can you see {}?")
COUNT_Q = ("how many {} are there?", "count the {}.")
SPATIAL_Q = ("is the {a} {rel} the {b}?", "true or false: the {a} is {rel} the {b}?")
COMPARE_Q = ("are there more {} than {}?", "are there fewer {} than {}?")
# every wording per family (spatial: one per form and relation asked), as `templates` matches a question back to it
TEMPLATES = {"attribute_color": COLOUR_Q, "attribute_shape": KIND_Q, "existence": EXIST_Q, "count": COUNT_Q,
             "spatial": tuple(t.replace("{rel}", rel) for t in SPATIAL_Q for rel in RELATIONS[:4]),
             "comparison": COMPARE_Q}
# the words a slot holds: an object's name, with its article
SLOT_WORDS = (*COLOURS, *KINDS, *PLURAL.values(), *FILLS, "object", "objects", "a", "an")


def place(o: dict, side: int) -> str:
    """'top left', 'top', 'centre'... (the picture as a 3 x 3 grid): short, so that a listing of five
    objects fits the tiny decoder's 48 tokens."""
    col, row = min(2, int(3 * o["x"] / side)), min(2, int(3 * o["y"] / side))
    return " ".join(w for w in (("top", "", "bottom")[row], ("left", "", "right")[col]) if w) or "centre"


def full_name(o: dict, side: int) -> str:
    """'large red striped star': every attribute of the object."""
    return " ".join(w for w in (size_word(o, side), o["color"], FILL_WORD[o["fill"]], o["kind"]) if w)


def short_name(objs: list[dict], o: dict) -> str | None:
    """The fewest words that name o and no other object: its kind, its colour and kind, or with its fill."""
    for keys in (("kind",), ("color", "kind"), ("color", "fill", "kind")):
        if sum(all(p[k] == o[k] for k in keys) for p in objs) == 1:
            return " ".join(o[k] for k in keys)  # a solid one is a "red solid star" here: unambiguous
    return None


def _desc(colour: str | None, kind: str | None, plural: bool = False) -> str:
    noun = (PLURAL[kind] if plural else kind) if kind else ("objects" if plural else "object")
    return " ".join(w for w in (colour, noun) if w)


DESCS = [(c, k) for c in (None, *COLOURS) for k in (None, *KINDS) if c or k]


def true_relations(objs: list[dict], side: int) -> list[tuple[str, str, str]]:
    """(name a, relation, name b) for every clearly true relation between two objects that have names."""
    names = [short_name(objs, o) for o in objs]
    return [(names[i], rel, names[j]) for i, j in product(range(len(objs)), repeat=2) for rel in RELATIONS
            if i != j and names[i] and names[j] and relation_holds(objs[i], objs[j], rel, side)]


def make_captions(scene: dict, side: int, rng: np.random.Generator) -> list[str]:
    """Four captions: the listing, the tally, two relation statements (or where the only object is)."""
    objs = sorted(scene["objects"], key=lambda o: (o["x"], o["y"]))
    n = len(objs)
    listing = ", ".join(f"{full_name(o, side)} {place(o, side)}" for o in objs)
    tally = ", ".join(article(k) if c == 1 else f"{NUMBERS[c]} {PLURAL[k]}"
                      for k, c in by_count(o["kind"] for o in objs))
    caps = [f"left to right: {listing}",
            f"{NUMBERS[n]} object{'s' if n > 1 else ''} on a {scene['background']} {scene['pattern']} background: "
            f"{tally}"]
    rels = true_relations(objs, side)
    picks = rng.permutation(len(rels))[:2].tolist() if rels else []
    caps += [f"the {a} is {rel} the {b}" for a, rel, b in (rels[k] for k in picks)]
    while len(caps) < 4:
        o = objs[len(caps) % n]
        caps.append(f"{article(full_name(o, side))} at the {place(o, side)}, drawn {scene['style']}")
    return caps


def candidates(scene: dict, side: int, rng: np.random.Generator) -> dict[str, list[tuple[str, str]]]:
    """Every valid (question, answer) per family for a scene (one random template each)."""
    objs = scene["objects"]
    cands: dict[str, list[tuple[str, str]]] = {f: [] for f in FAMILIES}
    count = Counter(d for o in objs for d in ((o["color"], None), (None, o["kind"]), (o["color"], o["kind"])))
    for o in objs:
        if count[None, o["kind"]] == 1:
            cands["attribute_color"].append((COLOUR_Q[rng.integers(2)].format(o["kind"]), o["color"]))
        if count[o["color"], None] == 1:
            cands["attribute_shape"].append((KIND_Q[rng.integers(2)].format(_desc(o["color"], None)), o["kind"]))
    for d in DESCS:
        cands["existence"].append((EXIST_Q[rng.integers(2)].format(article(_desc(*d))), "yes" if count[d] else "no"))
        if count[d] or rng.random() < 0.1:  # a few zeros: most descriptions are absent from any one scene
            cands["count"].append((COUNT_Q[rng.integers(2)].format(_desc(*d, plural=True)), str(count[d])))
    cands["count"].append((COUNT_Q[0].format("objects"), str(len(objs))))
    names = [short_name(objs, o) for o in objs]
    for i, j in product(range(len(objs)), repeat=2):
        if i != j and names[i] and names[j]:
            for rel in RELATIONS[:4]:
                holds = relation_holds(objs[i], objs[j], rel, side)
                if holds is not None:
                    q = SPATIAL_Q[rng.integers(2)].format(a=names[i], b=names[j], rel=rel)
                    cands["spatial"].append((q, "yes" if holds else "no"))
    present = sorted({(None, o["kind"]) for o in objs} | {(o["color"], None) for o in objs}, key=str)
    for x, y in product(present, repeat=2):
        if x != y and (x[0] is None) == (y[0] is None):
            k = int(rng.integers(2))
            more = count[x] > count[y] if k == 0 else count[x] < count[y]
            q = COMPARE_Q[k].format(_desc(*x, plural=True), _desc(*y, plural=True))
            cands["comparison"].append((q, "yes" if more else "no"))
    return cands


__all__ = ["N_ANSWERS", "candidates", "make_captions", "full_name", "short_name", "place", "true_relations"]
