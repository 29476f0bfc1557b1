"""The words of the pretraining corpus: dense captions, relation statements and questions about a scene.

Captions (four per image): every object left to right with its size, colour, fill, kind and place ("left to
right: large red striped star top left, small blue ring centre"); a tally with the background;
and two relation statements that hold in the picture ("the red star is further left than the blue ring", "...
is bigger than ..."). An object is named by any words that pick it out alone: its kind, its colour ("the pink
thing"), colour and kind, colour, fill and kind, or as the clearly biggest / smallest of such things; each
relation is worded several ways ("left of", "to the left of", "further left than"; "compared with the B, is the
A further left?"), so that what pretraining teaches about position is tied to the relation, not to one
wording. Questions: the six families of `generator` from two to four templates each.
"""

from __future__ import annotations

from collections import Counter
from itertools import product

import numpy as np

from .corpus_layout import BIGGER, COLOURS, KINDS, RELATIONS, relation_holds, size_word
from .generator import FAMILIES

VERSION = 2  # of the words: a corpus folder built with other words is not reused
N_ANSWERS = {"attribute_color": len(COLOURS), "attribute_shape": len(KINDS), "count": 6}  # others: yes/no
NUMBERS = ("zero", "one", "two", "three", "four", "five")
PLURAL = {k: "crosses" if k == "cross" else f"{k}s" for k in KINDS}
FILL_WORD = {"solid": "", "hollow": "hollow", "striped": "striped", "dotted": "dotted", "checked": "checked"}

COLOUR_Q = ("what color is the {}?", "which colour does the {} have?", "the {} is which colour?")
KIND_Q = ("what shape is the {}?", "which kind of object is the {}?", "what is the {}?")
EXIST_Q = ("is there {}?", "can you see {}?")
COUNT_Q = ("how many {} are there?", "count the {}.")
SPATIAL_Q = ("is the {a} {rel} the {b}?", "true or false: the {a} is {rel} the {b}?",
             "compared with the {b}, is the {a} {comp}?", "relative to the {b}, is the {a} {comp}?")
# each relation's wordings: as in "the A is ___ the B", and as in "compared with the B, is the A ___?"
REL_WORDS = {
    "left of": (("left of", "to the left of", "further left than", "more to the left than"), ("further left", "more to the left")),
    "right of": (("right of", "to the right of", "further right than", "more to the right than"), ("further right", "more to the right")),
    "above": (("above", "higher up than", "higher than"), ("higher up", "higher")),
    "below": (("below", "lower down than", "lower than"), ("lower down", "lower")),
    "bigger than": (("bigger than", "larger than"), ("bigger", "larger")),
    "smaller than": (("smaller than",), ("smaller",)),
}
COMPARE_Q = ("are there more {} than {}?", "are there fewer {} than {}?")


def article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def place(o: dict, side: int) -> str:
    """'top left', 'top', 'centre'... (the picture as a 3 x 3 grid): short, so that a listing of five
    objects fits the tiny decoder's 48 tokens."""
    col, row = min(2, int(3 * o["x"] / side)), min(2, int(3 * o["y"] / side))
    return " ".join(w for w in (("top", "", "bottom")[row], ("left", "", "right")[col]) if w) or "centre"


def full_name(o: dict, side: int) -> str:
    """'large red striped star': every attribute of the object."""
    return " ".join(w for w in (size_word(o, side), o["color"], FILL_WORD[o["fill"]], o["kind"]) if w)


def _clearly(group: list[dict], o: dict, most: str) -> bool:
    """o is the group's biggest / smallest by a clear margin: BIGGER x every other's diameter among one kind,
    BIGGER squared across kinds (there a diameter says less about the area drawn)."""
    others = [p for p in group if p is not o]
    margin = BIGGER if all(p["kind"] == o["kind"] for p in others) else BIGGER**2
    if not others:
        return False
    if most == "biggest":
        return all(o["d"] >= margin * p["d"] for p in others)
    return all(p["d"] >= margin * o["d"] for p in others)


def references(objs: list[dict], o: dict, colour: bool = True, kind: bool = True) -> list[str]:
    """Every name that picks out o alone, using its colour and / or kind only where allowed: 'star', 'pink
    thing', 'pink star', 'pink striped star', 'biggest star', 'smallest pink thing', 'biggest thing'."""
    out = []
    for keys in (("kind",), ("color",), ("color", "kind"), ("color", "fill", "kind"), ()):
        if ("color" in keys and not colour) or ("kind" in keys and not kind):
            continue
        group = [p for p in objs if all(p[k] == o[k] for k in keys)]
        words = [o["fill"] if k == "fill" else o[k] for k in keys] + ([] if "kind" in keys else ["thing"])
        if keys and len(group) == 1:
            out.append(" ".join(words))
        elif len(keys) < 3:  # "biggest pink striped star" says too much
            out += [" ".join([m, *words]) for m in ("biggest", "smallest") if _clearly(group, o, m)]
    return out


def _counts(objs: list[dict]) -> Counter:
    return Counter(d for o in objs for d in ((o["color"], None), (None, o["kind"]), (o["color"], o["kind"])))


def _desc(colour: str | None, kind: str | None, plural: bool = False) -> str:
    noun = (PLURAL[kind] if plural else kind) if kind else ("objects" if plural else "object")
    return " ".join(w for w in (colour, noun) if w)


DESCS = [(c, k) for c in (None, *COLOURS) for k in (None, *KINDS) if c or k]


def true_relations(objs: list[dict], side: int, rng: np.random.Generator) -> list[tuple[str, str, str]]:
    """(name a, relation, name b) for every clearly true relation between two objects that have names (one
    name of each, drawn at random)."""
    names = [references(objs, o) for o in objs]
    return [(names[i][rng.integers(len(names[i]))], rel, names[j][rng.integers(len(names[j]))])
            for i, j in product(range(len(objs)), repeat=2) for rel in RELATIONS
            if i != j and names[i] and names[j] and relation_holds(objs[i], objs[j], rel, side)]


def make_captions(scene: dict, side: int, rng: np.random.Generator) -> list[str]:
    """Four captions: the listing, the tally, two relation statements (or where the only object is)."""
    objs = sorted(scene["objects"], key=lambda o: (o["x"], o["y"]))
    n = len(objs)
    listing = ", ".join(f"{full_name(o, side)} {place(o, side)}" for o in objs)
    kinds = sorted(Counter(o["kind"] for o in objs).items(), key=lambda kv: (-kv[1], kv[0]))
    tally = ", ".join(article(k) if c == 1 else f"{NUMBERS[c]} {PLURAL[k]}" for k, c in kinds)
    caps = [f"left to right: {listing}",
            f"{NUMBERS[n]} object{'s' if n > 1 else ''} on a {scene['background']} {scene['pattern']} background: {tally}"]
    rels = true_relations(objs, side, rng)
    picks = rng.permutation(len(rels))[:2].tolist() if rels else []
    for a, rel, b in (rels[k] for k in picks):
        words = REL_WORDS[rel][0]
        caps.append(f"the {a} is {words[rng.integers(len(words))]} the {b}")
    while len(caps) < 4:
        o = objs[len(caps) % n]
        caps.append(f"{article(full_name(o, side))} at the {place(o, side)}, drawn {scene['style']}")
    return caps


def spatial_question(a: str, rel: str, b: str, rng: np.random.Generator) -> str:
    """'is the A REL the B?' in one of SPATIAL_Q's wordings and one of the relation's own."""
    template = SPATIAL_Q[rng.integers(len(SPATIAL_Q))]
    words = REL_WORDS[rel][0] if "{rel}" in template else REL_WORDS[rel][1]
    word = words[rng.integers(len(words))]
    return template.format(a=a, b=b, rel=word, comp=word)


def candidates(scene: dict, side: int, rng: np.random.Generator) -> dict[str, list[tuple[str, str]]]:
    """Every valid (question, answer) per family for a scene (one random template each)."""
    objs = scene["objects"]
    cands: dict[str, list[tuple[str, str]]] = {f: [] for f in FAMILIES}
    count = _counts(objs)
    for o in objs:
        for ref in references(objs, o, colour=False):
            cands["attribute_color"].append((COLOUR_Q[rng.integers(len(COLOUR_Q))].format(ref), o["color"]))
        for ref in references(objs, o, kind=False):
            cands["attribute_shape"].append((KIND_Q[rng.integers(len(KIND_Q))].format(ref), o["kind"]))
    for d in DESCS:
        cands["existence"].append((EXIST_Q[rng.integers(2)].format(article(_desc(*d))), "yes" if count[d] else "no"))
        if count[d] or rng.random() < 0.1:  # a few zeros: most descriptions are absent from any one scene
            cands["count"].append((COUNT_Q[rng.integers(2)].format(_desc(*d, plural=True)), str(count[d])))
    cands["count"].append((COUNT_Q[0].format("objects"), str(len(objs))))
    names = [references(objs, o) for o in objs]
    for i, j in product(range(len(objs)), repeat=2):
        if i != j and names[i] and names[j]:
            for rel in RELATIONS[:4]:
                holds = relation_holds(objs[i], objs[j], rel, side)
                if holds is not None:
                    a, b = names[i][rng.integers(len(names[i]))], names[j][rng.integers(len(names[j]))]
                    cands["spatial"].append((spatial_question(a, rel, b, rng), "yes" if holds else "no"))
    present = sorted({(None, o["kind"]) for o in objs} | {(o["color"], None) for o in objs}, key=str)
    for x, y in product(present, repeat=2):
        if x != y and (x[0] is None) == (y[0] is None):
            k = int(rng.integers(2))
            more = count[x] > count[y] if k == 0 else count[x] < count[y]
            q = COMPARE_Q[k].format(_desc(*x, plural=True), _desc(*y, plural=True))
            cands["comparison"].append((q, "yes" if more else "no"))
    return cands


__all__ = ["N_ANSWERS", "REL_WORDS", "candidates", "make_captions", "full_name", "place", "references",
           "true_relations"]
