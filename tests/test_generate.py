"""Generation: cached greedy decoding against the uncached reference, padding, stopping and the length limits,
candidate scoring, cross-attention maps, a constrained vocabulary and the decode state's buffers. Beams,
sampling, the compiled step and bad input have their own files (test_generate_beam.py,
test_generate_sampling.py, test_generate_compiled.py, test_generate_errors.py); the prompts and references
they share are in generate_fixtures.py, the `model` and `images` fixtures in conftest.py.

Why the exact token comparisons here (cached against uncached, a padded batch against its prompts one by one)
and in test_generate_beam.py and test_generate_compiled.py hold on every CPU: the two sides differ only by
float32 rounding, far below SCORE_TOL, and `test_the_lively_models_choices_are_not_near_ties` checks that every
choice they make is decided by more than twice SCORE_TOL. Scores are compared within SCORE_TOL."""

from __future__ import annotations

import pytest
import torch
from generate_fixtures import EOS, PROMPTS, loglik, ref_beam, ref_greedy, ref_greedy_in_vocab
from helpers import lively_model, overfit_model, random_images

from vqa.decoding.generate import cross_attention_maps, generate, score_candidates
from vqa.errors import InputError

# ---------------------------------------------------------------- cached == uncached


def test_the_lively_model_is_a_meaningful_test_subject(model, images):
    """The references below only mean something if outputs vary: rows end at <eos> at different steps, and
    tokens depend on context, not only on the last token."""
    out = generate(model, PROMPTS, images, max_new_tokens=10)
    lengths = [len(s) for s in out.sequences]
    assert min(lengths) < 10 and max(lengths) == 10, out.sequences
    assert any(len(set(s)) > 2 for s in out.sequences)


# the most that two numeric paths (cached / uncached, batched / alone, compiled / eager, one CPU / another) may
# differ in a score in test_generate*.py; a choice decided by more than twice that cannot flip between them
SCORE_TOL = 1e-4
NEAR_TIE = 2 * SCORE_TOL


def test_the_lively_models_choices_are_not_near_ties(model, images):
    """The exact token comparisons of test_generate*.py hold on every CPU because no choice they make is a
    near-tie: along the uncached references, every greedy margin and every score gap where a beam's rank decides
    something exceeds NEAR_TIE, for each model and setting those tests decode with."""
    gaps: list[float] = []
    for variant in (dict(), dict(dec_positions="learned"), dict(dec_qk_norm=True)):
        m = lively_model(eos_id=EOS, **variant) if variant else model
        for i, prompt in enumerate(PROMPTS):
            ref_greedy(m, random_images(len(PROMPTS), m.cfg)[i : i + 1], prompt, 10, gaps=gaps)
    for k, penalty, max_new in ((2, 1.0, 7), (3, 1.0, 7), (3, 0.0, 7), (3, 2.0, 7), (3, 1.0, 10)):
        for i, prompt in enumerate(PROMPTS):
            ref_beam(model, images[i : i + 1], prompt, max_new, k, penalty, gaps=gaps)
    long = lively_model(seed=7, eos_id=3, dec_max_len=60)  # test_generate_compiled.py's prompts past the context
    for i, prompt in enumerate([[1, 5], [1] + [4 + i % 40 for i in range(56)]]):
        image = random_images(2, long.cfg, seed=7)[i : i + 1]
        ref_greedy(long, image, prompt, 40, gaps=gaps)
        ref_beam(long, image, prompt, 40, 2, 1.0, gaps=gaps)
    assert len(gaps) > 100 and min(gaps) > NEAR_TIE, sorted(gaps)[:5]


@pytest.mark.parametrize("positions,qk_norm", [("sinusoidal", False), ("learned", False), ("sinusoidal", True)])
def test_cached_greedy_equals_uncached_reference(positions, qk_norm):
    model = lively_model(eos_id=EOS, dec_positions=positions, dec_qk_norm=qk_norm)
    images = random_images(len(PROMPTS), model.cfg)
    out = generate(model, PROMPTS, images, max_new_tokens=10)
    for i, prompt in enumerate(PROMPTS):
        seq, score = ref_greedy(model, images[i : i + 1], prompt, 10)
        assert out.sequences[i] == seq, f"prompt {i}"
        assert out.scores[i] == pytest.approx(score, abs=1e-4)


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


# ---------------------------------------------------------------- a constrained vocabulary


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

    from vqa.decoding.batch import CacheBuffers

    cfg = tiny_config()
    s = CacheBuffers.allocate(cfg, batch=3, slots=7, dtype=torch.float64, device="meta")
    assert len(s.k) == len(s.v) == cfg.dec_depth
    shape = (3, cfg.dec_heads, 7, cfg.dec_width // cfg.dec_heads)
    assert all(t.shape == shape and t.dtype == torch.float64 for t in (*s.k, *s.v))
    assert (s.key_valid.dtype, s.pos.dtype, s.slot.dtype) == (torch.bool, torch.long, torch.long)
    assert all(t.device.type == "meta" for t in s.tensors())  # every buffer where the model is
    assert (s.batch, s.slots) == (3, 7)
