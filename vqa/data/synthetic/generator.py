"""What the built-in synthetic sets (Shapes, Scenes, Glyphs, the corpus) share: the six question families, the
answer balancing, the build of a split, the question-only prior baselines and the writer of the VQA v2 + COCO
files.

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ...errors import ConfigError
from ...logs import bars_off

FAMILIES = ("attribute_color", "attribute_shape", "existence", "count", "spatial", "comparison")
ANSWER_TYPES = {"attribute_color": "other", "attribute_shape": "other", "existence": "yes/no",
                "count": "number", "spatial": "yes/no", "comparison": "yes/no"}
SPLITS = {"train": 1_000_000, "val": 2_000_000}  # image id offset per split
PARALLEL_FROM = 200  # images: fewer are rendered in this process


@dataclass(frozen=True)
class SyntheticSet:
    name: str  # in the info block: "vqa built-in <name> set"
    prefix: str  # <prefix>_<split>_scenes.json, <prefix>_info.json
    make_scene: Callable[[np.random.Generator, int], dict]  # (rng, side) -> scene
    candidates: Callable[[dict, int, np.random.Generator], dict[str, list[tuple[str, str]]]]  # per family
    make_captions: Callable[[dict, int, np.random.Generator], list[str]]
    render_job: Callable[[tuple[str, dict, int]], None]  # (path, scene, side): writes the PNG
    n_answers: dict[str, int]  # answers a family can have (the others: yes / no)
    scene_keys: tuple[str, ...]  # what the scenes file keeps of a scene (besides image_id and file_name)
    # an object's pixel box [left, top, right, bottom], kept on each object for `vqa eval --grounding` (None: none)
    object_box: Callable[[dict], list] | None = None
    # False: a mirrored picture is wrong whatever its texts say (Glyphs); the info file says so and
    # `vqa train --hflip` refuses the folder (`mirror_safe`)
    mirror_safe: bool = True


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


def check_sizes(spec: SyntheticSet, n_train: int, n_val: int, size: int, per_family: int) -> None:
    if not 1 <= per_family <= 10:
        raise ConfigError(f"--questions-per-family must be 1..10, not {per_family}")
    if size < 32:
        raise ConfigError(f"--size {size} is too small for {spec.name}; use 32 px or more")
    if n_train < 1 or n_val < 0 or max(n_train, n_val) >= 1_000_000:
        raise ConfigError(f"need 1 <= --train < 1e6 and 0 <= --val < 1e6 images (got {n_train}, {n_val})")


def generate(
    spec: SyntheticSet, out_dir: str | Path, n_train: int, n_val: int, size: int, seed: int,
    progress: bool = True, workers: int | None = None, questions_per_family: int = 1,
) -> dict:
    """Build the set in `out_dir`; returns the question-only prior baselines
    {split: {family: {questions, prior_accuracy, majority_accuracy}}}: train scored in-sample, val with the
    priors learned on train. Counts and answer histograms go to `<prefix>_info.json`. Images are rendered by
    `workers` processes (default: CPU count, max 8) while the questions are built, from PARALLEL_FROM images."""
    check_sizes(spec, n_train, n_val, size, questions_per_family)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scenes = {s: make_scenes(spec, s, n, size, seed) for s, n in (("train", n_train), ("val", n_val)) if n}
    jobs = []
    for split, sc in scenes.items():
        (out / split).mkdir(exist_ok=True)
        for old in (out / split).glob(f"COCO_{split}_*.png"):
            old.unlink()
        jobs += [(str(out / split / s["file_name"]), s, size) for s in sc]
    workers = workers or min(os.cpu_count() or 1, 8)
    use_pool = workers > 1 and len(jobs) >= PARALLEL_FROM
    pool = mp.get_context("fork" if hasattr(os, "fork") else "spawn").Pool(workers) if use_pool else None
    try:
        rendered = pool.imap_unordered(spec.render_job, jobs, chunksize=64) if pool else None  # renders meanwhile
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
                    spec.render_job(job)
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
