"""A server that decodes compiled builds every graph at start-up (vqa.inference.warmup): after the warm-up no
request compiles anything, and the answers are the eager ones."""

from __future__ import annotations

import pytest
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
