"""The objects of a built-in synthetic split (Shapes, Scenes, the pretraining corpus) and which of them a
question or a caption names: what `vqa eval --grounding` scores attention against, what `--consistency` edits
and what training's grounding loss targets (`vqa.data.regions`).

The split's `<prefix>_<split>_scenes.json` (written by `vqa data shapes` / `vqa data scenes`) holds every
object with its box (left, top, right, bottom in pixels) and every scene's texture seed, so a scene can be
drawn again exactly. An object is found from the generator's own tables, never by a parser of its own:

- a colour or shape question ("what color is the small circle?") names the object whose colour (shape)
  becomes the answer when only that object's colour (shape) changes: the generator's `candidates` asked again;
- a count question counts the objects that fit its description (the generator's question table);
- a caption names an object with a singular noun ("circle", "star") and the colour / size words just before
  it, when exactly one object of the scene fits them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from ...errors import ConfigError, DataError
from . import corpus_layout, scenes_layout, scenes_text, shapes_layout, shapes_text
from .corpus import CORPUS_SET
from .generator import SyntheticSet
from .scenes import SCENES_SET
from .shapes import SHAPES_SET

ATTRIBUTE_FAMILIES = ("attribute_color", "attribute_shape")
PUNCTUATION = ",.:;!?"


@dataclass(frozen=True)
class SceneSet:
    """What the evaluation needs to know of one synthetic set."""

    spec: SyntheticSet  # its generator (`candidates` is asked again, `render` draws a scene, `prefix` names files)
    kind: str  # the object key of the answer to a shape question: "shape" / "kind"
    colours: tuple[str, ...]
    kinds: tuple[str, ...]
    adjectives: dict[str, tuple[str, str]]  # a caption word before a noun -> (object key, value) it fixes
    fillers: frozenset[str]  # caption words before a noun that fix nothing ("big": a rough size)
    counts: dict[str, dict[str, str]]  # count question -> {object key: value} of the objects it counts


def _shapes() -> SceneSet:
    keys = ("size", "color", "shape")
    counts = {q: {k: v for k, v in zip(keys, desc, strict=True) if v} for desc, q in shapes_text.COUNT_Q.items()}
    adjectives = {**{c: ("color", c) for c in shapes_layout.COLORS}, **{s: ("size", s) for s in shapes_layout.SIZES}}
    return SceneSet(SHAPES_SET, "shape", tuple(shapes_layout.COLORS), shapes_layout.SHAPES, adjectives, frozenset(),
                    counts)


def _scenes() -> SceneSet:
    keys = ("color", "kind")
    counts = {q: {k: v for k, v in zip(keys, desc, strict=True) if v}
              for desc, qs in scenes_text.COUNTS.items() for q in qs}
    return SceneSet(SCENES_SET, "kind", tuple(scenes_layout.COLOURS), scenes_layout.KINDS,
                    {c: ("color", c) for c in scenes_layout.COLOURS}, frozenset({"big", "little"}), counts)


def _corpus() -> SceneSet:
    """The pretraining corpus: a size word is relative to the picture, so it fixes nothing here; its count
    questions are not traced to their objects."""
    adjectives = {**{c: ("color", c) for c in corpus_layout.COLOURS}, **{f: ("fill", f) for f in corpus_layout.FILLS}}
    return SceneSet(CORPUS_SET, "kind", tuple(corpus_layout.COLOURS), corpus_layout.KINDS, adjectives,
                    frozenset(w for _, w in corpus_layout.SIZE_WORDS), {})


SETS = (_shapes(), _scenes(), _corpus())


@dataclass
class SceneFile:
    """One split's scenes: `scenes[image_id]`, drawn `side` pixels square."""

    set: SceneSet
    path: Path
    side: int
    scenes: dict
    _referents: dict = field(default_factory=dict, repr=False)

    def require(self, what: str, flag: str) -> None:
        """A clear error when the file predates the key `what` ("box" on objects, "texture_seed" on scenes)."""
        first = next(iter(self.scenes.values()), {})
        has = what in first if what == "texture_seed" else all(what in o for o in first.get("objects", []))
        if not has:
            raise DataError(f"{self.path}: its scenes have no {what!r}, which {flag} needs; build the set again "
                            f"(vqa data {self.set.spec.prefix} --out {self.path.parent} with its seed and sizes) "
                            "to write it")

    def draw(self, scene: dict) -> Image.Image:
        return self.set.spec.render(scene, self.side)

    def referent(self, image_id, family: str, question: str, answer: str) -> int | None:
        """`referent` in the scene of `image_id`, kept: grounding and consistency ask about the same questions."""
        key = (image_id, family, question, answer)
        if key not in self._referents:
            self._referents[key] = referent(self.set, self.scenes[image_id], self.side, family, question, answer)
        return self._referents[key]


def load_scenes(data: str | Path, split: str, flag: str) -> SceneFile:
    """The scenes file of `split` in the folder `data`; a one-line error when it is not a Shapes or Scenes folder."""
    root = Path(data)
    for s in SETS:
        path = root / f"{s.spec.prefix}_{split}_scenes.json"
        if path.is_file():
            doc = json.loads(path.read_text(encoding="utf-8"))
            return SceneFile(s, path, int(doc["info"]["image_size"]), {sc["image_id"]: sc for sc in doc["scenes"]})
    names = " or ".join(f"{s.spec.prefix}_{split}_scenes.json" for s in SETS)
    raise ConfigError(f"{flag} needs a Shapes or Scenes folder (vqa data shapes / scenes): {data} has no {names}")


def referent(sset: SceneSet, scene: dict, side: int, family: str, question: str, answer: str) -> int | None:
    """The index of the object a colour or shape question asks about (None when no object fits): among the
    objects whose colour (shape) is the answer, the one whose change changes the generator's answer."""
    key = "color" if family == "attribute_color" else sset.kind
    objs = scene["objects"]
    fits = [i for i, o in enumerate(objs) if o[key] == answer]
    if len(fits) <= 1:
        return fits[0] if fits else None
    probe = next(v for v in (sset.colours if key == "color" else sset.kinds) if v != answer)
    for i in fits:  # asking about the object by its other attributes, so the question stays while its answer moves
        changed = dict(scene, objects=[dict(o, **{key: probe}) if j == i else o for j, o in enumerate(objs)])
        if (question, probe) in sset.spec.candidates(changed, side, np.random.default_rng(0))[family]:
            return i
    return None


def counted(sset: SceneSet, scene: dict, question: str) -> list[int] | None:
    """The indices of the objects a count question counts (None for a question the set does not ask)."""
    desc = sset.counts.get(question)
    if desc is None:
        return None
    return [i for i, o in enumerate(scene["objects"]) if all(o[k] == v for k, v in desc.items())]


def caption_mentions(sset: SceneSet, scene: dict, words: list[str]) -> list[tuple[list[int], int]]:
    """(word positions, object index) for each phrase of a caption that names exactly one object of the scene:
    a singular noun and the colour / size words right before it ("a small red circle": positions of
    small, red, circle)."""
    clean = [w.strip(PUNCTUATION).lower() for w in words]
    kinds = {*sset.kinds, *(o[sset.kind] for o in scene["objects"])}  # a corpus things scene names its own
    out = []
    for n, w in enumerate(clean):
        if w not in kinds:
            continue
        start, fixed = n, {sset.kind: w}
        while start > 0 and (clean[start - 1] in sset.adjectives or clean[start - 1] in sset.fillers):
            start -= 1
            if clean[start] in sset.adjectives:
                key, value = sset.adjectives[clean[start]]
                if fixed.setdefault(key, value) != value:  # "red blue circle": two colours name nothing
                    break
        else:
            fits = [i for i, o in enumerate(scene["objects"]) if all(o[k] == v for k, v in fixed.items())]
            if len(fits) == 1:
                out.append((list(range(start, n + 1)), fits[0]))
    return out


__all__ = ["ATTRIBUTE_FAMILIES", "SETS", "SceneFile", "SceneSet", "caption_mentions", "counted", "load_scenes",
           "referent"]
