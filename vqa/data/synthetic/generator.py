"""What the built-in synthetic sets (Shapes, Scenes, Glyphs, the corpus) share: the six question families, the
spatial rule and the wording helpers, the answer balancing, the build of a split, the question-only prior
baselines and the writer of the VQA v2 + COCO files.

A set is described by a `SyntheticSet`: how a scene is drawn at random, what can be asked about it, its
captions and its renderer. Everything else is here, so every set comes out in the same layout:
`v2_OpenEnded_mscoco_<split>_questions.json`, `v2_mscoco_<split>_annotations.json` (question_type = family),
`captions_<split>.json`, `<split>/COCO_<split>_<id>.png`, `<prefix>_<split>_scenes.json` (the scene metadata
that the tests recompute every answer from) and `<prefix>_info.json` (counts, answer histograms, priors).
Image i's scene depends only on (seed, split, i); two builds with one seed are byte-identical.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from ...errors import ConfigError
from ...logs import bars_off

FAMILIES = ("attribute_color", "attribute_shape", "existence", "count", "spatial", "comparison")
ANSWER_TYPES = {"attribute_color": "other", "attribute_shape": "other", "existence": "yes/no",
                "count": "number", "spatial": "yes/no", "comparison": "yes/no"}
SPLITS = {"train": 1_000_000, "val": 2_000_000}  # image id offset per split
PARALLEL_FROM = 200  # images: fewer are rendered in this process
MARGIN = 0.10  # spatial relations need centres this far apart (fraction of the side)
NUMBERS = ("zero", "one", "two", "three", "four", "five", "six")  # a scene holds at most six objects


@dataclass(frozen=True)
class SyntheticSet:
    name: str  # in the info block: "vqa built-in <name> set"
    prefix: str  # <prefix>_<split>_scenes.json, <prefix>_info.json
    make_scene: Callable[[np.random.Generator, int], dict]  # (rng, side) -> scene
    candidates: Callable[[dict, int, np.random.Generator], dict[str, list[tuple[str, str]]]]  # per family
    make_captions: Callable[[dict, int, np.random.Generator], list[str]]
    render: Callable[[dict, int], Image.Image]  # (scene, side) -> the picture
    n_answers: dict[str, int]  # answers a family can have (the others: yes / no)
    scene_keys: tuple[str, ...]  # what the scenes file keeps of a scene (besides image_id and file_name)
    # an object's pixel box [left, top, right, bottom], kept on each object for `vqa eval --grounding` (None: none)
    object_box: Callable[[dict], list] | None = None
    # False: a mirrored picture is wrong whatever its texts say (Glyphs); the info file says so and
    # `vqa train --hflip` refuses the folder (`mirror_safe`)
    mirror_safe: bool = True


def relation_holds(a: dict, b: dict, rel: str, side: int) -> bool | None:
    """True/False if `a rel b` (left of, right of, above, below) is clearly true/false (centres apart by the
    margin), None if too close to say."""
    m = MARGIN * side
    d = {"left of": b["x"] - a["x"], "right of": a["x"] - b["x"],
         "above": b["y"] - a["y"], "below": a["y"] - b["y"]}[rel]
    return True if d >= m else False if d <= -m else None


def kind_and_colour(rng: np.random.Generator, objs: list[dict], kinds: tuple[str, ...], colours: tuple[str, ...],
                    repeat: float, key: str = "kind") -> tuple[str, str]:
    """A new object's kind (its `key`) and colour at random; each, with chance `repeat`, copied from an earlier
    object (larger counts, and names that need more than one word)."""
    kind, colour = kinds[rng.integers(len(kinds))], colours[rng.integers(len(colours))]
    if objs and rng.random() < repeat:
        kind = objs[rng.integers(len(objs))][key]
    if objs and rng.random() < repeat:
        colour = objs[rng.integers(len(objs))]["color"]
    return kind, colour


def article(phrase: str) -> str:
    return ("an " if phrase[0] in "aeiou" else "a ") + phrase


def join(parts: list[str]) -> str:
    """'a, b and c'."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def by_count(values: Iterable[str]) -> list[tuple[str, int]]:
    """(value, count), the most common first, ties in alphabetical order."""
    return sorted(Counter(values).items(), key=lambda kv: (-kv[1], kv[0]))


def tally(values: Iterable[str], plural: Callable[[str], str]) -> str:
    """'two stars and a ring': how many of each value, the most common first."""
    return join([article(v) if n == 1 else f"{NUMBERS[n]} {plural(v)}" for v, n in by_count(values)])


def spatial(objs: list[dict], names: list[list], relations: dict[str, str], side: int, rng: np.random.Generator,
            wording: Callable[[str, object, object], str]) -> list[tuple[str, str]]:
    """Spatial (question, answer)s: per ordered pair of objects with names and per relation ({ours: the
    `relation_holds` one}) that clearly holds or fails, a random name of each, worded by `wording(rel, a, b)`."""
    out = []
    for i, j in product(range(len(objs)), repeat=2):
        if i == j or not names[i] or not names[j]:
            continue
        for rel, same in relations.items():
            holds = relation_holds(objs[i], objs[j], same, side)
            if holds is not None:
                a, b = names[i][rng.integers(len(names[i]))], names[j][rng.integers(len(names[j]))]
                out.append((wording(rel, a, b), "yes" if holds else "no"))
    return out


def comparisons(wordings: dict[tuple, list[tuple[str, str]]], count: Counter, pick: Iterator[int]) -> list:
    """Comparison (question, answer)s: per pair of descriptions, the wording `pick` chooses ((question, op),
    op one of > < =); "as many" is skipped when neither is there (true, but it says nothing)."""
    out = []
    for (x, y), options in wordings.items():
        q, op = options[next(pick) % len(options)]
        nx, ny = count[x], count[y]
        if op != "=" or nx + ny:
            out.append((q, "yes" if (nx > ny if op == ">" else nx < ny if op == "<" else nx == ny) else "no"))
    return out


def unique_relations(objs: list[dict], names: list[str], relations: dict[str, str], side: int) -> list[tuple]:
    """(i, j, rel) for every relation that clearly holds between two objects whose names are unique."""
    return [(i, j, rel) for i, j in product(range(len(objs)), repeat=2) for rel, same in relations.items()
            if i != j and names.count(names[i]) == 1 and names.count(names[j]) == 1
            and relation_holds(objs[i], objs[j], same, side)]


class Balancer:
    """Picks questions so answers stay near uniform per family and per question string.

    First the answer: among those the scene allows, the one whose family share and best per-string surplus
    are lowest; then a question string with that answer whose own answer counts need it most."""

    def __init__(self, rng: np.random.Generator, n_answers: dict[str, int], alpha: float = 2.0):
        self.rng, self.n_answers, self.alpha = rng, n_answers, alpha
        self.per_qa: Counter = Counter()  # (question, answer) -> times asked
        self.per_q: Counter = Counter()
        self.per_f: dict[str, Counter] = defaultdict(Counter)

    def pick(self, family: str, cands: list[tuple[str, str]], taken: set[str]) -> tuple[str, str] | None:
        inv_k = 1.0 / self.n_answers.get(family, 2)
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


def pick_questions(
    cands: dict[str, list[tuple[str, str]]], bal: Balancer, per_family: int = 1,
) -> list[tuple[str, str, str]]:
    """(family, question, answer): `per_family` per family; a family with nothing (more) to ask (e.g. spatial
    with one object) is replaced by the least-asked family that has something, so the families stay balanced."""
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


def make_scenes(spec: SyntheticSet, split: str, n: int, side: int, seed: int) -> list[dict]:
    """The scenes of a split; image i's scene depends only on (seed, split, i)."""
    split_no, scenes = list(SPLITS).index(split), []
    for i in range(n):
        scene = spec.make_scene(np.random.default_rng([seed, split_no, i]), side)
        if spec.object_box is not None:
            for o in scene["objects"]:
                o["box"] = spec.object_box(o)
        image_id = SPLITS[split] + i + 1
        scene.update(image_id=image_id, file_name=f"COCO_{split}_{image_id:012d}.png")
        scenes.append(scene)
    return scenes


def render_job(job: tuple[Callable[[dict, int], Image.Image], str, dict, int]) -> None:
    """(render, path, scene, side): draws the scene and writes its PNG (in a worker process)."""
    render, path, scene, side = job
    render(scene, side).save(path, format="PNG", optimize=False)


def build_split(spec: SyntheticSet, split: str, n: int, side: int, seed: int, bar: tqdm | None = None,
                scenes: list[dict] | None = None, per_family: int = 1) -> dict:
    """Scenes, questions and captions of one split (no images)."""
    split_no = list(SPLITS).index(split)
    scenes = make_scenes(spec, split, n, side, seed) if scenes is None else scenes
    bal = Balancer(np.random.default_rng([seed, split_no, 2**32 - 1]), spec.n_answers)
    qs, caps = [], []
    for i, scene in enumerate(scenes):
        image_id = scene["image_id"]
        chosen = pick_questions(spec.candidates(scene, side, bal.rng), bal, per_family)
        for k, (fam, q, a) in enumerate(chosen):
            qs.append(dict(image_id=image_id, question_id=image_id * 100 + k, family=fam, question=q, answer=a))
        for k, c in enumerate(spec.make_captions(scene, side, np.random.default_rng([seed, split_no, i, 1]))):
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


def write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj), encoding="utf-8")


def write_split(spec: SyntheticSet, out: Path, split: str, data: dict, side: int, seed: int) -> None:
    """One split's questions, annotations (10 identical answers each), captions and scene metadata."""
    info = dict(description=f"vqa built-in {spec.name} set", version="1.0", seed=seed, image_size=side, year=2024)
    lic = dict(name="CC0 1.0", url="https://creativecommons.org/publicdomain/zero/1.0/")
    questions = [dict(image_id=q["image_id"], question=q["question"], question_id=q["question_id"])
                 for q in data["questions"]]
    anns = [
        dict(question_type=q["family"], multiple_choice_answer=q["answer"],
             answers=[dict(answer=q["answer"], answer_confidence="yes", answer_id=k + 1) for k in range(10)],
             image_id=q["image_id"], answer_type=ANSWER_TYPES[q["family"]], question_id=q["question_id"])
        for q in data["questions"]
    ]
    write_json(out / f"v2_OpenEnded_mscoco_{split}_questions.json",
               dict(info=info, task_type="Open-Ended", data_type="mscoco", license=lic, data_subtype=split,
                    questions=questions))
    write_json(out / f"v2_mscoco_{split}_annotations.json",
               dict(info=info, license=lic, data_subtype=split, annotations=anns))
    images = [dict(id=s["image_id"], file_name=s["file_name"], height=side, width=side, license=0)
              for s in data["scenes"]]
    write_json(out / f"captions_{split}.json",
               dict(info=info, images=images, licenses=[dict(id=0, **lic)], annotations=data["captions"]))
    scenes = [{k: s[k] for k in ("image_id", "file_name", *spec.scene_keys)} for s in data["scenes"]]
    write_json(out / f"{spec.prefix}_{split}_scenes.json", dict(info=info, scenes=scenes))


def mirror_safe(folder: str | Path) -> bool:
    """False when `folder` holds a built-in set whose pictures must never be mirrored (its `<prefix>_info.json`
    says "mirror_safe": false); True for every other folder, shard pattern or URL."""
    if "://" in str(folder) or str(folder).startswith("pipe:") or not Path(folder).is_dir():
        return True
    for info in Path(folder).glob("*_info.json"):
        try:
            if json.loads(info.read_text(encoding="utf-8")).get("mirror_safe") is False:
                return False
        except (OSError, ValueError, AttributeError):
            continue  # not one of ours
    return True


def generate(
    spec: SyntheticSet, out_dir: str | Path, n_train: int = 10000, n_val: int = 1000, size: int = 64, seed: int = 0,
    progress: bool = True, workers: int | None = None, questions_per_family: int = 1,
) -> dict:
    """Build the set in `out_dir`; returns the question-only prior baselines
    {split: {family: {questions, prior_accuracy, majority_accuracy}}}: train scored in-sample, val with the
    priors learned on train. Counts and answer histograms go to `<prefix>_info.json`. Images are rendered by
    `workers` processes (default: CPU count, max 8) while the questions are built, from PARALLEL_FROM images."""
    if not 1 <= questions_per_family <= 10:
        raise ConfigError(f"--questions-per-family must be 1..10, not {questions_per_family}")
    if size < 32:
        raise ConfigError(f"--size {size} is too small for {spec.name}; use 32 px or more")
    if n_train < 1 or n_val < 0 or max(n_train, n_val) >= 1_000_000:
        raise ConfigError(f"need 1 <= --train < 1e6 and 0 <= --val < 1e6 images (got {n_train}, {n_val})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scenes = {s: make_scenes(spec, s, n, size, seed) for s, n in (("train", n_train), ("val", n_val)) if n}
    jobs = []
    for split, sc in scenes.items():
        (out / split).mkdir(exist_ok=True)
        for old in (out / split).glob(f"COCO_{split}_*.png"):
            old.unlink()
        jobs += [(spec.render, str(out / split / s["file_name"]), s, size) for s in sc]
    workers = workers or min(os.cpu_count() or 1, 8)
    use_pool = workers > 1 and len(jobs) >= PARALLEL_FROM
    pool = mp.get_context("fork" if hasattr(os, "fork") else "spawn").Pool(workers) if use_pool else None
    try:
        rendered = pool.imap_unordered(render_job, jobs, chunksize=64) if pool else None  # renders meanwhile
        with tqdm(total=len(jobs), desc="questions and captions", unit="img",
                  disable=True if not progress else bars_off()) as bar:
            data = {s: build_split(spec, s, len(sc), size, seed, bar, scenes=sc, per_family=questions_per_family)
                    for s, sc in scenes.items()}
        for split, d in data.items():
            write_split(spec, out, split, d, size, seed)
        with tqdm(total=len(jobs), desc="rendering images", unit="img",
                  disable=True if not progress else bars_off()) as bar:
            for job in rendered if pool else jobs:
                if not pool:
                    render_job(job)
                bar.update()
    finally:
        if pool:
            pool.terminate()
            pool.join()
    priors = {"train": prior_baselines(data["train"]["questions"], data["train"]["questions"])}
    if "val" in data:
        priors["val"] = prior_baselines(data["train"]["questions"], data["val"]["questions"])
    answers = {s: {f: Counter(q["answer"] for q in d["questions"] if q["family"] == f) for f in FAMILIES}
               for s, d in data.items()}
    summary = dict(seed=seed, size=size, n_train=n_train, n_val=n_val, priors=priors,
                   answers={s: {f: dict(sorted(c.items())) for f, c in a.items()} for s, a in answers.items()},
                   counts={s: dict(images=len(d["scenes"]), questions=len(d["questions"]), captions=len(d["captions"]))
                           for s, d in data.items()})
    if not spec.mirror_safe:  # only then: the other sets' info files stay as they were
        summary["mirror_safe"] = False
    write_json(out / f"{spec.prefix}_info.json", summary)
    return priors
