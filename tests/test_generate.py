"""Generation: the cached decoders against uncached references, padding, beams, sampling, stopping, candidate
scoring, cross-attention maps, and the errors bad input gets."""

from __future__ import annotations

import pytest
import torch
from helpers import lively_model, overfit_model, random_images

from vqa.config import GenerationConfig
from vqa.decoding.beam import beam_search
from vqa.decoding.generate import (
    cross_attention_maps,
    filter_logits,
    generate,
    score_candidates,
)
from vqa.errors import InputError

# prompts of different lengths: the batch is left-padded to 6 tokens
PROMPTS = [[1, 5], [1, 7, 8, 9, 10, 11], [1, 12, 13, 14]]
EOS = 3  # a token the lively model often produces: some rows and beams end early, others run out of room


@pytest.fixture(scope="module")
def model():
    return lively_model(eos_id=EOS)


@pytest.fixture(scope="module")
def images(model):
    return random_images(len(PROMPTS), model.cfg)


# ---------------------------------------------------------------- uncached references


@torch.no_grad()
def _next_logp(model, image, ids: list[int]) -> torch.Tensor:
    """Log-probabilities of the next token after `ids`: a full teacher-forced forward pass, no cache."""
    logits = model(image, torch.as_tensor([ids], dtype=torch.long)).logits
    return logits[0, -1].float().log_softmax(-1)


def _room(model, prompt: list[int], max_new: int) -> int:
    return min(max_new, model.cfg.dec_max_len - len(prompt))


def ref_greedy(model, image, prompt, max_new):
    """Greedy decoding without a cache: re-run the whole model on prompt + generated at every step."""
    eos, seq, score = model.cfg.eos_id, [], 0.0
    for _ in range(_room(model, prompt, max_new)):
        logp = _next_logp(model, image, prompt + seq)
        tok = int(logp.argmax())
        score += float(logp[tok])
        if tok == eos:
            break
        seq.append(tok)
    return seq, score


def ref_beam(model, image, prompt, max_new, k, length_penalty):
    """Beam search without a cache and without any early stop: every live beam runs until the prompt's length
    budget. Of the 2k best continuations, <eos> ends a hypothesis only among the top k, the first k others
    live on; beams alive at the budget end there; hypotheses rank by logp / length ** length_penalty. The
    search under test may stop sooner only where its bound proves nothing better can come: it must return
    exactly this."""
    eos = model.cfg.eos_id
    live, ended = [([], 0.0)], []
    room = _room(model, prompt, max_new)
    for t in range(room):
        # every live beam has the same length: one full (uncached) forward pass over all of them
        ids = torch.as_tensor([prompt + seq for seq, _ in live], dtype=torch.long)
        with torch.no_grad():
            logits = model(image, ids, image_index=torch.zeros(len(live), dtype=torch.long)).logits
        logps = logits[:, -1].float().log_softmax(-1).tolist()
        cands = []
        for (seq, s), logp in zip(live, logps, strict=True):
            cands += [(s + lp, seq, w) for w, lp in enumerate(logp)]
        cands.sort(key=lambda c: -c[0])
        nxt = []
        for rank, (s, seq, w) in enumerate(cands[: 2 * k]):
            if w == eos:
                if rank < k:
                    ended.append((s / (t + 1) ** length_penalty, seq, s))
            else:
                nxt.append((seq + [w], s))
            if len(nxt) == k:
                break
        if t == room - 1 or not nxt:
            ended += [(s / (t + 1) ** length_penalty, seq, s) for seq, s in nxt]
            break
        live = nxt
    ended.sort(key=lambda h: -h[0])
    return [(seq, s) for _, seq, s in ended[:k]]


@torch.no_grad()
def loglik(model, image, prompt, seq, with_eos=True) -> float:
    """Total log-probability of `seq` (then <eos>) after `prompt`, from one uncached forward pass."""
    full = prompt + seq + ([model.cfg.eos_id] if with_eos else [])
    logp = model(image, torch.as_tensor([full])).logits[0].float().log_softmax(-1)
    return sum(float(logp[t - 1, full[t]]) for t in range(len(prompt), len(full)))


# ---------------------------------------------------------------- cached == uncached


def test_the_lively_model_is_a_meaningful_test_subject(model, images):
    """The references below only mean something if outputs vary: rows end at <eos> at different steps, and
    tokens depend on context, not only on the last token."""
    out = generate(model, PROMPTS, images, max_new_tokens=10)
    lengths = [len(s) for s in out.sequences]
    assert min(lengths) < 10 and max(lengths) == 10, out.sequences
    assert any(len(set(s)) > 2 for s in out.sequences)


@pytest.mark.parametrize("positions,qk_norm", [("sinusoidal", False), ("learned", False), ("sinusoidal", True)])
def test_cached_greedy_equals_uncached_reference(positions, qk_norm):
    model = lively_model(eos_id=EOS, dec_positions=positions, dec_qk_norm=qk_norm)
    images = random_images(len(PROMPTS), model.cfg)
    out = generate(model, PROMPTS, images, max_new_tokens=10)
    for i, prompt in enumerate(PROMPTS):
        seq, score = ref_greedy(model, images[i : i + 1], prompt, 10)
        assert out.sequences[i] == seq, f"prompt {i}"
        assert out.scores[i] == pytest.approx(score, abs=1e-4)


@pytest.mark.parametrize("length_penalty", [1.0, 0.0, 2.0])
def test_cached_beam_search_equals_uncached_reference(model, images, length_penalty):
    k, max_new = 3, 7
    out = generate(model, PROMPTS, images, max_new_tokens=max_new, method="beam", num_beams=k, length_penalty=length_penalty)
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
        for lp in (0.0, 1.0, 2.0):
            out = generate(model, PROMPTS, images, max_new_tokens=max_new, method="beam", num_beams=k, length_penalty=lp)
            assert len(out.beams) == len(PROMPTS)
            for beams in out.beams:
                assert len(beams) == k
                assert len({tuple(s) for s, _ in beams}) == k  # k different hypotheses
                # length incl. <eos>; a hypothesis cut at max_new_tokens has no <eos>
                normed = [s / min(len(seq) + 1, max_new) ** lp for seq, s in beams]
                assert normed == sorted(normed, reverse=True), (k, lp, beams)
                assert all(len(seq) <= max_new and EOS not in seq for seq, _ in beams)
    # length_penalty changes the ranking here (short hypotheses win without it)
    raw = generate(model, PROMPTS, images, max_new_tokens=max_new, method="beam", num_beams=4, length_penalty=0.0).beams
    long = generate(model, PROMPTS, images, max_new_tokens=max_new, method="beam", num_beams=4, length_penalty=2.0).beams
    assert raw != long


def test_beam_size_one_equals_greedy(model, images):
    greedy = generate(model, PROMPTS, images, max_new_tokens=10)
    one = dict(method="beam", num_beams=1, max_new_tokens=10)
    assert generate(model, PROMPTS, images, length_penalty=0.0, **one).sequences == greedy.sequences
    kv = model.memory_kv(model.encode(images))
    for lp, early in ((0.0, False), (0.0, True), (1.0, True), (2.0, True)):
        beam = beam_search(model, kv, PROMPTS, GenerationConfig(length_penalty=lp, early_stopping=early, **one))
        assert beam.sequences == greedy.sequences, (lp, early)
        assert beam.scores == pytest.approx(greedy.scores, abs=1e-4)
        assert [len(b) for b in beam.beams] == [1, 1, 1]


def normed(hypothesis, max_new: int = 10, lp: float = 1.0) -> float:
    """A hypothesis's length-penalized score (its length counts <eos>, unless it was cut at max_new)."""
    seq, score = hypothesis
    return score / min(len(seq) + 1, max_new) ** lp


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


# ---------------------------------------------------------------- padding


def test_padded_batch_equals_prompts_one_by_one_greedy(model, images):
    batch = generate(model, PROMPTS, images, max_new_tokens=10)
    for i, prompt in enumerate(PROMPTS):
        alone = generate(model, [prompt], images[i : i + 1], max_new_tokens=10)
        assert batch.sequences[i] == alone.sequences[0]
        assert batch.scores[i] == pytest.approx(alone.scores[0], abs=1e-4)


@pytest.mark.parametrize("k", [2, 3])
def test_padded_batch_equals_prompts_one_by_one_beam(model, images, k):
    batch = generate(model, PROMPTS, images, max_new_tokens=7, method="beam", num_beams=k)
    for i, prompt in enumerate(PROMPTS):
        alone = generate(model, [prompt], images[i : i + 1], max_new_tokens=7, method="beam", num_beams=k)
        assert [s for s, _ in batch.beams[i]] == [s for s, _ in alone.beams[0]]
        assert [s for _, s in batch.beams[i]] == pytest.approx([s for _, s in alone.beams[0]], abs=1e-4)


def test_shared_image_by_index_and_reused_memory_give_the_same_result(model, images):
    """Several prompts on one image (image_index), and a precomputed memory, change nothing."""
    index = [0, 0, 0]
    by_index = generate(model, PROMPTS, images[:1], image_index=index, max_new_tokens=8)
    repeated = generate(model, PROMPTS, images[:1].expand(3, -1, -1, -1), max_new_tokens=8)
    from_memory = generate(model, PROMPTS, memory=model.encode(images[:1]), image_index=index, max_new_tokens=8)
    assert by_index.sequences == repeated.sequences == from_memory.sequences
    assert by_index.scores == pytest.approx(repeated.scores, abs=1e-5)


def test_different_images_give_different_generations(model, images):
    """Cross-attention is used at generation time too."""
    same_prompt = [PROMPTS[1]] * 3
    out = generate(model, same_prompt, images, max_new_tokens=10)
    assert len({tuple(s) for s in out.sequences}) == 3, out.sequences  # each image its own output
    # and each row reads its own image: the outputs follow the images when they are permuted
    swapped = generate(model, same_prompt, images[[2, 0, 1]], max_new_tokens=10)
    assert swapped.sequences == [out.sequences[2], out.sequences[0], out.sequences[1]]


# ---------------------------------------------------------------- sampling


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


# ---------------------------------------------------------------- stopping and limits


def test_generation_stops_at_eos(model, images):
    free = generate(tiny_model_like(model, eos_id=2), PROMPTS, images, max_new_tokens=10)  # <eos> never wins
    seq = free.sequences[1]
    assert len(seq) == 10
    stop = seq[3]
    stopping = tiny_model_like(model, eos_id=stop)
    out = generate(stopping, PROMPTS[1:2], images[1:2], max_new_tokens=10)
    assert out.sequences[0] == seq[: seq.index(stop)]  # everything before the first <eos>, without it
    assert out.scores[0] == pytest.approx(loglik(stopping, images[1:2], PROMPTS[1], out.sequences[0]), abs=1e-4)
    # in a batch, the rows that stopped wait (their result stays put) while the others go on
    batch = generate(stopping, PROMPTS, images, max_new_tokens=10)
    assert batch.sequences[1] == out.sequences[0]
    assert max(len(s) for s in batch.sequences) > len(out.sequences[0])


def tiny_model_like(model, **overrides):
    """The same weights under another config (e.g. another <eos> id)."""
    import dataclasses

    from vqa.model import VQAModel

    twin = VQAModel(dataclasses.replace(model.cfg, **overrides)).eval()
    twin.load_state_dict(model.state_dict())
    return twin


@pytest.mark.parametrize("method,num_beams", [("greedy", 1), ("beam", 1), ("beam", 3)])
def test_generation_respects_max_new_tokens(model, images, method, num_beams):
    never = tiny_model_like(model, eos_id=2)
    for n in (1, 3, 6):
        out = generate(never, PROMPTS, images, max_new_tokens=n, method=method, num_beams=num_beams)
        assert [len(s) for s in out.sequences] == [n] * 3
        assert all(len(s) <= n for b in out.beams for s, _ in b)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_generation_respects_dec_max_len(model, images, num_beams):
    method = "beam" if num_beams > 1 else "greedy"
    never = tiny_model_like(model, eos_id=2)
    limit = never.cfg.dec_max_len  # 32
    for room in (1, 2, 5):
        prompt = [1] + list(range(3, 3 + limit - room - 1))
        assert len(prompt) == limit - room
        out = generate(never, [prompt], images[:1], max_new_tokens=20, method=method, num_beams=num_beams)
        assert len(out.sequences[0]) == room
        seq = out.sequences[0]
        assert out.scores[0] == pytest.approx(loglik(never, images[:1], prompt, seq, with_eos=False), abs=1e-4)
    # in a batch each prompt has its own room: a long prompt never shortens another row's output
    short, long = [1, 5], [1] + list(range(3, 3 + limit - 3))
    out = generate(never, [short, long], images[:2], max_new_tokens=20, method=method, num_beams=num_beams)
    assert [len(s) for s in out.sequences] == [20, 2]
    alone = generate(never, [short], images[:1], max_new_tokens=20, method=method, num_beams=num_beams)
    assert out.sequences[0] == alone.sequences[0] and out.scores[0] == pytest.approx(alone.scores[0], abs=1e-4)


# ---------------------------------------------------------------- scoring candidates and attention maps


def test_score_candidates_ranks_the_overfit_target_first():
    model, images, prompts, targets, _ = overfit_model()
    for i in range(8):
        scores = score_candidates(model, prompts[i], targets, images=images[i : i + 1])
        assert scores.shape == (8,)
        assert int(scores.argmax()) == i, (i, scores)
        # and the score is the log-likelihood greedy decoding reports for that target
        greedy = generate(model, [prompts[i]], images[i : i + 1], max_new_tokens=8)
        assert float(scores[i]) == pytest.approx(greedy.scores[0], abs=1e-4)


def test_score_candidates_equals_uncached_log_likelihood(model, images):
    cands = [[5], [30, 31, 32], [], [7, 7]]
    memory = model.encode(images[2:3])
    scores = score_candidates(model, PROMPTS[2], cands, memory=memory)
    for c, s in zip(cands, scores.tolist(), strict=True):
        assert s == pytest.approx(loglik(model, images[2:3], PROMPTS[2], c), abs=1e-4)
    assert torch.allclose(scores, score_candidates(model, PROMPTS[2], cands, images=images[2:3]))


def test_cross_attention_maps_shape_and_normalization(model, images):
    memory = model.encode(images)
    cfg = model.cfg
    n = (cfg.vit_image_size // cfg.vit_patch_size) ** 2 + 1  # patches + CLS
    gen = generate(model, PROMPTS[1:2], memory=memory[1:2], max_new_tokens=6).sequences[0]
    assert len(gen) > 0
    maps = cross_attention_maps(model, memory[1:2], PROMPTS[1], gen)
    assert maps.shape == (len(gen), cfg.dec_depth, cfg.dec_heads, n)
    torch.testing.assert_close(maps.sum(-1), torch.ones(len(gen), cfg.dec_depth, cfg.dec_heads))
    assert torch.all(maps >= 0)
    # token i's maps come from the query that predicted it: later tokens do not change them
    torch.testing.assert_close(cross_attention_maps(model, memory[1:2], PROMPTS[1], gen[:2]), maps[:2])
    # ... and that query is the last one of prompt + gen[:i]
    kv = model.memory_kv(memory[1:2])
    for i in range(len(gen)):
        _, layers = model.decoder(torch.as_tensor([PROMPTS[1] + gen[:i]]), kv, need_weights=True)
        want = torch.stack([w[0, :, -1] for w in layers])  # [L, H, N]
        torch.testing.assert_close(maps[i], want, atol=1e-6, rtol=1e-5)
    # and they depend on the image
    assert not torch.allclose(cross_attention_maps(model, memory[0:1], PROMPTS[1], gen), maps)


# ---------------------------------------------------------------- bad input


def test_empty_prompt_is_an_input_error(model, images):
    with pytest.raises(InputError, match="prompt"):
        generate(model, [[]], images[:1])
    with pytest.raises(InputError, match="prompt"):
        generate(model, [[1, 5], []], images[:2])
    with pytest.raises(InputError, match="prompt"):
        generate(model, [], images[:0])


def test_prompt_longer_than_the_maximum_is_an_input_error(model, images):
    limit = model.cfg.dec_max_len
    for n in (limit, limit + 5):
        for method in ("greedy", "beam"):
            with pytest.raises(InputError, match=f"dec_max_len={limit}"):
                generate(model, [[1] * n], images[:1], method=method, num_beams=2)
    with pytest.raises(InputError, match=f"dec_max_len={limit}"):
        score_candidates(model, [1] * (limit - 2), [[5, 6]], images=images[:1])


def test_cross_attention_maps_bad_input_is_an_input_error(model, images):
    memory = model.encode(images[:1])
    limit = model.cfg.dec_max_len
    with pytest.raises(InputError, match=f"dec_max_len={limit}"):
        cross_attention_maps(model, memory, [1] * (limit - 2), [5, 6, 7])
    with pytest.raises(InputError, match="prompt"):
        cross_attention_maps(model, memory, [], [5, 6])


def test_score_candidates_bad_input_is_an_input_error(model, images):
    with pytest.raises(InputError, match="candidates"):
        score_candidates(model, [1, 5], [], images=images[:1])
    with pytest.raises(InputError, match="prompt"):
        score_candidates(model, [], [[5]], images=images[:1])


def test_wrong_images_are_an_input_error_in_generate(model, images):
    with pytest.raises(InputError, match=r"\[B, 3, 32, 32\]"):
        generate(model, [[1, 5]], torch.randn(1, 3, 64, 64))
    with pytest.raises(InputError, match=r"\[B, 3, 32, 32\]"):
        generate(model, [[1, 5]], torch.randn(1, 1, 32, 32))
    with pytest.raises(InputError, match="2 images for 1 prompts"):
        generate(model, [[1, 5]], images[:2])
    with pytest.raises(InputError, match="images or memory"):
        generate(model, [[1, 5]])


def test_bad_generation_options_are_input_errors(model, images):
    for method in ("greedy", "beam"):
        with pytest.raises(InputError, match="max_new_tokens"):
            generate(model, [[1, 5]], images[:1], max_new_tokens=0, method=method)
    with pytest.raises(InputError, match="num_beams"):
        generate(model, [[1, 5]], images[:1], method="beam", num_beams=0)
    with pytest.raises(InputError, match="temperature"):
        generate(model, [[1, 5]], images[:1], method="sample", temperature=0.0)
    with pytest.raises(InputError, match="unknown decoding method 'nucleus'.*greedy, beam, sample"):
        generate(model, [[1, 5]], images[:1], method="nucleus")
    with pytest.raises(InputError, match="unknown GenerationConfig field.*'num_beam'.*did you mean 'num_beams'"):
        generate(model, [[1, 5]], images[:1], num_beam=2)


def test_tokenizer_prompts_empty_question_and_documented_truncation():
    from vqa.tokenizer import Tokenizer

    tok = Tokenizer.train(["a red circle above a blue square", "what colour is the circle ?", "two"], vocab_size=80)
    with pytest.raises(InputError, match="empty"):
        tok.vqa_prompt("   ")
    with pytest.raises(InputError, match="empty"):
        tok.vqa_prompt("")
    long = " ".join(["what colour is the red circle above the blue square"] * 10)
    prompt = tok.vqa_prompt(long, max_len=16)
    assert len(prompt) == 16 - 2  # documented: cut from the end, leaving room for an answer and <eos>
    assert prompt[:2] == [tok.bos_id, tok.question_id] and prompt[-1] == tok.answer_id
    assert prompt[2:-1] == tok.encode(long)[: 16 - 5]
    assert len(tok.vqa_prompt("two", max_len=16)) == 4  # a short question is left alone


def test_out_of_range_token_ids_and_image_index_are_clear_errors():
    from helpers import random_images, tiny_model

    model = tiny_model()
    images = random_images(2, model.cfg)
    with pytest.raises(InputError, match="outside the vocabulary"):
        generate(model, [[1, model.cfg.vocab_size]], images=images[:1])
    with pytest.raises(InputError, match="image_index"):
        generate(model, [[1], [1]], images=images, image_index=[0, 2])
    with pytest.raises(InputError, match="image_index"):
        generate(model, [[1], [1]], images=images, image_index=[0])


def test_bad_sampling_and_ranking_inputs_are_clear_errors():
    from helpers import random_images, tiny_model

    model = tiny_model()
    images = random_images(1, model.cfg)
    with pytest.raises(InputError, match="top_p"):
        generate(model, [[1]], images=images, method="sample", top_p=0.0)
    with pytest.raises(InputError, match="outside the vocabulary"):
        score_candidates(model, [1, 5], [[3], [model.cfg.vocab_size + 7]], images=images)


# ---------------------------------------------------------------- the compiled decode step


@torch.inference_mode()
def test_compiled_decode_step_equals_the_eager_one_at_every_step(model, images, quick_compile):
    """The same `decode_step` through torch.compile (inductor, weights frozen in) and eagerly: the same logits
    at every step for padded prompts, then the same greedy and beam results (9 beams padded to 16 rows)."""
    from vqa.decoding.batch import BatchDecoder

    kv = model.memory_kv(model.encode(images))
    config = GenerationConfig(max_new_tokens=8)
    eager, compiled = BatchDecoder(model, kv, PROMPTS, config), BatchDecoder(model, kv, PROMPTS, config, compiled=True)
    torch.testing.assert_close(compiled.logits, eager.logits)
    # a few static shapes: 3 rows padded to 4 (the extra row repeats row 0), the cache rounded up to 32 slots
    assert compiled.state.batch == 4 and compiled.state.slots == 32 and compiled.logits.shape[0] == 3
    for t in range(8):
        tok = eager.logits.argmax(-1)
        torch.testing.assert_close(compiled.step(tok), eager.step(tok), atol=1e-5, rtol=1e-5, msg=f"step {t}")
    assert compiled.compiled.failed is None  # really compiled, no fallback
    # greedy (4 rows), beam (16 rows), greedy again: after warm-up only the guards that tell graphs apart run
    # (SKIP_GUARDS), and they must still pick the 4-row graph after the 16-row one was built
    for kw in (dict(), dict(method="beam", num_beams=3), dict()):
        want, got = generate(model, PROMPTS, images, max_new_tokens=10, **kw), \
            generate(model, PROMPTS, images, max_new_tokens=10, compile=True, **kw)
        assert got.sequences == want.sequences
        assert [s for b in got.beams for s, _ in b] == [s for b in want.beams for s, _ in b]
        assert got.scores == pytest.approx(want.scores, abs=1e-4)


@torch.inference_mode()
def test_compiled_image_encoder_equals_the_eager_one_for_any_batch(model, images):
    """The float32 encoder compiled (batches padded to a power of two with zero images, dropped after) gives
    the eager encoder's memory for 3 images (padded to 4) and for 1."""
    from vqa.decoding.compiled import _encoders, encode

    for batch in (images, images[:1]):
        torch.testing.assert_close(encode(model, batch, compile=True), model.encode(batch), atol=1e-5, rtol=1e-5)
    assert _encoders[model].failed is None  # really compiled


def test_compiled_step_that_cannot_be_built_decodes_eagerly(model, images, monkeypatch):
    """Where inductor cannot compile (no C++ compiler, say): a warning, then the eager step's very result."""
    import torch._inductor.exc

    from vqa.decoding.compiled import compiled_step

    step = compiled_step(model.decoder)
    monkeypatch.setattr(step, "failed", None)

    def broken(*args, **kwargs):
        raise torch._inductor.exc.InductorError(RuntimeError("no C++ compiler"), None)

    monkeypatch.setattr(step, "fn", broken)
    want = generate(model, PROMPTS, images, max_new_tokens=10)
    with pytest.warns(RuntimeWarning, match="could not be built.*decoding eagerly"):
        got = generate(model, PROMPTS, images, max_new_tokens=10, compile=True)
    assert got.sequences == want.sequences and got.scores == pytest.approx(want.scores, abs=1e-5)
    assert "no C++ compiler" in step.failed


# ---------------------------------------------------------------- a constrained vocabulary


def ref_greedy_in_vocab(model, image, prompt, max_new, vocab):
    """Uncached greedy decoding where only `vocab` may follow: log-softmax over those tokens alone."""
    eos, seq, score = model.cfg.eos_id, [], 0.0
    allowed = torch.as_tensor(vocab)
    for _ in range(_room(model, prompt, max_new)):
        with torch.no_grad():
            logits = model(image, torch.as_tensor([prompt + seq])).logits[0, -1].float()
        logp = logits[allowed].log_softmax(-1)
        i = int(logp.argmax())
        tok, score = vocab[i], score + float(logp[i])
        if tok == eos:
            break
        seq.append(tok)
    return seq, score


def test_a_constrained_vocabulary_decodes_over_its_tokens_alone(model, images):
    vocab = [5, 9, 17, 23, 31, 40]  # <eos> (3) is added: every output must be able to end
    free = generate(model, PROMPTS, images, max_new_tokens=10)
    out = generate(model, PROMPTS, images, max_new_tokens=10, vocab=vocab)
    for i, prompt in enumerate(PROMPTS):
        seq, score = ref_greedy_in_vocab(model, images[i : i + 1], prompt, 10, sorted(vocab + [EOS]))
        assert out.sequences[i] == seq, f"prompt {i}"
        assert out.scores[i] == pytest.approx(score, abs=1e-4)
    assert all(t in vocab for s in out.sequences for t in s)
    assert out.sequences != free.sequences  # the restriction mattered here
    beam = generate(model, PROMPTS, images, max_new_tokens=10, vocab=vocab, method="beam", num_beams=3)
    assert all(t in vocab for b in beam.beams for s, _ in b for t in s)
    one = generate(model, PROMPTS, images, max_new_tokens=10, vocab=vocab, method="beam", num_beams=1,
                   length_penalty=0.0)
    assert one.sequences == out.sequences
    # the whole vocabulary is no restriction
    every = generate(model, PROMPTS, images, max_new_tokens=10, vocab=torch.arange(model.cfg.vocab_size))
    assert every.sequences == free.sequences and every.scores == pytest.approx(free.scores, abs=1e-5)
    with pytest.raises(InputError, match="outside the vocabulary"):
        generate(model, PROMPTS, images, vocab=[5, model.cfg.vocab_size])


def test_decode_state_allocates_every_buffer_with_the_dtype_and_device_asked():
    from helpers import tiny_config

    from vqa.decoding.step import DecodeState

    cfg = tiny_config()
    s = DecodeState.allocate(cfg, batch=3, slots=7, dtype=torch.float64, device="meta")
    assert len(s.k) == len(s.v) == cfg.dec_depth
    shape = (3, cfg.dec_heads, 7, cfg.dec_width // cfg.dec_heads)
    assert all(t.shape == shape and t.dtype == torch.float64 for t in (*s.k, *s.v))
    assert (s.key_valid.dtype, s.pos.dtype, s.slot.dtype) == (torch.bool, torch.long, torch.long)
    assert all(t.device.type == "meta" for t in s.tensors())  # every buffer where the model is
    assert (s.batch, s.slots) == (3, 7)
