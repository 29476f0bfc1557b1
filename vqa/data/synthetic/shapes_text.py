"""The words of the Shapes set: questions and captions about a scene.

Questions: every valid (question, answer) of a scene per family (`candidates`), among which `generator`
picks one per family so that, per question string, answers stay as uniform as possible (`Balancer`): a model
that ignores the image scores about chance. Referring expressions always pick out exactly one object. Captions
name the objects and their layout, from varied templates.
"""

from __future__ import annotations

from collections import Counter
from itertools import product

import numpy as np

from .generator import FAMILIES, NUMBERS, article, join, relation_holds, spatial, tally
from .shapes_layout import COLORS, SHAPES, SIZES

N_ANSWERS = {"attribute_color": 6, "attribute_shape": 4, "count": 7}  # others: yes/no
RELATIONS = ("left of", "right of", "above", "below")


def _plural(shape: str | None) -> str:
    return f"{shape}s" if shape else "objects"


def describe(attrs: tuple, plural: bool = False) -> str:
    """(size, color, shape) with Nones -> 'small red circle' / 'red objects'."""
    size, color, shape = attrs
    noun = _plural(shape) if plural else (shape or "object")
    return " ".join(w for w in (size, color, noun) if w)


# ---------------------------------------------------------------------------------------------------------
# questions


def desc_counts(objs: list[dict]) -> Counter:
    """How many objects match each (size, color, shape) description (None = any), computed in one pass."""
    c: Counter = Counter()
    for o in objs:
        for use in product((False, True), repeat=3):
            c[tuple(o[k] if u else None for k, u in zip(("size", "color", "shape"), use, strict=True))] += 1
    return c


def _unique_refs(o: dict, counts: Counter, keys: tuple[str, ...]) -> list[tuple]:
    """Descriptions of object o using only attributes in `keys` that match it and no other object."""
    out = []
    for use in product(*[(False, True) if k in keys else (False,) for k in ("size", "color", "shape")]):
        attrs = tuple(o[k] if u else None for k, u in zip(("size", "color", "shape"), use, strict=True))
        if any(use) and counts[attrs] == 1:
            out.append(attrs)
    return out


# every wording per family (spatial: one per relation), slots "{}", "{a}", "{b}": what `candidates` fills in and
# what `templates` matches a question back to
TEMPLATES = {
    "attribute_color": ("what color is the {}?",), "attribute_shape": ("what shape is the {}?",),
    "existence": ("is there {}?",), "count": ("how many {} are there?",),
    "spatial": tuple(f"is the {{a}} {rel} the {{b}}?" for rel in RELATIONS),
    "comparison": ("are there more {} than {}?", "are there fewer {} than {}?"),
}
SPATIAL_Q = dict(zip(RELATIONS, TEMPLATES["spatial"], strict=True))
# the words a slot holds: an object's description, with its article
SLOT_WORDS = (*SIZES, *COLORS, *SHAPES, *(_plural(s) for s in SHAPES), "object", "objects", "a", "an")

ALL_DESCS = list(product((None, *SIZES), (None, *COLORS), (None, *SHAPES)))
NAME = {a: describe(a) for a in ALL_DESCS}  # precomputed wordings: candidates() runs many times per question
COUNT_Q = {a: TEMPLATES["count"][0].format(describe(a, True)) for a in ALL_DESCS}
EXIST_Q = {a: TEMPLATES["existence"][0].format(article(describe(a))) for a in ALL_DESCS if any(a)}
COMPARE_Q = [
    (x, y, template.format(describe(x, True), describe(y, True)), more)
    for group in ([(None, None, s) for s in SHAPES], [(None, c, None) for c in COLORS],
                  [(s, None, None) for s in SIZES])
    for x, y in product(group, repeat=2) if x != y
    for template, more in zip(TEMPLATES["comparison"], (True, False), strict=True)
]


def candidates(scene: dict, side: int, rng: np.random.Generator) -> dict[str, list[tuple[str, str]]]:
    """Every valid (question, answer) per family for a scene (spatial: one random wording per object pair)."""
    objs = scene["objects"]
    counts = desc_counts(objs)
    cands: dict[str, list[tuple[str, str]]] = {f: [] for f in FAMILIES}
    for o in objs:
        for r in _unique_refs(o, counts, ("size", "shape")):
            cands["attribute_color"].append((TEMPLATES["attribute_color"][0].format(NAME[r]), o["color"]))
        for r in _unique_refs(o, counts, ("size", "color")):
            cands["attribute_shape"].append((TEMPLATES["attribute_shape"][0].format(NAME[r]), o["shape"]))
    cands["count"] = [(q, str(counts[a])) for a, q in COUNT_Q.items()]
    cands["existence"] = [(q, "yes" if counts[a] else "no") for a, q in EXIST_Q.items()]
    refs = [_unique_refs(o, counts, ("size", "color", "shape")) for o in objs]
    cands["spatial"] = spatial(objs, refs, dict(zip(RELATIONS, RELATIONS, strict=True)), side, rng,
                               lambda rel, a, b: SPATIAL_Q[rel].format(a=NAME[a], b=NAME[b]))
    for x, y, q, more in COMPARE_Q:
        nx, ny = counts[x], counts[y]
        cands["comparison"].append((q, "yes" if (nx > ny if more else nx < ny) else "no"))
    return cands


# ---------------------------------------------------------------------------------------------------------
# captions


def _where(o: dict, side: int) -> str:
    col, row = min(2, int(3 * o["x"] / side)), min(2, int(3 * o["y"] / side))
    return {(1, 1): "in the center", (0, 1): "on the left", (2, 1): "on the right", (1, 0): "at the top",
            (1, 2): "at the bottom"}.get((col, row),
                                         f"at the {('top', '', 'bottom')[row]} {('left', '', 'right')[col]}")


def _tally(objs: list[dict], noun: str) -> str:
    """'two red objects and a blue object': the objects by colour."""
    return tally([f"{o['color']} {noun}" for o in objs], lambda w: w + "s")


def _group(names: list[str]) -> str:
    """['red circle', 'red circle', 'blue square'] -> 'two red circles and a blue square' (order kept)."""
    return join([article(v) if k == 1 else f"{NUMBERS[k]} {v}s" for v, k in Counter(names).items()])


def _full_names(objs: list[dict]) -> list[str]:
    return [f"{o['size']} {o['color']} {o['shape']}" for o in objs]


CAPTION_REL = {"left of": "to the left of", "right of": "to the right of", "above": "above", "below": "below"}


def make_captions(scene: dict, side: int, rng: np.random.Generator) -> list[str]:
    """Four captions naming the objects and their layout, from varied templates. Two list every object in
    order: the first left to right, the second top to bottom, so that both axes are taught by a loss on every
    caption token (a yes/no spatial question gives one bit)."""
    objs = sorted(scene["objects"], key=lambda o: o["x"])
    bg, n = scene["background"], len(objs)
    full = _full_names(objs)
    short = [f"{o['color']} {o['shape']}" for o in objs]
    if n == 1:
        o = objs[0]
        return [f"{article(full[0])} {_where(o, side)}", f"one {full[0]} on {article(bg)} background",
                f"there is one object: {article(short[0])}",
                f"{article(short[0])} alone {_where(o, side)} of the image"]
    caps = [_group(full), "from top to bottom: " + _group(_full_names(sorted(objs, key=lambda o: o["y"])))]
    pairs = [(i, j, r) for i, j in product(range(n), repeat=2) for r in RELATIONS
             if short[i] != short[j] and relation_holds(objs[i], objs[j], r, side)]
    if pairs:
        i, j, rel = pairs[rng.integers(len(pairs))]
        rest = n - 2
        tail = (f" on {article(bg)} background" if not rest
                else f" and {NUMBERS[rest]} other object{'s' if rest > 1 else ''}")
        caps.append(f"{article(short[i])} {CAPTION_REL[rel]} {article(full[j])}{tail}")
    else:
        caps.append(f"{_tally(objs, 'object')} close together")
    if n <= 3:
        caps.append(f"there are {NUMBERS[n]} objects: "
                    + join([f"{article(short[k])} {_where(o, side)}" for k, o in enumerate(objs)]))
    else:
        caps.append(f"there are {NUMBERS[n]} objects: {_tally(objs, 'one')}")
    return caps
