"""Beam search: the cached search equals an uncached one that never stops early (generate_fixtures.ref_beam),
it returns k hypotheses sorted by their length-penalized score, beam size 1 is greedy decoding, and the exact
search never scores below its early-stopping self. The hypotheses are compared exactly: no rank that decides
one is a near-tie on the lively model (test_generate.py's test_the_lively_models_choices_are_not_near_ties), so
float32 rounding, which differs between CPUs, cannot reorder them."""

from __future__ import annotations

import pytest
from generate_fixtures import EOS, PROMPTS, loglik, ref_beam

from vqa.config import GenerationConfig
from vqa.decoding.batch import DecodingBatch
from vqa.decoding.beam import beam_search
from vqa.decoding.generate import generate


@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0])
def test_cached_beam_search_equals_uncached_reference(model, images, length_penalty):
    k, max_new = 3, 7
    out = generate(model, PROMPTS, images, max_new_tokens=max_new, method="beam", num_beams=k,
                   length_penalty=length_penalty)
    n_eos = 0
    for i, prompt in enumerate(PROMPTS):
        image = images[i : i + 1]
        ref = ref_beam(model, image, prompt, max_new, k, length_penalty)
        assert [s for s, _ in out.beams[i]] == [s for s, _ in ref], f"prompt {i}"
        for (_, got), (_, want) in zip(out.beams[i], ref, strict=True):
            assert got == pytest.approx(want, abs=1e-4)
        # every kept hypothesis's score is the uncached log-likelihood of its tokens (and <eos> if it ended)
        for seq, score in out.beams[i]:
            ended = len(seq) < max_new
            n_eos += ended
            assert score == pytest.approx(loglik(model, image, prompt, seq, with_eos=ended), abs=1e-4)
        assert out.sequences[i] == out.beams[i][0][0] and out.scores[i] == out.beams[i][0][1]
    assert n_eos > 0  # both ways for a hypothesis to end were exercised


def test_beam_search_returns_k_hypotheses_sorted_by_length_penalized_score(model, images):
    max_new = 7
    for k in (2, 4):
        for penalty in (0.0, 1.0, 2.0):
            out = generate(model, PROMPTS, images, max_new_tokens=max_new, method="beam", num_beams=k,
                           length_penalty=penalty)
            assert len(out.beams) == len(PROMPTS)
            for beams in out.beams:
                assert len(beams) == k
                assert len({tuple(s) for s, _ in beams}) == k  # k different hypotheses
                # length incl. <eos>; a hypothesis cut at max_new_tokens has no <eos>
                normed = [s / min(len(seq) + 1, max_new) ** penalty for seq, s in beams]
                assert normed == sorted(normed, reverse=True), (k, penalty, beams)
                assert all(len(seq) <= max_new and EOS not in seq for seq, _ in beams)
    # length_penalty changes the ranking here (short hypotheses win without it)
    raw = generate(model, PROMPTS, images, max_new_tokens=max_new, method="beam", num_beams=4,
                   length_penalty=0.0).beams
    long = generate(model, PROMPTS, images, max_new_tokens=max_new, method="beam", num_beams=4,
                    length_penalty=2.0).beams
    assert raw != long


def test_beam_size_one_equals_greedy(model, images):
    greedy = generate(model, PROMPTS, images, max_new_tokens=10)
    one = dict(method="beam", num_beams=1, max_new_tokens=10)
    assert generate(model, PROMPTS, images, length_penalty=0.0, **one).sequences == greedy.sequences
    kv = model.memory_kv(model.encode(images))
    for penalty, early in ((0.0, False), (0.0, True), (1.0, True), (2.0, True)):
        config = GenerationConfig(length_penalty=penalty, early_stopping=early, **one)
        beam = beam_search(DecodingBatch(model, kv, PROMPTS, config), config)
        assert beam.sequences == greedy.sequences, (penalty, early)
        assert beam.scores == pytest.approx(greedy.scores, abs=1e-4)
        assert [len(b) for b in beam.beams] == [1, 1, 1]


def normed(hypothesis, max_new: int = 10, penalty: float = 1.0) -> float:
    """A hypothesis's length-penalized score (its length counts <eos>, unless it was cut at max_new)."""
    seq, score = hypothesis
    return score / min(len(seq) + 1, max_new) ** penalty


def test_exact_beam_search_never_scores_below_its_early_stopping_self(model, images):
    """At length_penalty > 0 a longer hypothesis can beat an early <eos> per token: the exact search (the
    default) keeps looking, early_stopping does not, so the exact one is at least as good, and here better."""
    better = 0
    for k in (1, 2, 3):
        exact = generate(model, PROMPTS, images, max_new_tokens=10, method="beam", num_beams=k, length_penalty=1.0)
        early = generate(model, PROMPTS, images, max_new_tokens=10, method="beam", num_beams=k, length_penalty=1.0,
                         early_stopping=True)
        for i in range(len(PROMPTS)):
            assert normed(exact.beams[i][0]) >= normed(early.beams[i][0]) - 1e-6
            better += normed(exact.beams[i][0]) > normed(early.beams[i][0]) + 1e-6
    assert better > 0
