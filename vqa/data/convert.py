"""`vqa data convert SRC --to webdataset|parquet OUT`: any supported data set as shards, one folder per split.

webdataset: `OUT/<split>/00000.tar` ... written with webdataset's TarWriter in img2dataset's layout: per image
`KEY.<jpg|png>` (the original file's bytes, never re-encoded) and `KEY.json` = {"image_id", "qa": [{"question",
"answers", "question_id", "answer_type", "question_type", "multiple_choice_answer"}], "captions",
"caption_ids"}, and beside each tar img2dataset's `00000_stats.json` ({"successes": n}), which is the
sample count the reader deals epochs with. parquet: `OUT/<split>/00000.parquet` with the same fields as
columns and the image as a `datasets` Image column ({"bytes", "path"}), schema from `datasets.Features`, so
`datasets.load_dataset("parquet", data_dir=OUT/<split>)` reads it too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..errors import DataError
from .readers.shards import Sample, ShardSplit, _needs
from .split import SplitData

FORMATS = ("webdataset", "parquet")


def folder_samples(split_data: SplitData) -> Iterator[Sample]:
    """A folder split as samples: one per image, with all its questions and captions (file order)."""
    vqa, caps = split_data.vqa, split_data.captions
    n_all = len(split_data.image_files)
    q_order, c_order = np.argsort(vqa.image, kind="stable"), np.argsort(caps.image, kind="stable")
    q_start = np.concatenate([[0], np.cumsum(np.bincount(vqa.image, minlength=n_all))])
    c_start = np.concatenate([[0], np.cumsum(np.bincount(caps.image, minlength=n_all))])
    k = 0
    for j in range(n_all):
        qs = q_order[q_start[j] : q_start[j + 1]].tolist()
        cs = c_order[c_start[j] : c_start[j + 1]].tolist()
        if not qs and not cs:
            continue
        path = Path(split_data.image_files.paths[j])
        try:
            data = path.read_bytes()
        except OSError as e:
            raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
        qa = []
        for i in qs:
            r = vqa[i]
            qa.append(dict(question=r.question, answers=r.answers, question_id=r.question_id,
                           answer_type=r.answer_type, question_type=r.question_type,
                           multiple_choice_answer=r.multiple_choice_answer))
        image_id = vqa[qs[0]].image_id if qs else caps[cs[0]].image_id
        ext = path.suffix.lower().lstrip(".") or "jpg"
        yield Sample(shard=str(path), key=f"{k:09d}", offset=k, image=data, ext="jpg" if ext == "jpeg" else ext,
                     qa=qa, captions=[caps.caption[i] for i in cs], image_id=image_id,
                     caption_ids=[caps[i].caption_id for i in cs])
        k += 1


def _meta(s: Sample) -> dict:
    return dict(image_id=s.image_id, qa=s.qa, captions=s.captions, caption_ids=s.caption_ids)


def write_webdataset(samples: Iterator[Sample], out: Path, shard_size: int) -> tuple[int, int]:
    wds = _needs("webdataset")
    out.mkdir(parents=True, exist_ok=True)
    n = shards = 0
    writer, count = None, 0

    def close():
        nonlocal writer
        if writer is not None:
            writer.close()
            (out / f"{shards - 1:05d}_stats.json").write_text(json.dumps(dict(count=count, successes=count)) + "\n")
            writer = None

    for s in samples:
        if writer is None or count == shard_size:
            close()
            writer, count = wds.TarWriter(str(out / f"{shards:05d}.tar")), 0
            shards += 1
        writer.write({"__key__": s.key, s.ext: s.image, "json": json.dumps(_meta(s)).encode()})
        count += 1
        n += 1
    close()
    return n, shards


def _id_types(src) -> tuple[str, str, str]:
    """Parquet column types of question, image and caption ids: int64 when every id of the split is an int
    (VQA v2, COCO, Shapes), else string; known before the first row is written, from the tables' columns."""
    if isinstance(src, ShardSplit):
        return "string", "string", "string"
    ints = lambda col: isinstance(col, np.ndarray)  # noqa: E731  (records.Ids: int64 arrays while all ints)
    image = ints(src.vqa.image_id) and ints(src.captions.image_id)
    return ("int64" if ints(src.vqa.question_id) else "string", "int64" if image else "string",
            "int64" if ints(src.captions.caption_id) else "string")


def write_parquet(samples: Iterator[Sample], out: Path, shard_size: int, id_types: tuple[str, str, str],
                  row_group: int = 256) -> tuple[int, int]:
    _needs("pyarrow")
    _needs("datasets")
    import itertools

    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Features, Image, List, Value

    out.mkdir(parents=True, exist_ok=True)
    qt, it, ct = id_types
    conv = {"int64": lambda v: v, "string": lambda v: None if v is None else str(v)}
    features = Features({
        "key": Value("string"), "image": Image(), "image_id": Value(it),
        "qa": List({"question": Value("string"), "answers": List(Value("string")), "question_id": Value(qt),
                    "answer_type": Value("string"), "question_type": Value("string"),
                    "multiple_choice_answer": Value("string")}),
        "captions": List(Value("string")), "caption_ids": List(Value(ct)),
    })
    schema = features.arrow_schema
    n = shards = 0
    samples = iter(samples)
    while True:
        chunk = list(itertools.islice(samples, shard_size))
        if not chunk:
            break
        rows = []
        for s in chunk:
            qa = [dict(question=q["question"], answers=q["answers"], question_id=conv[qt](q.get("question_id")),
                       answer_type=q.get("answer_type", ""), question_type=q.get("question_type", ""),
                       multiple_choice_answer=q.get("multiple_choice_answer", "")) for q in s.qa]
            rows.append(dict(key=s.key, image=dict(bytes=s.image, path=f"{s.key}.{s.ext}"),
                             image_id=conv[it](s.image_id), qa=qa, captions=s.captions,
                             caption_ids=[conv[ct](c) for c in s.caption_ids]))
        with pq.ParquetWriter(str(out / f"{shards:05d}.parquet"), schema) as w:
            for r0 in range(0, len(rows), row_group):
                w.write_table(pa.Table.from_pylist(rows[r0 : r0 + row_group], schema=schema))
        shards += 1
        n += len(chunk)
    return n, shards


def good_samples(split: ShardSplit) -> Iterator[Sample]:
    for s in split.iter_all():
        if s.bad:
            print(f"vqa data convert: skipped {s.where}: {s.bad}", file=sys.stderr)
            continue
        yield s


def convert(src, split: str, to: str, out: Path, shard_size: int = 1000) -> tuple[int, int]:
    """Write split `split` of `src` (a SplitData or ShardSplit) to `out` (its split folder) as `to` shards.
    Returns (samples, shards)."""
    if to not in FORMATS:
        raise DataError(f"--to {to!r}: choose {' or '.join(FORMATS)}")
    samples = good_samples(src) if isinstance(src, ShardSplit) else folder_samples(src)
    if to == "webdataset":
        return write_webdataset(samples, out, shard_size)
    return write_parquet(samples, out, shard_size, _id_types(src))


__all__ = ["convert", "folder_samples", "write_webdataset", "write_parquet", "FORMATS"]
