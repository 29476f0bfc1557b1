"""Answers from beams on their own: beams that spell one text are one answer with their probabilities summed,
answers rank by it, and candidate answers are softmaxed over their log-probabilities."""

from __future__ import annotations

import math

import pytest
import torch

from vqa.inference.results import answers_from_beams, ranked_candidates

SPELLING = {1: "red", 2: "r", 3: "ed", 4: "blue", 5: "green"}


def decode(ids: list[int]) -> str:
    return "".join(SPELLING[i] for i in ids)


def test_beams_that_spell_the_same_text_sum_their_probabilities():
    hyps = [([4], math.log(0.3)), ([1], math.log(0.25)), ([2, 3], math.log(0.2)), ([5], math.log(0.1))]
    ranked, best = answers_from_beams(hyps, decode, top_k=3)
    assert [t for t, _ in ranked] == ["red", "blue", "green"]  # 0.45 together beats blue's 0.3
    assert [p for _, p in ranked] == pytest.approx([0.45, 0.3, 0.1])
    assert best == [1]  # the likelier of the two sequences that spell "red"


def test_top_k_cuts_the_ranking_and_one_beam_is_one_answer():
    hyps = [([4], math.log(0.3)), ([5], math.log(0.1))]
    ranked, best = answers_from_beams(hyps, decode, top_k=1)
    assert ranked == [("blue", pytest.approx(0.3))] and best == [4]
    with pytest.raises(ValueError, match="no hypotheses"):
        answers_from_beams([], decode, top_k=1)


def test_candidates_rank_by_a_softmax_over_their_log_probabilities():
    ranked = ranked_candidates(["yes", "no", "maybe"], torch.tensor([math.log(1.0), math.log(3.0), math.log(4.0)]))
    assert [c for c, _ in ranked] == ["maybe", "no", "yes"]
    assert [p for _, p in ranked] == pytest.approx([0.5, 0.375, 0.125])
