"""Sampling: top_k=1 and a tiny top_p are greedy decoding, seeded sampling is reproducible and really samples
(scored under the unfiltered model), and filter_logits keeps the top-k tokens and the nucleus."""

from __future__ import annotations

import pytest
import torch
from generate_fixtures import PROMPTS, loglik

from vqa.decoding.generate import generate
from vqa.decoding.sample import filter_logits


def test_sampling_with_top_k_1_equals_greedy(model, images):
    greedy = generate(model, PROMPTS, images, max_new_tokens=10)
    sampled = generate(model, PROMPTS, images, max_new_tokens=10, method="sample", top_k=1, temperature=1.7, seed=0)
    assert sampled.sequences == greedy.sequences
    assert sampled.scores == pytest.approx(greedy.scores, abs=1e-5)


def test_seeded_sampling_is_reproducible_and_really_samples(model, images):
    def run(seed):
        return generate(model, PROMPTS, images, max_new_tokens=10, method="sample", temperature=1.5, seed=seed)

    a, b, c = run(7), run(7), run(8)
    assert a.sequences == b.sequences and a.scores == b.scores
    greedy = generate(model, PROMPTS, images, max_new_tokens=10).sequences
    assert a.sequences != c.sequences and a.sequences != greedy
    # the score of a sample is its log-probability under the unfiltered, untempered model
    for i, prompt in enumerate(PROMPTS):
        ended = len(a.sequences[i]) < 10
        assert a.scores[i] == pytest.approx(loglik(model, images[i : i + 1], prompt, a.sequences[i], ended), abs=1e-4)


def test_sampling_with_top_p_stays_in_the_nucleus(model, images):
    """With a tiny top_p only the most likely token survives: sampling is then greedy."""
    greedy = generate(model, PROMPTS, images, max_new_tokens=10).sequences
    assert generate(model, PROMPTS, images, max_new_tokens=10, method="sample", top_p=1e-6, seed=3).sequences == greedy


def _kept(logits: torch.Tensor) -> list[list[int]]:
    return [sorted(torch.nonzero(row > float("-inf"))[:, 0].tolist()) for row in logits]


def test_filter_logits_top_p_keeps_the_nucleus():
    # a hand-made distribution, deliberately unsorted: token 1: 0.5, token 3: 0.3, token 0: 0.15, token 2: 0.05
    probs = torch.tensor([[0.15, 0.5, 0.05, 0.3], [0.3, 0.05, 0.5, 0.15]])
    logits = probs.log()
    assert _kept(filter_logits(logits, top_p=0.45)) == [[1], [2]]  # 0.5 alone reaches 0.45
    assert _kept(filter_logits(logits, top_p=0.7)) == [[1, 3], [0, 2]]  # 0.5 + 0.3
    assert _kept(filter_logits(logits, top_p=0.85)) == [[0, 1, 3], [0, 2, 3]]  # + 0.15
    assert _kept(filter_logits(logits, top_p=0.97)) == [[0, 1, 2, 3]] * 2
    assert _kept(filter_logits(logits, top_p=1.0)) == [[0, 1, 2, 3]] * 2
    # the kept tokens keep their logits, so renormalizing gives the nucleus distribution
    kept = filter_logits(logits, top_p=0.7)
    torch.testing.assert_close(kept.softmax(-1)[0], torch.tensor([0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8]))
    assert torch.equal(kept[0, [1, 3]], logits[0, [1, 3]])


def test_filter_logits_top_k_and_both():
    logits = torch.tensor([[0.15, 0.5, 0.05, 0.3]]).log()
    assert _kept(filter_logits(logits, top_k=1)) == [[1]]
    assert _kept(filter_logits(logits, top_k=2)) == [[1, 3]]
    assert _kept(filter_logits(logits, top_k=10)) == [[0, 1, 2, 3]]
    assert _kept(filter_logits(logits, top_k=0)) == [[0, 1, 2, 3]]
    # top_k first, then top_p of the renormalized top-k distribution: 0.5/0.95 ~ 0.53 < 0.6 -> two tokens
    assert _kept(filter_logits(logits, top_k=3, top_p=0.6)) == [[1, 3]]
    assert _kept(filter_logits(logits, top_k=3, top_p=0.5)) == [[1]]
