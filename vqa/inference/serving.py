"""A small batching layer: requests from many threads are answered together, in one batched model call.

    batcher = RequestBatcher(run_batch, max_batch=16, max_wait=0.01)
    result = batcher(key, item)          # blocks; any thread; same result as run_batch(key, [item])[0]

As in LitServe (`max_batch_size`, `batch_timeout`): one worker thread takes the first waiting request, waits
at most `max_wait` seconds for more (or until `max_batch` are there), then calls `run_batch(key, items)` once
per distinct `key` among them (requests with different decoding settings cannot share a call). Unlike
Gradio's own `batch=True`, a batch waits briefly for company, and one bad request fails alone: a batched call
that raises is retried one request at a time. `max_pending` bounds the requests waiting; one more is refused
at once with `Busy`.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..config import DECODING_METHODS, GenerationConfig
from ..errors import VQAError


class Busy(VQAError):
    """The server has more requests waiting than it accepts: try again shortly."""


@dataclass
class _Request:
    key: Hashable
    item: Any
    future: Future = field(default_factory=Future)


class RequestBatcher:
    """Gathers concurrent calls into batched `run_batch(key, items) -> results` calls (one result per item,
    in order) on a worker thread. Thread-safe; the worker is a daemon that starts with the first request."""

    def __init__(self, run_batch: Callable[[Hashable, list[Any]], Sequence[Any]], max_batch: int = 16,
                 max_wait: float = 0.01, max_pending: int | None = None, name: str = "vqa-batcher"):
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if max_wait < 0:
            raise ValueError(f"max_wait must be >= 0 seconds, got {max_wait}")
        self.run_batch, self.max_batch, self.max_wait = run_batch, int(max_batch), float(max_wait)
        self.max_pending = max_pending
        self.name = name
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self.batches = 0  # batched calls made (for tests and the load script's curiosity)
        self.largest = 0  # the most requests one call has answered

    def submit(self, key: Hashable, item: Any) -> Future:
        """Queue one request; its Future holds the result or the exception."""
        if self.max_pending is not None and self._queue.qsize() >= self.max_pending:
            raise Busy(f"The demo is busy: {self._queue.qsize()} questions are waiting. Please try again in a "
                       "few seconds.")
        req = _Request(key, item)
        with self._lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._worker.start()
        self._queue.put(req)
        return req.future

    def __call__(self, key: Hashable, item: Any, timeout: float | None = None) -> Any:
        """`submit` and wait for the result (raising the request's own exception)."""
        return self.submit(key, item).result(timeout)

    # ---- the worker ----
    def _gather(self) -> list[_Request]:
        batch = [self._queue.get()]  # block until there is work
        deadline = time.monotonic() + self.max_wait
        while len(batch) < self.max_batch:
            try:
                left = deadline - time.monotonic()
                batch.append(self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _loop(self) -> None:
        while True:
            batch = self._gather()
            groups: dict[Hashable, list[_Request]] = {}
            for r in batch:
                groups.setdefault(r.key, []).append(r)
            for key, reqs in groups.items():
                self._run(key, reqs)

    def _run(self, key: Hashable, reqs: list[_Request]) -> None:
        live = [r for r in reqs if r.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            results = list(self.run_batch(key, [r.item for r in live]))
            if len(results) != len(live):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(live)} requests")
        except BaseException as e:  # every caller must hear back, whatever happened
            if len(live) == 1:
                live[0].future.set_exception(e)
                return
            for r in live:  # one bad request must not fail the others: each alone, with its own outcome
                try:
                    r.future.set_result(self.run_batch(key, [r.item])[0])
                except BaseException as e1:
                    r.future.set_exception(e1)
            return
        self.batches += 1
        self.largest = max(self.largest, len(live))
        for r, res in zip(live, results, strict=True):
            r.future.set_result(res)


class SharedPredictor:
    """A `vqa.Predictor` shared by many threads: their `answer` and `caption` calls, gathered by a
    `RequestBatcher`, become batched `answer_batch` / `caption_batch` calls (each distinct picture encoded once,
    encodings cached by content). The results are those of one-by-one calls: each row of a batched decoding gets
    its own length budget and its own padding mask (`vqa.decoding.generate`). Answers and captions of a random
    decoding method (sampling) are never batched: each has its own call and random generator, so a seeded sample
    does not depend on what else was in its batch.

    `familiarity` (a `vqa.demo.familiarity.Familiarity`, settable later) adds, for each result, how unlike the
    training pictures its picture is (the ratio; None without a reference)."""

    def __init__(self, pred, max_batch: int = 16, max_wait: float = 0.01, max_pending: int | None = None,
                 attention: bool = True, familiarity=None):
        self.pred, self.attention, self.familiarity = pred, attention, familiarity
        self.batcher = RequestBatcher(self._run, max_batch=max_batch, max_wait=max_wait, max_pending=max_pending)

    def answer(self, image: Any, question: str, top_k: int = 1, generation=None,
               on_tokens=None) -> tuple[Any, float | None]:
        """(`Predictor.answer(image, question, top_k, generation, return_attention=...)`, familiarity ratio).
        `on_tokens`: called from the batch's decoding with this request's tokens so far at every step
        (streaming; the batch is shared as before)."""
        settings = self.pred.answer_settings(int(top_k), generation)
        return self.batcher(_key("answer", settings), (image, settings, on_tokens, question, int(top_k)))

    def caption(self, image: Any, generation=None, on_tokens=None) -> tuple[Any, float | None]:
        """(`Predictor.caption(image, generation, return_attention=...)`, familiarity ratio); `on_tokens`: as
        `answer`'s."""
        settings = generation or GenerationConfig.for_task("caption")
        return self.batcher(_key("caption", settings), (image, settings, on_tokens))

    def _run(self, key: tuple, items: list[tuple]) -> list[tuple[Any, float | None]]:
        kind, settings = key[0], items[0][1]
        images = [it[0] for it in items]
        hooks = [it[2] for it in items]
        # streaming: each request's hook hears its own row of the batch (a batch without hooks passes nothing)
        watch = {} if not any(hooks) else dict(watch=lambda rows: [h(r) for h, r in zip(hooks, rows, strict=True) if h])
        with self.pred._lock:  # one lock for the decoding and the (cached) features of the same pictures
            if kind == "answer":
                top = max(it[4] for it in items)
                results = self.pred.answer_batch(images, [it[3] for it in items], top_k=top, generation=settings,
                                                 return_attention=self.attention, **watch)
                for res, it in zip(results, items, strict=True):
                    res.top_k = res.top_k[: it[4]]  # a longer list's prefix: the same ranking
            else:
                results = self.pred.caption_batch(images, settings, return_attention=self.attention, **watch)
            ref = self.familiarity
            ratios = ref.ratio(self.pred.image_features(images)).tolist() if ref is not None else [None] * len(items)
        return list(zip(results, ratios, strict=True))


def _key(kind: str, settings) -> tuple:
    """The batching key of a request: its kind and decoding settings. A request decoded by a random method
    (sampling) gets a key of its own, so a call and a random generator of its own: its draws (seeded or not)
    never depend on what else was in the batch."""
    key = (kind, dataclasses.astuple(settings))  # a GenerationConfig is a mutable dataclass: its field values
    return key + (object(),) if DECODING_METHODS[settings.method].random else key


__all__ = ["RequestBatcher", "SharedPredictor", "Busy"]
