"""Answers from decoded hypotheses: beams that spell the same text are one answer, whose probability is the
sum of theirs (exp of each beam's total log-probability), and answers rank by that probability; candidate
answers (`Predictor.rank`) rank by a softmax over their total log-probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch


def answers_from_beams(hyps: Sequence[tuple[list[int], float]], decode: Callable[[list[int]], str],
                       top_k: int) -> tuple[list[tuple[str, float]], list[int]]:
    """The `top_k` most probable texts among `hyps` ((token ids, total log-probability) pairs) with their
    summed probabilities, most probable first, and the likeliest token sequence of the first text."""
    if not hyps:
        raise ValueError("no hypotheses to make answers of")
    merged: dict[str, float] = {}
    best: dict[str, tuple[list[int], float]] = {}
    for seq, logp in hyps:
        text = decode(seq)  # distinct token sequences may spell the same text
        merged[text] = merged.get(text, 0.0) + math.exp(float(logp))
        if text not in best or logp > best[text][1]:
            best[text] = (seq, logp)
    ranked = sorted(merged.items(), key=lambda kv: -kv[1])[:top_k]
    return ranked, best[ranked[0][0]][0]


def ranked_candidates(candidates: Sequence[str], logp: torch.Tensor) -> list[tuple[str, float]]:
    """`candidates` with their probabilities softmaxed over `logp` [C] (their total log-probabilities), the
    likeliest first."""
    probs = torch.softmax(logp.float(), 0).tolist()
    return sorted(zip(candidates, probs, strict=True), key=lambda cp: -cp[1])


__all__ = ["answers_from_beams", "ranked_candidates"]
