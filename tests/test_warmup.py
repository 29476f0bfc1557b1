"""A server that decodes compiled builds every graph at start-up (vqa.inference.warmup): after the warm-up no
request compiles anything, and the answers are the eager ones."""

from __future__ import annotations

import pytest
import torch
from predict_fixtures import COLOR_Q, ITEMS, SHAPE_Q, draw, shared_checkpoint

from vqa.inference.predict import Predictor
from vqa.inference.warmup import warm_up

pytestmark = pytest.mark.slow


def _results(p):
    a, b = list(ITEMS)
    answers = p.answer_batch([draw(a), draw(b)], [COLOR_Q, SHAPE_Q], top_k=2)
    captions = p.caption_batch([draw(a), draw(b)]) + [p.caption(draw(b))]
    return [x.answer for x in answers] + [c.caption for c in captions]


def test_after_the_warm_up_no_request_compiles_and_answers_are_the_eager_ones(quick_compile):
    from torch._dynamo.utils import counters

    ckpt = shared_checkpoint()
    eager = Predictor.from_pretrained(ckpt, device="cpu", compile=False)
    assert warm_up(eager).shapes == 0  # nothing to compile
    p = Predictor.from_pretrained(ckpt, device="cpu", compile=True)
    w = warm_up(p, max_batch=2, max_beams=3)
    assert w.shapes == 4 and w.seconds > 0  # 1, 2, 4 and 8 rows (2 questions x 3 beams, padded to 8)
    built = counters["stats"]["unique_graphs"]
    assert built > 0
    assert _results(p) == _results(eager)
    assert counters["stats"]["unique_graphs"] == built  # no request compiled anything


@torch.inference_mode()
def test_a_batch_shape_whose_buffers_were_evicted_decodes_like_eager_when_it_returns(quick_compile, monkeypatch):
    """The compiled step keeps state buffers for POOL shapes (16; 2 here): cycling through three shapes twice
    evicts each one's buffers before it returns, and every decoding still equals the eager one."""
    from helpers import lively_model, random_images

    from vqa.decoding.compiled import CompiledStep, compiled_step
    from vqa.decoding.generate import generate

    monkeypatch.setattr(CompiledStep, "POOL", 2)
    model = lively_model(seed=5, eos_id=3)
    prompts = [[1, 5], [1, 7, 8, 9], [1, 12, 13], [1, 4, 4, 6, 9]]
    for n in (1, 2, 4, 1, 2, 4):  # 1, 2 and 4 rows: three shapes, buffers for two
        images = random_images(n, model.cfg, seed=n)
        want = generate(model, prompts[:n], images, max_new_tokens=6)
        got = generate(model, prompts[:n], images, max_new_tokens=6, compile=True)
        assert got.sequences == want.sequences, n
        assert got.scores == pytest.approx(want.scores, abs=1e-4)
    assert len(compiled_step(model.decoder)._states) == 2 and compiled_step(model.decoder).failed is None
