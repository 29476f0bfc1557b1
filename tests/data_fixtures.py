"""Small data files for the data-layer tests, written field for field like the official formats.

VQA v2 questions: {info, task_type, data_type, license, data_subtype, questions: [{image_id, question,
question_id}]}; annotations: {info, license, data_subtype, annotations: [{question_type,
multiple_choice_answer, answers: [{answer, answer_confidence, answer_id}], image_id, answer_type,
question_id}]}; COCO captions: {info, images: [{id, file_name, height, width, ...}], licenses,
annotations: [{id, image_id, caption}]}. Also the ImageTextDataset the dataset and collate tests build
(`make`, with `CFG`). Import as `from data_fixtures import ...` or `tests.data_fixtures`.
"""

from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from vqa.config import ModelConfig
from vqa.data.dataset import ImageTextDataset
from vqa.data.synthetic.shapes import generate_shapes
from vqa.data.transforms import build_transform

INFO = {"description": "test", "version": "1.0", "year": 2017, "contributor": "t", "date_created": "2017-04-20"}
LICENSE = {"name": "Creative Commons Attribution 4.0 International License", "url": "http://creativecommons.org/licenses/by/4.0/"}


def write_image(path: Path, size: tuple[int, int] = (12, 10), color: tuple[int, int, int] = (200, 30, 30)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    return path


def vqa_questions(split: str, questions: list[tuple[int, int, str]]) -> dict:
    """questions: (question_id, image_id, text)."""
    return {
        "info": INFO, "task_type": "Open-Ended", "data_type": "mscoco", "license": LICENSE, "data_subtype": split,
        "questions": [{"image_id": i, "question": q, "question_id": qid} for qid, i, q in questions],
    }


def vqa_annotations(split: str, answers: dict[int, tuple[int, list[str]]], answer_type: str = "other") -> dict:
    """answers: question_id -> (image_id, 10 answer strings)."""
    anns = []
    for qid, (image_id, ans) in answers.items():
        mc = max(set(ans), key=ans.count) if ans else ""
        anns.append({
            "question_type": "what color is the", "multiple_choice_answer": mc,
            "answers": [{"answer": a, "answer_confidence": "yes", "answer_id": k + 1} for k, a in enumerate(ans)],
            "image_id": image_id, "answer_type": answer_type, "question_id": qid,
        })
    return {"info": INFO, "license": LICENSE, "data_subtype": split, "annotations": anns}


def write_vqa(root: Path, split: str = "train2014", n_images: int = 3, okvqa: bool = False,
              ext: str = ".jpg", skip_annotation: set[int] | None = None,
              missing_images: set[int] | None = None) -> dict:
    """A VQA v2 (or OK-VQA) split: 2 questions per image, images at <split>/COCO_<split>_<id>.<ext>."""
    prefix = "" if okvqa else "v2_"
    qs, ans = [], {}
    for k in range(n_images):
        image_id = 9 + k * 16
        if k not in (missing_images or set()):
            write_image(root / split / f"COCO_{split}_{image_id:012d}{ext}")
        for j, text in enumerate(("what color is the bus?", "how many dogs are there?")):
            qid = image_id * 1000 + j
            qs.append((qid, image_id, text))
            if qid not in (skip_annotation or set()):
                ans[qid] = (image_id, ["red"] * 7 + ["dark red"] * 2 + ["maroon"] if j == 0 else ["2"] * 10)
    (root / f"{prefix}OpenEnded_mscoco_{split}_questions.json").write_text(json.dumps(vqa_questions(split, qs)))
    (root / f"{prefix}mscoco_{split}_annotations.json").write_text(json.dumps(vqa_annotations(split, ans)))
    return {"questions": qs, "answers": ans}


def coco_captions(images: list[tuple[int, str]], captions: list[tuple[int, int, str]]) -> dict:
    """images: (id, file_name); captions: (id, image_id, text)."""
    return {
        "info": INFO,
        "images": [{"license": 3, "file_name": f, "coco_url": "http://x/" + f, "height": 10, "width": 12,
                    "date_captured": "2013-11-14 16:28:13", "flickr_url": "http://y/" + f, "id": i} for i, f in images],
        "licenses": [{"url": LICENSE["url"], "id": 3, "name": LICENSE["name"]}],
        "annotations": [{"image_id": i, "id": cid, "caption": c} for cid, i, c in captions],
    }


def write_coco(root: Path, split: str = "val2014", under_annotations: bool = False, image_dir: str | None = None,
               missing: set[int] | None = None) -> dict:
    images = [(42, f"COCO_{split}_000000000042.jpg"), (73, f"COCO_{split}_000000000073.jpg")]
    caps = [(1, 42, "A man riding a red bus. "), (2, 42, "a bus on a street"), (3, 73, "Two dogs on grass.")]
    for i, f in images:
        if i not in (missing or set()):
            write_image(root / (image_dir or split) / f)
    folder = root / "annotations" if under_annotations else root
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"captions_{split}.json").write_text(json.dumps(coco_captions(images, caps)))
    return {"images": images, "captions": caps}


def write_jsonl(path: Path, rows: list[dict | str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


def build_shapes(out: Path, n_train: int = 16, n_val: int = 8, seed: int = 0, size: int = 64) -> Path:
    generate_shapes(out, n_train=n_train, n_val=n_val, size=size, seed=seed, progress=False, workers=1)
    return out


# the dataset and collate tests' datasets (test_data_dataset.py, test_data_collate.py), made from their `data`
# fixture in conftest.py: (root, train split, tokenizer)
CFG = ModelConfig(vit_image_size=64)  # like the Shapes images


def make(data, **kw):
    _, train, tok = data
    kw.setdefault("transform", build_transform(CFG, train=kw.get("train", True)))
    return ImageTextDataset(train, tok, max_len=kw.pop("max_len", 48), **kw)
