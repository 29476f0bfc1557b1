"""The compiled decode step and image encoder (torch.compile, inductor): the same logits and results as the
eager ones at every step and for any batch, and an eager fallback, with a warning, where they cannot be built.
Logits are compared within 1e-5 (inductor fuses and reorders float32 arithmetic); tokens and beams exactly,
which holds on every CPU because the lively model's choices are no near-ties (test_generate.py's
test_the_lively_models_choices_are_not_near_ties covers these prompts and settings). int8's compiled path is
test_precision.py's.
(Deselected under mutmut, which torch.compile cannot trace: pyproject.toml's [tool.mutmut].)"""

from __future__ import annotations

import pytest
import torch
from generate_fixtures import PROMPTS

from vqa.config import GenerationConfig
from vqa.decoding.generate import generate


@torch.inference_mode()
def test_compiled_decode_step_equals_the_eager_one_at_every_step(model, images, quick_compile):
    """The same `decode_step` through torch.compile (inductor, weights frozen in) and eagerly: the same logits
    at every step for padded prompts, then the same greedy and beam results (9 beams padded to 16 rows)."""
    from vqa.decoding.batch import DecodingBatch

    kv = model.memory_kv(model.encode(images))
    config = GenerationConfig(max_new_tokens=8)
    eager = DecodingBatch(model, kv, PROMPTS, config)
    compiled = DecodingBatch(model, kv, PROMPTS, config, compiled=True)
    torch.testing.assert_close(compiled.logits, eager.logits)
    # a few static shapes: 3 rows padded to 4 (the extra row repeats row 0), the cache at its smallest length
    # (MIN_SLOTS, 64)
    assert compiled.cache.batch == 4 and compiled.cache.slots == 64 and compiled.logits.shape[0] == 3
    for t in range(8):
        tok = eager.logits.argmax(-1)
        torch.testing.assert_close(compiled.step(tok), eager.step(tok), atol=1e-5, rtol=1e-5, msg=f"step {t}")
    assert compiled.compiled_step.failed is None  # really compiled, no fallback
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

    from vqa.decoding.batch import compiled_step

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


def test_the_compiled_cache_is_as_long_as_the_request_can_write(images):
    """A compiled decoding caches the prompt plus the longest output the request allows, in a few lengths
    (MIN_SLOTS, then powers of two): a 1,024-position decoder writing 16 tokens caches 64 slots, not 1,024;
    the default caption budget (64 tokens) is what a long context caches for a caption."""
    from helpers import lively_model

    from vqa.decoding.batch import DecodingBatch

    model = lively_model(dec_max_len=1024)
    kv = model.memory_kv(model.encode(images[:1]))

    def slots(prompt_len: int, config: GenerationConfig) -> int:
        return DecodingBatch(model, kv, [[1] * prompt_len], config, compiled=True).cache.slots

    assert slots(1, GenerationConfig(max_new_tokens=16)) == 64  # 1 + 15 slots written: the smallest cache
    assert slots(49, GenerationConfig(max_new_tokens=16)) == 64  # 49 + 15 = 64
    assert slots(50, GenerationConfig(max_new_tokens=16)) == 128
    assert slots(100, GenerationConfig(max_new_tokens=30)) == 256  # 129 slots
    caption = GenerationConfig.for_task("caption")
    assert caption.budget(1023) == 64 and slots(1, caption) == 64
    assert slots(1000, caption) == 1024  # 1,000 + 23 (the context left): the whole context, no more


@torch.inference_mode()
def test_prompts_of_different_lengths_writing_past_the_context_decode_like_eager(quick_compile):
    """Left-padded rows share cache slots: a 2-token prompt's budget counts from the 57-token prompt's end, so
    the batch writes 57 + 39 = 96 slots, more than the 64 that a context of 60 rounds up to. Compiled, greedy
    and beam search give the eager (uncached-equal) results."""
    from helpers import lively_model, random_images

    model = lively_model(seed=7, eos_id=3, dec_max_len=60)
    prompts = [[1, 5], [1] + [4 + i % 40 for i in range(56)]]  # 2 and 57 tokens: budgets 40 and 3
    images = random_images(2, model.cfg, seed=7)
    for kw in (dict(), dict(method="beam", num_beams=2)):
        want = generate(model, prompts, images, max_new_tokens=40, **kw)
        got = generate(model, prompts, images, max_new_tokens=40, compile=True, **kw)
        assert got.sequences == want.sequences and max(len(s) for s in want.sequences) > 2, kw
        assert got.scores == pytest.approx(want.scores, abs=1e-4)


@torch.inference_mode()
def test_a_compiled_decoding_holds_the_compiled_step_for_its_whole_run(model, images, quick_compile, monkeypatch):
    """The compiled step's pooled buffers serve one decoding at a time: its lock is held while the method runs
    (and taken by nothing when decoding eagerly, whose buffers are its own)."""
    import vqa.decoding.generate as generation
    from vqa.decoding.batch import compiled_step

    held, greedy = [], generation.METHODS["greedy"]

    def spy(decoder, config):
        held.append(compiled_step(model.decoder).lock.locked())
        return greedy(decoder, config)

    monkeypatch.setitem(generation.METHODS, "greedy", spy)
    want = generate(model, PROMPTS, images, max_new_tokens=4)
    assert generate(model, PROMPTS, images, max_new_tokens=4, compile=True).sequences == want.sequences
    assert held == [False, True] and not compiled_step(model.decoder).lock.locked()
