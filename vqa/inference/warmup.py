"""Compiling before the first request: a server that decodes through the compiled step (`Predictor.compile`:
CUDA by default, int8 on a CPU) builds every graph its traffic can need at start-up, so no user waits for the
compiler (16-38 s per batch shape on an H100, docs/performance.md).

What a graph depends on: the rows of a decoding padded to a power of two (`vqa.decoding.compiled.bucket`;
answers run max(top_k, 3) beams a question), the image batch padded the same way, the dtype, and whether
answers are restricted to an answer vocabulary (`Predictor.set_answer_vocab`). The cache length is the same
for every decoding of a model (`vqa.decoding.batch`), so that is all."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..decoding.compiled import bucket
from ..decoding.compiled import encode as encode_images
from ..decoding.generate import generate


@dataclass
class WarmUp:
    shapes: int  # decode-step shapes run (each compiled unless it already was)
    seconds: float


def warm_up(pred, max_batch: int = 16, max_beams: int = 3) -> WarmUp:
    """Run every row bucket up to `max_batch` requests x `max_beams` beams, and every image bucket up to
    `max_batch` images, through `pred`'s compiled encoder and decode step (with and without its answer
    vocabulary). Nothing to do when `pred` decodes eagerly."""
    if not pred.compile:
        return WarmUp(0, 0.0)
    t0 = time.perf_counter()
    s, bos = pred.cfg.vit_image_size, pred.cfg.bos_id
    heads = [None] + ([pred.answer_vocab] if pred.answer_vocab is not None else [])
    shapes, rows = 0, 1
    with pred._lock:
        while rows <= bucket(max(1, max_batch) * max(1, max_beams)):
            n_img = min(rows, bucket(max(1, max_batch)))
            with torch.no_grad():  # as the Predictor encodes (grad mode is part of what a graph is built for)
                memory = encode_images(pred.model, torch.zeros(n_img, 3, s, s, device=pred.device,
                                                               dtype=pred.dtype), True)
            for vocab in heads:
                generate(pred.model, [[bos]] * rows, memory=memory, image_index=[i % n_img for i in range(rows)],
                         vocab=vocab, compile=True, max_new_tokens=2, min_new_tokens=2)
                shapes += 1
            rows *= 2
    return WarmUp(shapes, time.perf_counter() - t0)


__all__ = ["WarmUp", "warm_up"]
