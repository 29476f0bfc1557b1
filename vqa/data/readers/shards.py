"""Streamed sources: webdataset tar shards (img2dataset's layout) and parquet shards (Hugging Face's).

A tar shard holds samples as files sharing a key: `KEY.jpg` (or .png / .jpeg / .webp) with `KEY.txt` (a
caption) and / or `KEY.json`: `{"question", "answers"}`, or `{"qa": [{"question", "answers"}, ...]}` for
several questions about one image, and / or `"caption"` / `"captions"`. Tars are read by the `webdataset`
library (`tarfile_samples`, which also opens `https://` and `pipe:` URLs). A parquet shard has one row per
sample with an image column (the `datasets` Image feature: {"bytes", "path"}) and the same fields as
columns; it is read with pyarrow, row group by row group, and its schema with `datasets.Features`.

How a streamed epoch is dealt (`vqa.data.stream.ShardStream`): every shard's sample count is known up front
(img2dataset's `NNNNN_stats.json`, parquet metadata, or a scan of a local tar), so an epoch is a fixed sequence: the
shards in a seeded order of the epoch, their samples in file order. It is cut into equal contiguous ranges, one
per (rank, DataLoader worker) stream, each a whole number of batches, so every rank runs the same number of
steps (DDP needs it) and every sample is read once per epoch by one stream (the remainder, fewer than
streams x batch x accum samples, is left out; which ones changes with the epoch's shard order). A stream
shuffles within blocks of `block` consecutive samples (a seeded permutation per block, like a shuffle
buffer of that size, but replayable). A resumed run restarts each stream at its saved output position: the
block it was in is read again and its permutation continues where it stopped, so with the same ranks,
workers and batch size nothing is seen again and nothing is skipped.

Bad samples (an undecodable image, a json without a question or a caption) are counted and reported with
their shard and key; the sample's slot is kept (an item without rows) so that every rank still runs the same
number of steps. A truncated or unreadable tar stops with an error naming the shard.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import DataError, InputError
from ..records import CaptionRecord, VQARecord

IMAGE_KEYS = ("jpg", "jpeg", "png", "webp")
SHARD_EXTS = (".tar", ".parquet")


def _needs(module: str):
    try:
        return __import__(module)
    except ImportError:
        raise DataError(f"reading or writing shards needs the '{module}' package: pip install 'vqa[shards]'") from None


def is_url(s: str) -> bool:
    return "://" in s or s.startswith("pipe:")


# ---------------------------------------------------------------------------------------------------------
# samples


@dataclass
class Sample:
    """One image with its records. `bad` names what was wrong with it (then it trains as an empty item)."""

    shard: str
    key: str
    offset: int  # position in its shard
    image: bytes | None = None
    ext: str = "jpg"
    qa: list[dict] = field(default_factory=list)  # {"question", "answers", and optional ids and types}
    captions: list[str] = field(default_factory=list)
    image_id: Any = None
    caption_ids: list = field(default_factory=list)
    bad: str | None = None

    @property
    def where(self) -> str:
        return f"{self.shard}: sample {self.key!r}"

    def records(self) -> tuple[list[VQARecord], list[CaptionRecord]]:
        label = Path(f"{self.shard}#{self.key}")
        image_id = self.key if self.image_id is None else self.image_id
        qs = [VQARecord(image=label, question=q["question"], answers=list(q["answers"]),
                        question_id=q.get("question_id", f"{self.key}:{k}"), image_id=image_id,
                        answer_type=str(q.get("answer_type") or ""), question_type=str(q.get("question_type") or ""),
                        multiple_choice_answer=str(q.get("multiple_choice_answer") or "") or _most_common(q["answers"]))
              for k, q in enumerate(self.qa)]
        ids = self.caption_ids if len(self.caption_ids) == len(self.captions) else [None] * len(self.captions)
        caps = [CaptionRecord(label, c, image_id, i if i is not None else f"{self.key}:c{k}")
                for k, (c, i) in enumerate(zip(self.captions, ids, strict=True))]
        return qs, caps


def _most_common(answers: list[str]) -> str:
    real = [a for a in answers if a]
    return max(dict.fromkeys(real), key=real.count) if real else ""


def _answers(v: Any) -> list[str] | None:
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v:
        return None
    out = []
    for a in v:
        a = a.get("answer") if isinstance(a, dict) else a
        if not isinstance(a, str):
            return None
        out.append(a.strip())
    return out if any(out) else None


def parse_fields(s: Sample, meta: dict, caption_txt: str | None = None) -> Sample:
    """Fill `s.qa` / `s.captions` from a sample's json (or parquet row) and txt; mark it bad if neither gives
    a question with answers nor a caption."""
    qa = meta.get("qa")
    items = qa if isinstance(qa, list) else ([meta] if "question" in meta else [])
    for k, q in enumerate(items):
        question = q.get("question") if isinstance(q, dict) else None
        answers = _answers(q.get("answers", q.get("answer"))) if isinstance(q, dict) else None
        if not isinstance(question, str) or not question.strip() or answers is None:
            s.bad = f"question {k} has no question text or no answers"
            return s
        keep = {f: q[f] for f in ("question_id", "answer_type", "question_type", "multiple_choice_answer")
                if q.get(f) is not None}
        s.qa.append(dict(question=" ".join(question.split()), answers=answers, **keep))
    caps = meta.get("captions", meta.get("caption"))
    caps = [caps] if isinstance(caps, str) else (caps if isinstance(caps, list) else [])
    if caption_txt is not None:
        caps = [caption_txt, *caps]
    s.captions = [c for c in dict.fromkeys(" ".join(str(c).split()) for c in caps if isinstance(c, str)) if c]
    ids = meta.get("caption_ids")
    s.caption_ids = list(ids) if isinstance(ids, list) and len(ids) == len(s.captions) else []
    s.image_id = meta.get("image_id")
    if not s.qa and not s.captions:
        s.bad = "no question or caption (expected KEY.txt, or KEY.json with question/answers, qa or caption)"
    return s


# ---------------------------------------------------------------------------------------------------------
# shards


@dataclass
class Shard:
    url: str  # a local path or a URL webdataset opens
    kind: str  # "tar" or "parquet"
    n: int  # samples
    groups: tuple[int, ...] = ()  # a parquet shard's row groups' sizes: where a reader can start without reading


def _stats_count(url: str) -> int | None:
    """img2dataset's (and `vqa data convert`'s) NNNNN_stats.json beside a tar: its 'successes'."""
    stats = url[: -len(".tar")] + "_stats.json"
    try:
        if is_url(url):
            from webdataset import gopen

            with gopen.gopen(stats) as f:
                data = json.loads(f.read())
        elif os.path.isfile(stats):
            data = json.loads(Path(stats).read_text())
        else:
            return None
        return int(data["successes"])
    except Exception:  # a stats file we cannot read is no index: count the samples instead
        return None


def _count(url: str) -> Shard:
    if url.endswith(".parquet"):
        _needs("pyarrow")
        import pyarrow.parquet as pq

        try:
            meta = pq.ParquetFile(url).metadata
        except Exception as e:
            raise DataError(f"{url}: not a readable parquet file ({e})") from None
        groups = tuple(meta.row_group(g).num_rows for g in range(meta.num_row_groups))
        return Shard(url, "parquet", int(meta.num_rows), groups)
    n = _stats_count(url)
    return Shard(url, "tar", n if n is not None else sum(1 for _ in _tar_groups(url)))


@dataclass
class ShardSplit:
    """A split made of shards: what `open_split` gives for a shard folder or pattern."""

    name: str
    where: str
    shards: list[Shard]

    @classmethod
    def from_urls(cls, name: str, where: str, urls: list[str]) -> ShardSplit:
        if not urls:
            raise DataError(f"{where}: no shards (.tar or .parquet) found")
        missing = [u for u in urls if not is_url(u) and not os.path.isfile(u)]
        if missing:
            raise DataError(f"{where}: shard {missing[0]} does not exist" + (
                f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        return cls(name, where, [_count(u) for u in urls])

    @classmethod
    def from_folder(cls, name: str, folder: Path) -> ShardSplit:
        urls = sorted(str(p) for p in folder.iterdir() if p.suffix in SHARD_EXTS and p.is_file())
        return cls.from_urls(name, str(folder), urls)

    @classmethod
    def from_pattern(cls, name: str, pattern: str) -> ShardSplit:
        wds = _needs("webdataset")
        urls = wds.shardlists.expand_urls(pattern)
        if not urls or urls == [""]:
            raise DataError(f"{pattern!r}: the pattern names no shards")
        return cls.from_urls(name, pattern, urls)

    def __len__(self) -> int:
        return sum(s.n for s in self.shards)

    @property
    def kind(self) -> str:
        kinds = {s.kind for s in self.shards}
        return kinds.pop() if len(kinds) == 1 else "mixed"

    def report(self) -> str:
        first, last = self.shards[0].url, self.shards[-1].url
        span = first if len(self.shards) == 1 else f"{first} ... {last}"
        return f"{self.name}: {len(self)} samples in {len(self.shards)} {self.kind} shards ({span})"

    def samples(self, shard: int, start: int = 0, images: bool = True) -> Iterator[Sample]:
        """Samples of shard number `shard` from position `start` on (earlier ones read and dropped unparsed).
        `images=False`: a parquet shard's image column is not read (the samples' `image` is None)."""
        s = self.shards[shard]
        it = _read_parquet(s, start, images) if s.kind == "parquet" else _read_tar(s, start)
        n = start
        for sample in it:
            n += 1
            yield sample
        if n < s.n:
            raise DataError(f"{s.url}: {n} samples, where its index says {s.n} (a truncated shard, or a stale "
                            "NNNNN_stats.json beside it)")

    def iter_all(self) -> Iterator[Sample]:
        for j in range(len(self.shards)):
            yield from self.samples(j)


def _tar_groups(url: str) -> Iterator[dict]:
    """webdataset's grouping of a tar's files by key; an unreadable or truncated tar -> DataError naming it."""
    wds = _needs("webdataset")
    try:
        yield from wds.tariterators.tarfile_samples([dict(url=url)])
    except (tarfile.TarError, OSError, EOFError, ValueError) as e:
        msg = str(e.args[0]) if e.args else type(e).__name__
        raise DataError(f"{url}: truncated or unreadable tar shard ({msg.split(' @ ')[0]})") from None


def _read_tar(shard: Shard, start: int) -> Iterator[Sample]:
    for k, raw in enumerate(_tar_groups(shard.url)):
        if k < start:
            continue
        key = raw["__key__"]
        s = Sample(shard.url, key, k)
        ext = next((e for e in IMAGE_KEYS if e in raw), None)
        meta: dict = {}
        if "json" in raw:
            try:
                meta = json.loads(raw["json"])
                if not isinstance(meta, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                s.bad = f"KEY.json is not a JSON object ({e})"
                yield s
                continue
        txt = raw["txt"].decode("utf-8", "replace") if "txt" in raw else None
        parse_fields(s, meta, txt)
        if ext is None and not s.bad:
            s.bad = f"no image (expected one of {', '.join('KEY.' + e for e in IMAGE_KEYS)})"
        if ext is not None:
            s.image, s.ext = raw[ext], ext
        yield s


def _image_column(schema) -> str | None:
    try:
        from datasets import Features, Image

        feats = Features.from_arrow_schema(schema)
        found = [k for k, v in feats.items() if isinstance(v, Image)]
        if found:
            return found[0]
    except Exception:  # no datasets metadata in the file: go by name
        pass
    return next((c for c in ("image", "img", "jpg", "png") if c in schema.names), None)


def _read_parquet(shard: Shard, start: int, images: bool = True) -> Iterator[Sample]:
    import pyarrow.parquet as pq

    f = pq.ParquetFile(shard.url)
    col = _image_column(f.schema_arrow)
    columns = None if images else [c for c in f.schema_arrow.names if c != col]
    # the first row group that holds `start`: earlier ones are never read
    row, groups = 0, []
    for g in range(f.metadata.num_row_groups):
        n = f.metadata.row_group(g).num_rows
        if row + n > start or groups:
            groups.append(g)
        else:
            row += n
    if not groups:
        return
    k = row
    for batch in f.iter_batches(batch_size=64, row_groups=groups, columns=columns):
        for r in batch.to_pylist():
            if k < start:
                k += 1
                continue
            # with the shard's name: rows of two shards differ
            key = str(r.get("key") or r.get("__key__") or f"{Path(shard.url).stem}/{k:09d}")
            s = Sample(shard.url, key, k)
            img = r.get(col) if col else None
            if isinstance(img, dict):
                data = img.get("bytes")
                if data is None and img.get("path"):
                    p = Path(img["path"])
                    p = p if p.is_absolute() else Path(shard.url).parent / p
                    data = p.read_bytes() if p.is_file() else None
                img = data
            parse_fields(s, r)
            if not isinstance(img, (bytes, bytearray)) and not s.bad and images:
                s.bad = f"no image bytes in column {col or 'image'!r}"
            s.image = bytes(img) if isinstance(img, (bytes, bytearray)) else None
            k += 1
            yield s


def shard_texts(split: ShardSplit, limit: int = 200_000, batch: int = 4096) -> Iterator[list[str]]:
    """Tokenizer training text from the first `limit` samples (questions, distinct answers, captions)."""
    out: list[str] = []
    for k, s in enumerate(split.iter_all()):
        if k >= limit:
            break
        for q in s.qa:
            out.append(q["question"])
            out += [a for a in dict.fromkeys(q["answers"]) if a]
        out += s.captions
        if len(out) >= batch:
            yield out
            out = []
    if out:
        yield out


def describe(split: ShardSplit, scan: bool = False, check_images: bool = False) -> list[str]:
    """Lines for `vqa data info`: shards and samples from the index; with scan, the records (and bad samples)."""
    lines = [split.report()]
    if not scan:
        return lines
    q = c = bad = 0
    from ..images import load_image

    for s in split.iter_all():
        if not s.bad and check_images:
            try:
                load_image(s.image, name=s.where)
            except InputError as e:
                s.bad = str(e)
        if s.bad:
            bad += 1
            lines.append(f"  bad sample: {s.where}: {s.bad}")
            continue
        q += len(s.qa)
        c += len(s.captions)
    lines.append(f"  {q} questions, {c} captions; bad samples: {bad}")
    return lines


__all__ = ["Sample", "Shard", "ShardSplit", "shard_texts", "describe", "parse_fields", "is_url", "SHARD_EXTS"]
