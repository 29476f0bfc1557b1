"""The words of the Scenes set: questions and captions about a scene, worded unlike Shapes'.

Questions: every valid (question, answer) per family, from 2-3 templates each ("which colour is the biggest
star?", "what is the pink thing?", "can you see a brown ring?", "what number of hearts can you see?", "is the
cyan cross higher up than the white arrow?", "are the stars outnumbered by the rings?"); `generator`
picks among them so that answers stay balanced per question string. A thing is named by colour and / or kind,
or as the clearly biggest / smallest of such things; a name used as a reference picks out exactly one object.
Spatial words ("further left", "higher up") differ from Shapes' ("left of", "above"); any text that says left
or right stops a horizontal flip (`--hflip`). Captions: four per image, two of them listing every object left
to right and top to bottom.
"""

from __future__ import annotations

from collections import Counter
from itertools import product

import numpy as np

from .generator import FAMILIES, NUMBERS, article, by_count, comparisons, join, spatial, tally, unique_relations
from .scenes_layout import COLOURS, KINDS, extreme

N_ANSWERS = {"attribute_color": len(COLOURS), "attribute_shape": len(KINDS), "count": 7}  # others: yes/no
PLURAL = {k: "crosses" if k == "cross" else f"{k}s" for k in KINDS}
# our relation -> the Shapes relation with the same meaning (the same 10% margin)
RELATIONS = {"further left": "left of", "further right": "right of", "higher up": "above", "lower down": "below"}

COLOUR_Q = ("which colour is the {}?", "what colour does the {} have?", "the {} is which colour?")
KIND_Q = ("which kind of shape is the {}?", "what is the {}?", "the {} has which shape?")
EXIST_Q = ("can you see {}?", "does the picture contain {}?", "is any {} visible?")
COUNT_Q = ("how many {} are in the picture?", "what number of {} can you see?", "how many {} does the picture show?")
SPATIAL_Q = ("is the {a} {rel} than the {b}?", "compared with the {b}, is the {a} {rel}?")
COMPARE_Q = (("is the number of {} greater than the number of {}?", ">"), ("are the {} outnumbered by the {}?", "<"),
             ("are there as many {} as {}?", "="))
# every wording per family (spatial: one per order and relation), as `templates` matches a question back to it
TEMPLATES = {"attribute_color": COLOUR_Q, "attribute_shape": KIND_Q, "existence": EXIST_Q, "count": COUNT_Q,
             "spatial": tuple(t.replace("{rel}", rel) for t in SPATIAL_Q for rel in RELATIONS),
             "comparison": tuple(t for t, _ in COMPARE_Q)}


def name(colour: str | None, kind: str | None, plural: bool = False, most: str | None = None) -> str:
    """'pink star', 'pink things', 'stars', 'biggest thing'..."""
    noun = (PLURAL[kind] if plural else kind) if kind else ("things" if plural else "thing")
    return " ".join(w for w in (most, colour, noun) if w)


# the words a slot holds: a thing's name, with its article
SLOT_WORDS = (*COLOURS, *KINDS, *PLURAL.values(), "thing", "things", "biggest", "smallest", "a", "an")
DESCS = [(c, k) for c in (None, *COLOURS) for k in (None, *KINDS)]  # (colour, kind); (None, None) = anything
# the wordings, made once (candidates() runs for every image): per description / pair, one per template
COUNTS = {d: [t.format(name(*d, plural=True)) for t in COUNT_Q] for d in DESCS}
EXISTS = {d: [t.format(x) for t, x in zip(EXIST_Q, (article(name(*d)), article(name(*d)), name(*d)), strict=True)]
          for d in DESCS if any(d)}
PAIRS = [(x, y) for group in ([(None, k) for k in KINDS], [(c, None) for c in COLOURS])
         for x, y in product(group, repeat=2) if x != y]
COMPARES = {(x, y): [(t.format(name(*x, plural=True), name(*y, plural=True)), op) for t, op in COMPARE_Q]
            for x, y in PAIRS}


def _matches(objs: list[dict], colour: str | None, kind: str | None) -> list[dict]:
    return [o for o in objs if colour in (None, o["color"]) and kind in (None, o["kind"])]


def references(objs: list[dict], o: dict, use_colour: bool, use_kind: bool) -> list[str]:
    """The names that pick out object o and nothing else: by colour and / or kind (only those allowed),
    or as the clearly biggest / smallest of the things sharing the allowed attribute(s)."""
    out = []
    for colour, kind in product((None, o["color"]) if use_colour else (None,),
                                (None, o["kind"]) if use_kind else (None,)):
        group = _matches(objs, colour, kind)
        if (colour or kind) and len(group) == 1:
            out.append(name(colour, kind))
        out += [name(colour, kind, most=m) for m in ("biggest", "smallest") if extreme(group, m) is o]
    return out


def candidates(scene: dict, side: int, rng: np.random.Generator) -> dict[str, list[tuple[str, str]]]:
    """Every valid (question, answer) per family for a scene (spatial: one random wording per object pair
    and relation)."""
    objs = scene["objects"]
    cands: dict[str, list[tuple[str, str]]] = {f: [] for f in FAMILIES}
    for o in objs:
        for ref in references(objs, o, use_colour=False, use_kind=True):
            cands["attribute_color"] += [(t.format(ref), o["color"]) for t in COLOUR_Q]
        for ref in references(objs, o, use_colour=True, use_kind=False):
            cands["attribute_shape"] += [(t.format(ref), o["kind"]) for t in KIND_Q]
    count = Counter(d for o in objs
                    for d in ((None, None), (o["color"], None), (None, o["kind"]), (o["color"], o["kind"])))
    pick = iter(rng.integers(3, size=2 * len(DESCS) + len(PAIRS)).tolist())  # one of the 3 templates each
    for d in DESCS:
        cands["count"].append((COUNTS[d][next(pick)], str(count[d])))
        if d in EXISTS:
            cands["existence"].append((EXISTS[d][next(pick)], "yes" if count[d] else "no"))
    plain = [[r for r in references(objs, o, True, True) if not r.startswith(("biggest", "smallest"))] for o in objs]
    cands["spatial"] = spatial(objs, plain, RELATIONS, side, rng,
                               lambda rel, a, b: SPATIAL_Q[rng.integers(len(SPATIAL_Q))].format(a=a, b=b, rel=rel))
    cands["comparison"] = comparisons(COMPARES, count, pick)
    return cands


# ---------------------------------------------------------------------------------------------------------
# captions

BACKDROP = {"checkerboard": "a {} checkerboard", "stripes": "{} stripes", "blobs": "a blotchy {} backdrop",
            "horizon": "a {} floor with a horizon"}


def _size_word(o: dict, side: int) -> str:
    return "big " if o["d"] >= 0.245 * side else "little " if o["d"] <= 0.185 * side else ""


def _listing(objs: list[dict], side: int) -> str:
    """'a big pink star, two cyan rings and a black cross': neighbours with one name merged, order kept."""
    runs: list[list] = []
    for o in objs:
        words = (f"{_size_word(o, side)}{o['color']}", o["kind"])
        if runs and runs[-1][0] == words:
            runs[-1][1] += 1
        else:
            runs.append([words, 1])
    return join([article(f"{a} {k}") if n == 1 else f"{NUMBERS[n]} {a} {PLURAL[k]}" for (a, k), n in runs])


def _spot(o: dict, side: int) -> str:
    col, row = min(2, int(3 * o["x"] / side)), min(2, int(3 * o["y"] / side))
    if (col, row) == (1, 1):
        return "in the middle"
    if col == 1 or row == 1:
        return f"near the {('top', '', 'bottom')[row] or ('left', '', 'right')[col]} edge"
    return f"in the {('top', '', 'bottom')[row]} {('left', '', 'right')[col]} corner"


def make_captions(scene: dict, side: int, rng: np.random.Generator) -> list[str]:
    """Four captions: the objects going left to right, top to bottom, a tally on the backdrop, and one clear
    relation (a single object: where it is)."""
    objs = sorted(scene["objects"], key=lambda o: o["x"])
    n = len(objs)
    backdrop = BACKDROP[scene["style"]].format(scene["background"])
    kinds = (f"{NUMBERS[n]} shape{'s' if n > 1 else ''} on {backdrop}: "
             + tally((o["kind"] for o in objs), PLURAL.get))
    if n == 1:
        o = objs[0]
        return [f"just one {_size_word(o, side)}{o['color']} {o['kind']}, {_spot(o, side)}", kinds,
                f"the only thing in the picture is {_listing(objs, side)}",
                f"a lone {o['color']} {o['kind']} on {backdrop}"]
    caps = ["going left to right: " + _listing(objs, side),
            "top to bottom: " + _listing(sorted(objs, key=lambda o: o["y"]), side), kinds]
    short = [f"{o['color']} {o['kind']}" for o in objs]
    pairs = unique_relations(objs, short, RELATIONS, side)
    if pairs:
        i, j, rel = pairs[rng.integers(len(pairs))]
        caps.append(f"the {short[i]} sits {rel} than the {short[j]}")
    else:
        colours = by_count(o["color"] for o in objs)
        caps.append("the shapes huddle close together: " + join([f"{NUMBERS[k]} {c}" for c, k in colours]))
    return caps


__all__ = ["N_ANSWERS", "candidates", "make_captions", "name", "references"]
