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
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..errors import ConfigError
from .shapes_render import render_job
from .shapes_scene import make_scene
from .shapes_text import ANSWER_TYPES, FAMILIES, Balancer, choose_questions, make_captions

SPLITS = {"train": 1_000_000, "val": 2_000_000}  # image id offset per split


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
        rendered = pool.imap_unordered(render_job, jobs, chunksize=64) if pool else None  # renders meanwhile
        with tqdm(total=len(jobs), desc="questions and captions", unit="img", disable=not progress) as bar:
            data = {s: build_split(s, len(sc), size, seed, bar, scenes=sc, per_family=questions_per_family)
                    for s, sc in scenes.items()}
        for split, d in data.items():
            _write_split(out, split, d, size, seed)
        with tqdm(total=len(jobs), desc="rendering images", unit="img", disable=not progress) as bar:
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
    answers = {s: {f: Counter(q["answer"] for q in d["questions"] if q["family"] == f) for f in FAMILIES} for s, d in data.items()}
    summary = dict(seed=seed, size=size, n_train=n_train, n_val=n_val, priors=priors,
                   answers={s: {f: dict(sorted(c.items())) for f, c in a.items()} for s, a in answers.items()},
                   counts={s: dict(images=len(d["scenes"]), questions=len(d["questions"]), captions=len(d["captions"]))
                           for s, d in data.items()})
    _write_json(out / "shapes_info.json", summary)
    return priors
