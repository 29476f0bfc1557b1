"""Things scenes of the pretraining corpus (`vqa pretrain --things DIR`): 1-3 pictures of real kinds of things
from a things folder (`things`), each a different one, turned a little and mirrored at random, on one of the
corpus's backgrounds; with captions, questions and boxes in the corpus's forms, so that the words, the
relations and the grounding loss work on them as on the geometric scenes.

A corpus with things is `with_things(folder, share)`: that share of its scenes are things scenes, the rest the
geometric ones. A things scene's objects carry `kind` (the thing's name), `file` (its picture in the folder),
`x`, `y` (centre), `d` (longest side, pixels), `angle`, `flip`, `box` and no colour.
"""

from __future__ import annotations

import dataclasses
import os
from functools import partial

import numpy as np
from PIL import Image

from . import corpus_layout, corpus_render, corpus_text
from . import things as things_lib
from .corpus import CORPUS_SET
from .generator import FAMILIES, NUMBERS, SyntheticSet, article, relation_holds

STYLE = "picture"  # a things scene's `style`: its objects are pictures, not drawn shapes
SIZE = (0.3, 0.6)  # a thing's longest side, fraction of the picture's side
MAX_THINGS = 3
TURN = 15.0  # degrees either way
K = corpus_render.K
RELATIONS = corpus_layout.RELATIONS[:4]  # left of, right of, above, below: bigger / smaller need one kind

WHAT_Q = ("what is this?", "what is in the picture?")  # one thing
SIDE_Q = {"left of": "what is on the left?", "right of": "what is on the right?",
          "above": "what is at the top?", "below": "what is at the bottom?"}  # the thing clearly furthest that way
BACKGROUND_Q = ("what color is the background?", "which colour is the background?")
COUNT_Q = ("how many things are there?", "how many things can you see?")
N_ABSENT = 2  # "is there a X?" for this many things that are not there


def _placed(o: dict, folder: str, k: int) -> tuple[Image.Image, int, int]:
    """The thing drawn at k pixels per scene unit: (RGBA picture, left, top) after its size, flip and turn."""
    pic = things_lib.picture(folder, o["file"])
    s = o["d"] * k / max(pic.size)
    pic = pic.resize((max(1, round(pic.width * s)), max(1, round(pic.height * s))), Image.Resampling.LANCZOS)
    if o["flip"]:
        pic = pic.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    pic = pic.rotate(o["angle"], resample=Image.Resampling.BICUBIC, expand=True)
    return pic, round(o["x"] * k - pic.width / 2), round(o["y"] * k - pic.height / 2)


def _box(o: dict, folder: str) -> list[float]:
    """[left, top, right, bottom] in pixels of the thing's opaque part, as drawn."""
    pic, left, top = _placed(o, folder, K)
    x0, y0, x1, y1 = Image.fromarray((np.asarray(pic)[..., 3] > 127).astype(np.uint8)).getbbox() or (0, 0, 0, 0)
    return [round((left + x0) / K, 2), round((top + y0) / K, 2), round((left + x1) / K, 2), round((top + y1) / K, 2)]


def make_scene(rng: np.random.Generator, side: int, folder: str) -> dict:
    """1-3 different things at random sizes and places (overlapping a little at most), a background and a pattern."""
    things = things_lib.load(folder)
    names = things.names
    n = int(rng.integers(1, min(MAX_THINGS, len(names)) + 1))
    objs: list[dict] = []
    while len(objs) < n:
        name = names[rng.integers(len(names))]
        if any(o["kind"] == name for o in objs):
            continue
        files = things.files[name]
        d = float(rng.uniform(*SIZE)) * side
        while (at := corpus_layout._place(rng, objs, d, side)) is None and d > SIZE[0] * side:
            d *= 0.85
        if at is None:
            objs = []
            continue
        o = dict(kind=name, color=None, file=files[rng.integers(len(files))], x=round(at[0], 2), y=round(at[1], 2),
                 d=round(d, 2), angle=round(float(rng.uniform(-TURN, TURN)), 1), flip=bool(rng.random() < 0.5))
        o["box"] = _box(o, folder)
        objs.append(o)
    background = list(corpus_layout.BACKGROUNDS)[rng.integers(len(corpus_layout.BACKGROUNDS))]
    return dict(objects=objs, background=background, pattern=corpus_layout.PATTERNS[rng.integers(
        len(corpus_layout.PATTERNS))], style=STYLE, texture_seed=int(rng.integers(2**31)))


def render(scene: dict, side: int, folder: str) -> Image.Image:
    """The scene as an RGB picture: the corpus's background, then each thing in list order."""
    n = side * K
    img = Image.fromarray(np.clip(corpus_render.background(scene, n), 0, 255).astype(np.uint8), "RGB")
    for o in scene["objects"]:
        pic, left, top = _placed(o, folder, K)
        img.paste(pic, (left, top), pic)
    return img.reduce(K)


def _furthest(objs: list[dict], i: int, rel: str, side: int) -> bool:
    return all(relation_holds(objs[i], p, rel, side) for j, p in enumerate(objs) if j != i)


def true_relations(objs: list[dict], side: int) -> list[tuple[str, str, str]]:
    return [(a["kind"], rel, b["kind"]) for a in objs for b in objs for rel in RELATIONS
            if a is not b and relation_holds(a, b, rel, side)]


def make_captions(scene: dict, side: int, rng: np.random.Generator) -> list[str]:
    """The corpus's four captions: the listing with places, the tally with the background, two relations (or
    where a thing is)."""
    objs = sorted(scene["objects"], key=lambda o: (o["x"], o["y"]))
    n = len(objs)
    caps = ["left to right: " + ", ".join(f"{o['kind']} {corpus_text.place(o, side)}" for o in objs),
            f"{NUMBERS[n]} thing{'s' if n > 1 else ''} on a {scene['background']} {scene['pattern']} background: "
            + ", ".join(article(o["kind"]) for o in objs)]
    rels = true_relations(objs, side)
    picks = rng.permutation(len(rels))[:2].tolist() if rels else []
    caps += [f"the {a} is {rel} the {b}" for a, rel, b in (rels[k] for k in picks)]
    fillers = [f"a picture of {article(o['kind'])} at the {corpus_text.place(o, side)}" for o in objs]
    fillers += [f"{article(o['kind'])} on {article(scene['background'])} background" for o in objs]
    caps += fillers[: 4 - len(caps)]
    return caps


def candidates(scene: dict, side: int, rng: np.random.Generator, folder: str) -> dict[str, list[tuple[str, str]]]:
    """Every valid (question, answer) per family: what a thing is (alone, or the one furthest one way), the
    background's colour, whether a thing is there, how many, and where one is from another."""
    objs = scene["objects"]
    cands: dict[str, list[tuple[str, str]]] = {f: [] for f in FAMILIES}
    if len(objs) == 1:
        cands["attribute_shape"].append((WHAT_Q[rng.integers(2)], objs[0]["kind"]))
    for i, o in enumerate(objs):
        cands["attribute_shape"] += [(q, o["kind"]) for rel, q in SIDE_Q.items()
                                     if len(objs) > 1 and _furthest(objs, i, rel, side)]
    cands["attribute_color"].append((BACKGROUND_Q[rng.integers(2)], scene["background"]))
    exist_q = corpus_text.EXIST_Q
    present = {o["kind"] for o in objs}
    absent = [n for n in things_lib.load(folder).names if n not in present]
    for name in [*sorted(present), *(absent[k] for k in rng.permutation(len(absent))[:N_ABSENT])]:
        cands["existence"].append((exist_q[rng.integers(2)].format(article(name)), "yes" if name in present else "no"))
    cands["count"].append((COUNT_Q[rng.integers(2)], str(len(objs))))
    for a in objs:
        for b in objs:
            for rel in RELATIONS if a is not b else ():
                holds = relation_holds(a, b, rel, side)
                if holds is not None:
                    q = corpus_text.SPATIAL_Q[rng.integers(2)].format(a=a["kind"], b=b["kind"], rel=rel)
                    cands["spatial"].append((q, "yes" if holds else "no"))
    return cands


def _either(things_fn, corpus_fn, scene: dict, *args):
    """A things scene to `things_fn`, a geometric one to the corpus's own `corpus_fn`."""
    return (things_fn if scene.get("style") == STYLE else corpus_fn)(scene, *args)


def _make_scene(rng: np.random.Generator, side: int, folder: str, share: float) -> dict:
    if rng.random() < share:
        return make_scene(rng, side, folder)
    return corpus_layout.make_scene(rng, side)


def _box_of(o: dict) -> list:
    return o["box"] if "file" in o else CORPUS_SET.object_box(o)


def with_things(folder: str | os.PathLike, share: float) -> SyntheticSet:
    """The corpus with `share` (0-1) of its scenes drawn from the things folder (checked here)."""
    folder = str(folder)
    things_lib.load(folder)
    return dataclasses.replace(
        CORPUS_SET,
        make_scene=partial(_make_scene, folder=folder, share=share),
        candidates=partial(_either, partial(candidates, folder=folder), CORPUS_SET.candidates),
        make_captions=partial(_either, make_captions, CORPUS_SET.make_captions),
        render=partial(_either, partial(render, folder=folder), CORPUS_SET.render),
        object_box=_box_of,
    )


__all__ = ["STYLE", "candidates", "make_captions", "make_scene", "render", "with_things"]
