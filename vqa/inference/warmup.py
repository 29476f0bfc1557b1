"""Compiling before the first request: a server that decodes through the compiled step (`Predictor.compile`:
CUDA by default, int8 on a CPU) builds every graph its traffic can need at start-up, so no user waits for the
compiler: `warm_up` before the server listens (CUDA), `BackgroundWarmUp` in a thread while it answers eagerly
(a CPU, where compiling a whole server takes minutes).

What a graph depends on: the rows of a decoding padded to a power of two (`vqa.decoding.compiled.bucket`;
answers run max(top_k, 3) beams a question), the image batch padded the same way, the dtype, whether answers
are restricted to an answer vocabulary (`Predictor.set_answer_vocab`), and the cache length: the prompt plus
the longest output the request allows, in a few lengths (`vqa.decoding.batch.slot_bucket`). The warm-up
builds the length of a caption at the default budget and that of an answer to a question of up to
WARM_PROMPT tokens; a longer question's first answer compiles its length then."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..config import GenerationConfig
from ..decoding.batch import slot_bucket, slots_needed
from ..decoding.compiled import bucket
from ..decoding.compiled import encode as encode_images
from ..decoding.generate import generate

WARM_PROMPT = 32  # prompt tokens (a question of 20-odd words) whose answers the warm-up builds a cache for


@dataclass
class WarmUp:
    shapes: int  # decode-step shapes run (each compiled unless it already was)
    seconds: float


def cache_lengths(pred) -> dict[int, list]:
    """{cache slots: the heads decoded with them} for `pred`'s requests at their default budgets: a caption
    (the whole vocabulary) and an answer to a WARM_PROMPT-token question (with and without the answer
    vocabulary), for the tasks the model was trained for."""
    limit, out = pred.cfg.dec_max_len, {}

    def add(prompt_len: int, task: str, heads: list) -> None:
        prompt_len = min(prompt_len, limit - 1)
        new = GenerationConfig.for_task(task).budget(limit - prompt_len)
        for head in heads:
            out.setdefault(slot_bucket(slots_needed(prompt_len, new)), []).append(head)

    if "caption" in pred.tasks:
        add(len(pred.tokenizer.caption_prompt()), "caption", [None])
    if "vqa" in pred.tasks:
        add(WARM_PROMPT, "vqa", [None] + ([pred.answer_vocab] if pred.answer_vocab is not None else []))
    return {slots: list({id(h): h for h in heads}.values()) for slots, heads in out.items()}


def _build(pred, max_batch: int, max_beams: int) -> int:
    """Run every row bucket up to `max_batch` requests x `max_beams` beams, and every image bucket up to
    `max_batch` images, through `pred`'s compiled encoder and decode step at each of its `cache_lengths`;
    returns the decode-step shapes run."""
    s, bos, limit = pred.cfg.vit_image_size, pred.cfg.bos_id, pred.cfg.dec_max_len
    lengths = cache_lengths(pred)
    shapes, rows = 0, 1
    while rows <= bucket(max(1, max_batch) * max(1, max_beams)):
        n_img = min(rows, bucket(max(1, max_batch)))
        with torch.no_grad():  # as the Predictor encodes (grad mode is part of what a graph is built for)
            memory = encode_images(pred.model, torch.zeros(n_img, 3, s, s, device=pred.device,
                                                           dtype=pred.dtype), True)
        for slots, heads in lengths.items():
            # a one-token prompt with `new` tokens to write caches slots_needed(1, new) = new slots: this length
            new = min(slots, limit - 1)
            for vocab in heads:
                generate(pred.model, [[bos]] * rows, memory=memory, image_index=[i % n_img for i in range(rows)],
                         vocab=vocab, compile=True, max_new_tokens=new, min_new_tokens=2)
                shapes += 1
        rows *= 2
    return shapes


def warm_up(pred, max_batch: int = 16, max_beams: int = 3) -> WarmUp:
    """Build every graph of `pred` (`_build`) now, holding its lock: requests wait until it is done. Nothing
    to do when `pred` decodes eagerly."""
    if not pred.compile:
        return WarmUp(0, 0.0)
    t0 = time.perf_counter()
    with pred._lock:
        shapes = _build(pred, max_batch, max_beams)
    return WarmUp(shapes, time.perf_counter() - t0)


class BackgroundWarmUp:
    """Build every graph of `pred` (`_build`) in a daemon thread while `pred` answers eagerly (its `compile` is
    off until then), then turn its compiled step on. No request waits for the compiler, and none runs a
    compiled graph while another is being built (the compiled step's guards are switched off process-wide for
    shapes already built). `on_done(self)` runs in the thread at the end; `result` is the WarmUp, or `error`
    the exception that stopped it (then `pred` keeps answering eagerly). Nothing to do when `pred` decodes
    eagerly."""

    def __init__(self, pred, max_batch: int = 16, max_beams: int = 3,
                 on_done: Callable[[BackgroundWarmUp], None] | None = None):
        self.pred = pred
        self.result: WarmUp | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        if not pred.compile:
            self.result = WarmUp(0, 0.0)
            self.done.set()
            return
        with pred._lock:
            pred.compile = False  # eager answers until every graph is built
        self._on_done = on_done
        self._args = (max_batch, max_beams)
        self.thread = threading.Thread(target=self._run, name="vqa-warm-up", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        t0 = time.perf_counter()
        try:
            shapes = _build(self.pred, *self._args)
            with self.pred._lock:
                self.pred.compile = True
            self.result = WarmUp(shapes, time.perf_counter() - t0)
        except Exception as e:  # the eager step goes on answering
            self.error = e
            warnings.warn(f"compiling the model failed ({type(e).__name__}: {e}); answering eagerly",
                          RuntimeWarning, stacklevel=1)
        finally:
            self.done.set()
            if self._on_done is not None:
                self._on_done(self)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the warm-up has ended (True), or `timeout` seconds have passed (False)."""
        return self.done.wait(timeout)


__all__ = ["WarmUp", "warm_up", "BackgroundWarmUp", "cache_lengths", "WARM_PROMPT"]
