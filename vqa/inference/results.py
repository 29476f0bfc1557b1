"""What the Predictor returns: an `Answer` or a `Caption`, each with the generated tokens and, on request, the
cross-attention maps behind them (`vqa.inference.predict` describes the probabilities and the maps), and the
answers' probabilities: beams that spell the same text are one answer, whose probability is the sum of theirs
(exp of each beam's total log-probability), and answers rank by that probability; candidate answers
(`Predictor.rank`) rank by a softmax over their total log-probabilities.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class _Generated:
    tokens: list[str] = field(default_factory=list)  # the generated pieces, as text (word starts keep a space)
    attention: torch.Tensor | None = None  # [G, L, H, grid, grid] on the CPU, when asked for
    prompt_ids: list[int] = field(default_factory=list, repr=False)  # the prompt it was generated after
    ids: list[int] = field(default_factory=list, repr=False)  # the generated token ids (no <eos>)
    cut: bool = False  # it reached its budget (max_new_tokens, or the context's end) without <eos>

    def words(self) -> list[tuple[str, torch.Tensor | None]]:
        """The generated words with their attention maps [L, H, grid, grid]: word pieces are joined and
        their maps averaged. A piece that starts with a space (the tokenizer's word marker) starts a word."""
        groups: list[tuple[str, list[int]]] = []
        for i, piece in enumerate(self.tokens):
            if not groups or piece.startswith(" ") or not piece.strip():
                groups.append((piece.strip(), [i]))
            else:
                text, idx = groups[-1]
                groups[-1] = (text + piece, idx + [i])
        return [(text or "·", None if self.attention is None else self.attention[idx].mean(0)) for text, idx in groups]


@dataclass
class Answer(_Generated):
    question: str = ""
    answer: str = ""
    top_k: list[tuple[str, float]] = field(default_factory=list)  # (answer, probability), most likely first
    truncated: bool = False  # the question was cut to fit the model's context

    def to_dict(self) -> dict:
        return dict(
            question=self.question, answer=self.answer, truncated=self.truncated,
            top_k=[dict(answer=a, probability=round(p, 6)) for a, p in self.top_k],
        )


@dataclass
class Caption(_Generated):
    caption: str = ""
    log_prob: float = 0.0  # total log-probability of the caption (incl. <eos>)
    beams: list[tuple[str, float]] = field(default_factory=list)  # beam search: (caption, log-prob), best first

    def to_dict(self) -> dict:
        return dict(
            caption=self.caption, log_prob=round(self.log_prob, 6),
            beams=[dict(caption=c, log_prob=round(s, 6)) for c, s in self.beams],
        )


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


__all__ = ["Answer", "Caption", "answers_from_beams", "ranked_candidates"]
