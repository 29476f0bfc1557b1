"""Captioning or answering a whole collection: `vqa caption INPUT... --out FILE.jsonl`, `vqa ask`.

The pipeline: DataLoader workers decode this process's positions in chunks (`vqa.inference.collection.loader`);
each chunk's images go to the demo's `RequestBatcher` (`vqa.inference.serving`), whose thread runs them through
`Predictor.caption_batch` / `answer_batch`, or `vqa.inference.pointing.locate` for `vqa ask --point` (the
compiled decode step when the Predictor compiles) while this thread takes the next chunk from the loader and
writes the finished one. The workers' chunks arrive out of position order (each worker reads whole shards);
their records wait in `_ready` (records, never pixels) and are written in position order, one line each, flushed
(`vqa.inference.collection.output`): a killed run loses the chunks in flight and the records still waiting for
an earlier chunk, and a rerun skips the keys written. An image that cannot be decoded, or a question the model
refuses, gets a record with `error`; the run goes on.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from dataclasses import dataclass

from ...config import GenerationConfig
from ...data.lengths import line, say
from ...distributed import Dist, agree, on_main
from ...errors import ConfigError, VQAError
from ...logs import bars_off
from ..serving import RequestBatcher, _key
from .inputs import Collection
from .loader import ChunkSource, Loaded, chunk_loader, rank_range
from .output import Output, merge

IN_FLIGHT = 2  # chunks handed to the model before the oldest is written: one running, one waiting


@dataclass
class Summary:
    written: int  # records this process wrote now
    skipped: int  # positions already written before
    errors: int  # this run's inputs whose record is an error (written now or before; not other inputs' records)
    total: int  # this run's inputs (written now or before): the output may hold records of others too
    seconds: float


def _ident(kind: str, item: Loaded) -> dict:
    """The record's identifying fields; a point's question is the phrase it looked for, named as
    `Point.to_dict` names it."""
    rec = item.ident()
    if kind == "point" and "question" in rec:
        rec["phrase"] = rec.pop("question")
    return rec


def _record(kind: str, item: Loaded, res, top_k: int) -> dict:
    rec = _ident(kind, item)
    if kind == "point":  # what `vqa ask IMAGE OBJECT --point --json` prints
        rec.update(res.to_dict())
        return rec
    d = res.to_dict()
    if kind == "caption":
        rec.update(caption=d["caption"], log_prob=d["log_prob"])
        if d["beams"]:
            rec["beams"] = d["beams"]
        return rec
    rec.update(answer=d["answer"], probability=d["top_k"][0]["probability"], truncated=d["truncated"])
    if top_k > 1:
        rec["top_k"] = d["top_k"]
    return rec


class Job:
    """One process's part of a collection job: `run()` writes its records and returns a Summary. `kind`:
    "caption", "ask" or "point"."""

    def __init__(self, pred, collection: Collection, output: Output, kind: str, settings: GenerationConfig,
                 top_k: int = 1, batch: int = 32, workers: int = 2, dist: Dist | None = None, progress: bool = True,
                 stamp: str | None = None):
        """`stamp`: the job's settings digest every record carries (`vqa.inference.collection.output.JobSettings`)."""
        self.pred, self.collection, self.output, self.kind = pred, collection, output, kind
        self.stamp = stamp
        self.settings, self.top_k, self.batch, self.workers = settings, int(top_k), int(batch), int(workers)
        self.dist = dist or Dist()
        self.progress = progress
        self.outputs = self.cut = 0  # outputs written, and of them those cut at their budget (`Answer.cut`)

    # ---- the model side: a RequestBatcher call ----
    def _run_batch(self, key, items: list) -> list:
        images, questions = [it[0] for it in items], [it[1] for it in items]
        if self.kind == "caption":
            return self.pred.caption_batch(images, self.settings)
        if self.kind == "point":
            from ..pointing import locate

            return locate(self.pred, images, [it[2] for it in items], questions, generation=self.settings)
        return self.pred.answer_batch(images, questions, top_k=self.top_k, generation=self.settings)

    def run(self) -> Summary:
        """Write this process's records and, with several processes, merge them; the output must be
        `open_output`'d. Every rank learns whether any failed before the merge (`distributed.agree`)."""
        failure, local = None, None
        try:
            local = self.decode()
        except Exception as e:  # noqa: BLE001 -- told to the other ranks, then raised again
            failure = e
        if self.output.parted and self.dist.rank != 0:
            self.output.release()  # the part's lock, before rank 0 merges the part; rank 0 keeps the output's
        agree(self.dist, failure)
        return self.finish(local)

    def decode(self) -> tuple[int, int, float]:
        """This process's records, written: (positions skipped, of them errors, seconds). No collective."""
        t0 = time.perf_counter()
        try:
            lo, hi = rank_range(len(self.collection), self.dist.rank, self.dist.world)
            source = ChunkSource(self.collection, lo, hi, self.batch, self.pred.transform, self.output.done_keys,
                                 self.output.failed_keys, sizes=self.kind == "point")
            # the workers start before the RequestBatcher's thread
            chunks = iter(chunk_loader(source, self.workers, self.output.lock_fds()))
            self._next, self._ready = lo, {}
            skipped, prior_errors = self._pipeline(chunks, hi - lo)
            self._flush(final=True)
        finally:
            self.output.close()
        return skipped, prior_errors, time.perf_counter() - t0

    def finish(self, local: tuple[int, int, float]) -> Summary:
        """Every rank, after `agree`: the merge (rank 0) and the counts of every rank's inputs."""
        skipped, prior_errors, seconds = local
        written = self.output.written
        # this run's inputs only (the output may hold records of other inputs, from earlier runs)
        total, errors = skipped + written, prior_errors + self.output.errors
        if self.output.parted:
            on_main(self.dist, lambda: merge(self.output.out))  # the others wait; a failed merge fails every rank
            total, errors = _sum(self.dist, (total, errors))  # every rank's inputs
        outputs, cut = _sum(self.dist, (self.outputs, self.cut))
        if self.dist.main:
            noun = {"caption": "captions written", "point": "points written"}.get(self.kind, "answers written")
            say(line(cut, outputs, noun, "reached their budget without <eos> and were cut (--max-new-tokens)"))
        self.output.release()
        return Summary(written, skipped, errors, total, seconds)

    def _pipeline(self, chunks, n: int) -> int:
        from tqdm import tqdm

        batcher = RequestBatcher(self._run_batch, max_batch=self.batch, max_wait=0.05, name=f"vqa-{self.kind}")
        key = _key(self.kind, self.settings)
        bar = tqdm(total=n, unit="img", desc=f"vqa {self.kind}", dynamic_ncols=True, file=sys.stderr,
                   disable=True if not (self.progress and self.dist.main) else bars_off())
        pending: deque = deque()
        skipped = skipped_errors = 0
        with bar:
            for chunk in chunks:
                futures = [None if it.error else batcher.submit(key, (it.pixels, it.question, it.size))
                           for it in chunk.items]
                pending.append((chunk, futures))
                skipped += chunk.skipped
                skipped_errors += chunk.skipped_errors
                while len(pending) > IN_FLIGHT - 1:
                    self._finish(*pending.popleft(), bar)
            while pending:
                self._finish(*pending.popleft(), bar)
        return skipped, skipped_errors

    def _finish(self, chunk, futures, bar) -> None:
        recs = []
        for it, fut in zip(chunk.items, futures, strict=True):
            if fut is None:
                rec = {**_ident(self.kind, it), "error": it.error}
            else:
                try:
                    res = fut.result()
                    rec = _record(self.kind, it, res, self.top_k)
                    self.outputs, self.cut = self.outputs + 1, self.cut + getattr(res, "cut", False)  # a Point: none
                except VQAError as e:
                    rec = {**_ident(self.kind, it), "error": str(e)}
            if self.stamp is not None:
                rec["settings"] = self.stamp
            recs.append((rec, it.pos))
        self._ready[chunk.start] = (chunk.stop, recs)
        self._flush()
        bar.update(len(chunk.items) + chunk.skipped)

    def _flush(self, final: bool = False) -> None:
        """Write the waiting chunks that come next in position order (`final`: all of them)."""
        while self._next in self._ready or (final and self._ready):
            at = self._next if self._next in self._ready else min(self._ready)
            self._next, recs = self._ready.pop(at)
            for rec, pos in recs:
                self.output.write(rec, pos)


def open_output(output: Output, dist: Dist) -> None:
    """Lock the output on every rank (all ranks fail together when any lock is taken), then read what is done."""
    err = None
    try:
        output.lock()
    except ConfigError as e:
        err = str(e)
    err = next((e for e in _gathered(dist, err) if e), None)
    if err:
        output.release()
        raise ConfigError(err)
    try:
        output.done_keys, output.failed_keys = output.done()
    except VQAError:
        output.release()
        raise


def _gathered(dist: Dist, value) -> list:
    """`value` of every rank, on every rank."""
    if dist.world == 1:
        return [value]
    import torch.distributed as tdist

    every: list = [None] * dist.world
    tdist.all_gather_object(every, value)
    return every


def _sum(dist: Dist, values: tuple[int, ...]) -> tuple[int, ...]:
    """`values` summed over the ranks (every rank gets the sums)."""
    return tuple(sum(v) for v in zip(*_gathered(dist, values), strict=True))


__all__ = ["Job", "Summary", "open_output"]
