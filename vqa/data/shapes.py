"""The built-in Shapes set: synthetic scenes with questions that need the image, written as VQA v2 + COCO.

Why: a fresh machine has no data set; Shapes gives training, tests and the demo something real to learn, in
the same files as VQA v2 / COCO captions, so one loader path serves it and real data.

Scenes: 1-6 objects (4 shapes, 6 colours, 2 sizes) at random non-overlapping positions on a varied
background (3 grey levels x plain / gradient / noise), drawn 4x supersampled and area-downsampled.
Questions: one per family per image (6; a family with nothing askable is replaced by another). Each
question is chosen among the scene's valid candidates so that, per question string, answers stay as
uniform as possible: a model that ignores the image scores about chance (the prior table printed at the end).
Referring expressions always pick out exactly one object; spatial relations compare centres and need a
margin of 10% of the image side. Everything derives from `seed`: two builds are byte-identical.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from collections import Counter, defaultdict
from itertools import product
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from ..errors import ConfigError

SHAPES = ("circle", "square", "triangle", "diamond")
COLORS = {
    "red": (220, 40, 40), "orange": (245, 140, 20), "yellow": (240, 215, 40),
    "green": (40, 170, 70), "blue": (40, 90, 230), "purple": (150, 60, 200),
}
SIZES = {"small": 0.14, "large": 0.25}  # bounding-box side as a fraction of the image side (9 / 16 px at 64)
BACKGROUNDS = {"light gray": 196, "gray": 128, "dark gray": 56}
STYLES = ("plain", "gradient", "noise")
FAMILIES = ("attribute_color", "attribute_shape", "existence", "count", "spatial", "comparison")
ANSWER_TYPES = {"attribute_color": "other", "attribute_shape": "other", "existence": "yes/no",
                "count": "number", "spatial": "yes/no", "comparison": "yes/no"}
N_ANSWERS = {"attribute_color": 6, "attribute_shape": 4, "count": 7}  # others: yes/no
RELATIONS = ("left of", "right of", "above", "below")
WORDS = ("zero", "one", "two", "three", "four", "five", "six")
SPLITS = {"train": 1_000_000, "val": 2_000_000}  # image id offset per split
SUPERSAMPLE = 4
REPEAT = 0.3  # chance that a new object copies the shape (and, separately, the colour) of an earlier one
MARGIN = 0.10  # spatial relations need centres this far apart (fraction of the side)


def _plural(shape: str | None) -> str:
    return f"{shape}s" if shape else "objects"


def describe(attrs: tuple, plural: bool = False) -> str:
    """(size, color, shape) with Nones -> 'small red circle' / 'red objects'."""
    size, color, shape = attrs
    noun = _plural(shape) if plural else (shape or "object")
    return " ".join(w for w in (size, color, noun) if w)


def _a(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def relation_holds(a: dict, b: dict, rel: str, side: int) -> bool | None:
    """True/False if `a rel b` is clearly true/false (centres apart by the margin), None if too close to say."""
    m = MARGIN * side
    d = {"left of": b["x"] - a["x"], "right of": a["x"] - b["x"], "above": b["y"] - a["y"], "below": a["y"] - b["y"]}[rel]
    return True if d >= m else False if d <= -m else None


# ---------------------------------------------------------------------------------------------------------
# scenes


def make_scene(rng: np.random.Generator, side: int) -> dict:
    """Random objects with non-overlapping boxes, kept at least 5% of the side away from the border."""
    border, gap = max(3.0, 0.05 * side), max(2.0, 0.03 * side)
    n = int(rng.integers(1, 7))
    while True:
        objs: list[dict] = []
        for _ in range(n):
            shape, color = SHAPES[rng.integers(len(SHAPES))], list(COLORS)[rng.integers(len(COLORS))]
            size = ("small", "large")[rng.integers(2)]
            if objs and rng.random() < REPEAT:  # repeat a shape or colour now and then: larger counts
                shape = objs[rng.integers(len(objs))]["shape"]
            if objs and rng.random() < REPEAT:
                color = objs[rng.integers(len(objs))]["color"]
            d = round(SIZES[size] * side)
            for _try in range(100):
                x, y = rng.uniform(border + d / 2, side - border - d / 2, size=2)
                if all(max(abs(x - o["x"]) - (d + o["d"]) / 2, abs(y - o["y"]) - (d + o["d"]) / 2) >= gap for o in objs):
                    objs.append(dict(shape=shape, color=color, size=size, x=round(float(x), 2), y=round(float(y), 2), d=d))
                    break
        if len(objs) == n:
            break
    bg = list(BACKGROUNDS)[rng.integers(len(BACKGROUNDS))]
    return dict(objects=objs, background=bg, style=STYLES[rng.integers(len(STYLES))], texture_seed=int(rng.integers(2**31)))


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


ALL_DESCS = list(product((None, *SIZES), (None, *COLORS), (None, *SHAPES)))
NAME = {a: describe(a) for a in ALL_DESCS}  # precomputed wordings: candidates() runs ~100k times per build
COUNT_Q = {a: f"how many {describe(a, True)} are there?" for a in ALL_DESCS}
EXIST_Q = {a: f"is there {_a(describe(a))}?" for a in ALL_DESCS if any(a)}
COMPARE_Q = [
    (x, y, f"are there {word} {describe(x, True)} than {describe(y, True)}?", word == "more")
    for group in ([(None, None, s) for s in SHAPES], [(None, c, None) for c in COLORS], [(s, None, None) for s in SIZES])
    for x, y in product(group, repeat=2) if x != y
    for word in ("more", "fewer")
]


def candidates(scene: dict, side: int, rng: np.random.Generator) -> dict[str, list[tuple[str, str]]]:
    """Every valid (question, answer) per family for a scene (spatial: one random wording per object pair)."""
    objs = scene["objects"]
    counts = desc_counts(objs)
    cands: dict[str, list[tuple[str, str]]] = {f: [] for f in FAMILIES}
    for o in objs:
        for r in _unique_refs(o, counts, ("size", "shape")):
            cands["attribute_color"].append((f"what color is the {NAME[r]}?", o["color"]))
        for r in _unique_refs(o, counts, ("size", "color")):
            cands["attribute_shape"].append((f"what shape is the {NAME[r]}?", o["shape"]))
    cands["count"] = [(q, str(counts[a])) for a, q in COUNT_Q.items()]
    cands["existence"] = [(q, "yes" if counts[a] else "no") for a, q in EXIST_Q.items()]
    refs = [_unique_refs(o, counts, ("size", "color", "shape")) for o in objs]
    for i, j in product(range(len(objs)), repeat=2):
        if i == j or not refs[i] or not refs[j]:
            continue
        for rel in RELATIONS:
            holds = relation_holds(objs[i], objs[j], rel, side)
            if holds is not None:
                ra, rb = refs[i][rng.integers(len(refs[i]))], refs[j][rng.integers(len(refs[j]))]
                cands["spatial"].append((f"is the {NAME[ra]} {rel} the {NAME[rb]}?", "yes" if holds else "no"))
    for x, y, q, more in COMPARE_Q:
        nx, ny = counts[x], counts[y]
        cands["comparison"].append((q, "yes" if (nx > ny if more else nx < ny) else "no"))
    return cands


class Balancer:
    """Picks questions so answers stay near uniform per family and per question string.

    First the answer: among those the scene allows, the one whose family share and best per-string surplus
    are lowest; then a question string with that answer whose own answer counts need it most."""

    def __init__(self, rng: np.random.Generator, alpha: float = 2.0):
        self.rng, self.alpha = rng, alpha
        self.per_qa: Counter = Counter()  # (question, answer) -> times asked
        self.per_q: Counter = Counter()
        self.per_f: dict[str, Counter] = defaultdict(Counter)

    def pick(self, family: str, cands: list[tuple[str, str]], taken: set[str]) -> tuple[str, str] | None:
        inv_k = 1.0 / N_ANSWERS.get(family, 2)
        qa, qt = self.per_qa, self.per_q
        by_answer: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for q, a in cands:
            if q not in taken:
                by_answer[a].append((qa[q, a] - qt[q] * inv_k, q))
        if not by_answer:
            return None
        fam = self.per_f[family]
        share = max(1.0, sum(fam.values()) * inv_k)
        lows = {a: min(qs)[0] for a, qs in by_answer.items()}
        score = {a: lows[a] + self.alpha * (fam[a] - share) / share for a in by_answer}
        best = min(score.values())
        answers = sorted(a for a, v in score.items() if v <= best + 0.25)
        a = answers[self.rng.integers(len(answers))]
        pool = [q for e, q in by_answer[a] if e <= lows[a] + 0.5]
        q = pool[self.rng.integers(len(pool))]
        qa[q, a] += 1
        qt[q] += 1
        fam[a] += 1
        return q, a


def choose_questions(scene: dict, side: int, bal: Balancer, per_family: int = 1) -> list[tuple[str, str, str]]:
    """(family, question, answer): `per_family` per family; a family with nothing (more) to ask (e.g. spatial
    with one object) is replaced by the least-asked family that has something, so the families stay balanced."""
    cands = candidates(scene, side, bal.rng)
    out: list[tuple[str, str, str]] = []
    taken: set[str] = set()
    for fam in FAMILIES * per_family:
        spares = sorted((f for f in FAMILIES if f != fam), key=lambda f: (sum(bal.per_f[f].values()), f))
        for f in [fam, *spares]:
            got = bal.pick(f, cands[f], taken)
            if got:
                out.append((f, *got))
                taken.add(got[0])
                break
    return out


def _where(o: dict, side: int) -> str:
    col, row = min(2, int(3 * o["x"] / side)), min(2, int(3 * o["y"] / side))
    return {(1, 1): "in the center", (0, 1): "on the left", (2, 1): "on the right", (1, 0): "at the top",
            (1, 2): "at the bottom"}.get((col, row), f"at the {('top', '', 'bottom')[row]} {('left', '', 'right')[col]}")


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _tally(values: list[str], noun: str | None) -> str:
    """['circle','circle','square'] -> 'two circles and a square'."""
    parts = []
    for v, n in sorted(Counter(values).items(), key=lambda kv: (-kv[1], kv[0])):
        parts.append(_a(f"{v}{' ' + noun if noun else ''}") if n == 1 else f"{WORDS[n]} {v}{' ' + noun + 's' if noun else 's'}")
    return _join(parts)


def _group(names: list[str]) -> str:
    """['red circle', 'red circle', 'blue square'] -> 'two red circles and a blue square' (order kept)."""
    return _join([_a(v) if k == 1 else f"{WORDS[k]} {v}s" for v, k in Counter(names).items()])


def _full_names(objs: list[dict]) -> list[str]:
    return [f"{o['size']} {o['color']} {o['shape']}" for o in objs]


CAPTION_REL = {"left of": "to the left of", "right of": "to the right of", "above": "above", "below": "below"}


def make_captions(scene: dict, side: int, rng: np.random.Generator) -> list[str]:
    """Four captions naming the objects and their layout, from varied templates. Two list every object in
    order: the first left to right, the second top to bottom, so that both axes are taught by a loss on every
    caption token (a yes/no spatial question gives one bit; docs/shapes-10min.md, section 7)."""
    objs = sorted(scene["objects"], key=lambda o: o["x"])
    bg, n = scene["background"], len(objs)
    full = _full_names(objs)
    short = [f"{o['color']} {o['shape']}" for o in objs]
    if n == 1:
        o = objs[0]
        return [f"{_a(full[0])} {_where(o, side)}", f"one {full[0]} on {_a(bg)} background",
                f"there is one object: {_a(short[0])}", f"{_a(short[0])} alone {_where(o, side)} of the image"]
    caps = [_group(full), "from top to bottom: " + _group(_full_names(sorted(objs, key=lambda o: o["y"])))]
    pairs = [(i, j, r) for i, j in product(range(n), repeat=2) for r in RELATIONS
             if short[i] != short[j] and relation_holds(objs[i], objs[j], r, side)]
    if pairs:
        i, j, rel = pairs[rng.integers(len(pairs))]
        rest = n - 2
        tail = f" on {_a(bg)} background" if not rest else f" and {WORDS[rest]} other object{'s' if rest > 1 else ''}"
        caps.append(f"{_a(short[i])} {CAPTION_REL[rel]} {_a(full[j])}{tail}")
    else:
        caps.append(f"{_tally([o['color'] for o in objs], 'object')} close together")
    if n <= 3:
        caps.append(f"there are {WORDS[n]} objects: " + _join([f"{_a(short[k])} {_where(o, side)}" for k, o in enumerate(objs)]))
    else:
        caps.append(f"there are {WORDS[n]} objects: {_tally([o['color'] for o in objs], 'one')}")
    return caps


# ---------------------------------------------------------------------------------------------------------
# rendering


def render(scene: dict, side: int) -> Image.Image:
    """The scene as an RGB image: background texture, then shapes drawn 4x larger and area-downsampled
    (antialiased edges, no ringing; the background texture comes back unchanged)."""
    rng = np.random.default_rng(scene["texture_seed"])
    base = float(BACKGROUNDS[scene["background"]])
    bg = np.full((side, side), base, np.float32)
    if scene["style"] == "gradient":
        ang = rng.uniform(0, 2 * np.pi)
        yy, xx = np.mgrid[0:side, 0:side] / side - 0.5
        bg += 40 * (np.cos(ang) * xx + np.sin(ang) * yy)
    elif scene["style"] == "noise":
        bg += rng.normal(0, 7, size=(side, side))
    tint = rng.uniform(-6, 6, size=3).astype(np.float32)
    arr = np.clip(bg[..., None] + tint, 0, 255).astype(np.uint8)
    k = SUPERSAMPLE
    img = Image.fromarray(arr, "RGB").resize((side * k, side * k), Image.Resampling.NEAREST)
    draw = ImageDraw.Draw(img)
    for o in scene["objects"]:
        cx, cy, h = o["x"] * k, o["y"] * k, o["d"] * k / 2
        fill = COLORS[o["color"]]
        if o["shape"] == "circle":
            draw.ellipse((cx - h, cy - h, cx + h, cy + h), fill=fill)
        elif o["shape"] == "square":
            draw.rectangle((cx - h, cy - h, cx + h, cy + h), fill=fill)
        elif o["shape"] == "triangle":
            draw.polygon([(cx, cy - h), (cx + h, cy + h), (cx - h, cy + h)], fill=fill)
        else:
            draw.polygon([(cx, cy - h), (cx + h, cy), (cx, cy + h), (cx - h, cy)], fill=fill)
    return img.reduce(k)  # area average of each k x k block: the exact supersampling resolve, 15x faster than LANCZOS


def _render_job(job: tuple[str, dict, int]) -> None:
    path, scene, side = job
    render(scene, side).save(path, format="PNG", optimize=False)


# ---------------------------------------------------------------------------------------------------------
# building a set


def make_scenes(split: str, n: int, side: int, seed: int) -> list[dict]:
    """The scenes of a split; image i's scene depends only on (seed, split, i)."""
    split_no, scenes = list(SPLITS).index(split), []
    for i in range(n):
        scene = make_scene(np.random.default_rng([seed, split_no, i]), side)
        image_id = SPLITS[split] + i + 1
        scene.update(image_id=image_id, file_name=f"COCO_{split}_{image_id:012d}.png")
        scenes.append(scene)
    return scenes


def build_split(split: str, n: int, side: int, seed: int, bar: tqdm | None = None,
                scenes: list[dict] | None = None, per_family: int = 1) -> dict:
    """Scenes, questions and captions of one split (no images)."""
    split_no = list(SPLITS).index(split)
    scenes = make_scenes(split, n, side, seed) if scenes is None else scenes
    bal = Balancer(np.random.default_rng([seed, split_no, 2**32 - 1]))
    qs, caps = [], []
    for i, scene in enumerate(scenes):
        image_id = scene["image_id"]
        for k, (fam, q, a) in enumerate(choose_questions(scene, side, bal, per_family)):
            qs.append(dict(image_id=image_id, question_id=image_id * 100 + k, family=fam, question=q, answer=a))
        for k, c in enumerate(make_captions(scene, side, np.random.default_rng([seed, split_no, i, 1]))):
            caps.append(dict(id=image_id * 10 + k, image_id=image_id, caption=c))
        if bar is not None:
            bar.update()
    return dict(scenes=scenes, questions=qs, captions=caps)


def prior_baselines(train: list[dict], evaluate: list[dict]) -> dict[str, dict]:
    """Accuracy per family of answering from the question alone: the most common train answer of that exact
    question string (else of its family), applied to `evaluate`."""
    by_q: dict[str, Counter] = defaultdict(Counter)
    by_f: dict[str, Counter] = defaultdict(Counter)
    for q in train:
        by_q[q["question"]][q["answer"]] += 1
        by_f[q["family"]][q["answer"]] += 1
    out: dict[str, dict] = {}
    for fam in [*FAMILIES, "all"]:
        rows = [q for q in evaluate if fam in ("all", q["family"])]
        hit = maj = 0
        for q in rows:
            guess = by_q[q["question"]] or by_f[q["family"]]
            hit += bool(guess) and guess.most_common(1)[0][0] == q["answer"]
            maj += bool(by_f[q["family"]]) and by_f[q["family"]].most_common(1)[0][0] == q["answer"]
        n = len(rows)
        out[fam] = dict(questions=n, prior_accuracy=hit / n if n else 0.0, majority_accuracy=maj / n if n else 0.0)
    return out


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj), encoding="utf-8")


def _write_split(out: Path, split: str, data: dict, side: int, seed: int) -> None:
    info = dict(description="vqa built-in Shapes set", version="1.0", seed=seed, image_size=side, year=2024)
    lic = dict(name="CC0 1.0", url="https://creativecommons.org/publicdomain/zero/1.0/")
    questions = [dict(image_id=q["image_id"], question=q["question"], question_id=q["question_id"]) for q in data["questions"]]
    anns = [
        dict(question_type=q["family"], multiple_choice_answer=q["answer"],
             answers=[dict(answer=q["answer"], answer_confidence="yes", answer_id=k + 1) for k in range(10)],
             image_id=q["image_id"], answer_type=ANSWER_TYPES[q["family"]], question_id=q["question_id"])
        for q in data["questions"]
    ]
    _write_json(out / f"v2_OpenEnded_mscoco_{split}_questions.json",
                dict(info=info, task_type="Open-Ended", data_type="mscoco", license=lic, data_subtype=split, questions=questions))
    _write_json(out / f"v2_mscoco_{split}_annotations.json", dict(info=info, license=lic, data_subtype=split, annotations=anns))
    images = [dict(id=s["image_id"], file_name=s["file_name"], height=side, width=side, license=0) for s in data["scenes"]]
    _write_json(out / f"captions_{split}.json",
                dict(info=info, images=images, licenses=[dict(id=0, **lic)], annotations=data["captions"]))
    scenes = [{k: s[k] for k in ("image_id", "file_name", "background", "style", "objects")} for s in data["scenes"]]
    _write_json(out / f"shapes_{split}_scenes.json", dict(info=info, scenes=scenes))


def generate_shapes(
    out_dir: str | Path, n_train: int = 10000, n_val: int = 1000, size: int = 64, seed: int = 0,
    progress: bool = True, workers: int | None = None, questions_per_family: int = 1,
) -> dict:
    """Build the Shapes set in `out_dir`; returns the question-only prior baselines
    {split: {family: {questions, prior_accuracy, majority_accuracy}}}: train scored in-sample, val with the
    priors learned on train. Counts and answer histograms go to `shapes_info.json`."""
    if not 1 <= questions_per_family <= 10:
        raise ConfigError(f"--questions-per-family must be 1..10, not {questions_per_family}")
    if size < 32:
        raise ConfigError(f"--size {size} is too small for Shapes; use 32 px or more")
    if n_train < 1 or n_val < 0 or max(n_train, n_val) >= 1_000_000:
        raise ConfigError(f"need 1 <= --train < 1e6 and 0 <= --val < 1e6 images (got {n_train}, {n_val})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scenes = {s: make_scenes(s, n, size, seed) for s, n in (("train", n_train), ("val", n_val)) if n}
    jobs = []
    for split, sc in scenes.items():
        (out / split).mkdir(exist_ok=True)
        for old in (out / split).glob(f"COCO_{split}_*.png"):
            old.unlink()
        jobs += [(str(out / split / s["file_name"]), s, size) for s in sc]
    workers = workers or min(os.cpu_count() or 1, 8)
    pool = mp.get_context("fork" if hasattr(os, "fork") else "spawn").Pool(workers) if workers > 1 and len(jobs) >= 200 else None
    try:
        rendered = pool.imap_unordered(_render_job, jobs, chunksize=64) if pool else None  # renders meanwhile
        with tqdm(total=len(jobs), desc="questions and captions", unit="img", disable=not progress) as bar:
            data = {s: build_split(s, len(sc), size, seed, bar, scenes=sc, per_family=questions_per_family)
                    for s, sc in scenes.items()}
        for split, d in data.items():
            _write_split(out, split, d, size, seed)
        with tqdm(total=len(jobs), desc="rendering images", unit="img", disable=not progress) as bar:
            for job in rendered if pool else jobs:
                if not pool:
                    _render_job(job)
                bar.update()
    finally:
        if pool:
            pool.terminate()
            pool.join()
    priors = {"train": prior_baselines(data["train"]["questions"], data["train"]["questions"])}
    if "val" in data:
        priors["val"] = prior_baselines(data["train"]["questions"], data["val"]["questions"])
    answers = {s: {f: Counter(q["answer"] for q in d["questions"] if q["family"] == f) for f in FAMILIES} for s, d in data.items()}
    summary = dict(seed=seed, size=size, n_train=n_train, n_val=n_val, priors=priors,
                   answers={s: {f: dict(sorted(c.items())) for f, c in a.items()} for s, a in answers.items()},
                   counts={s: dict(images=len(d["scenes"]), questions=len(d["questions"]), captions=len(d["captions"]))
                           for s, d in data.items()})
    _write_json(out / "shapes_info.json", summary)
    return priors
