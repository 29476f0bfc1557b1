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

    from vqa.decoding.batch import compiled_step
    from vqa.decoding.compiled import CompiledStep
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
    assert len(compiled_step(model.decoder)._buffers) == 2 and compiled_step(model.decoder).failed is None


def test_a_background_warm_up_answers_eagerly_meanwhile_then_switches_to_the_compiled_step(quick_compile,
                                                                                            monkeypatch):
    """BackgroundWarmUp: the Predictor answers (eagerly) while the graphs are being built, in another thread;
    afterwards it decodes compiled, with the eager answers, and no request compiles anything."""
    import threading

    from torch._dynamo.utils import counters

    import vqa.inference.warmup as W

    ckpt = shared_checkpoint()
    want = _results(Predictor.from_pretrained(ckpt, device="cpu", compile=False))
    go, building = threading.Event(), threading.Event()
    real_build = W._build

    def gated_build(*args):
        building.set()
        assert go.wait(60)
        return real_build(*args)

    monkeypatch.setattr(W, "_build", gated_build)
    p = Predictor.from_pretrained(ckpt, device="cpu", compile=True)
    job = W.BackgroundWarmUp(p, max_batch=1, max_beams=1)  # one shape: one image, one row
    assert building.wait(60) and not p.compile  # eager until the graphs exist
    assert _results(p) == want and not job.done.is_set()  # answered while the warm-up waits to start
    go.set()
    answered_while_compiling = 0
    while not job.done.is_set():  # requests in this thread while the other one compiles
        assert _results(p) == want
        answered_while_compiling += not job.done.is_set()
    assert answered_while_compiling > 0  # the premise: some answers were given while compiling
    assert job.wait(0) and job.error is None
    assert job.result.shapes == 1 and job.result.seconds > 0 and p.compile
    built = counters["stats"]["unique_graphs"]
    assert built > 0
    one = draw(list(ITEMS)[1])
    assert p.caption(one).caption == want[-1]  # one image, one row: the shape built
    assert counters["stats"]["unique_graphs"] == built  # through the graphs the warm-up built


def test_a_failed_background_warm_up_leaves_the_predictor_answering_eagerly(monkeypatch):
    import vqa.inference.warmup as W

    def broken(*args):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(W, "_build", broken)
    ckpt = shared_checkpoint()
    p = Predictor.from_pretrained(ckpt, device="cpu", compile=True)
    reports = []
    with pytest.warns(RuntimeWarning, match="compiling the model failed .*no C\\+\\+ compiler.*answering eagerly"):
        job = W.BackgroundWarmUp(p, on_done=reports.append)
        assert job.wait(60)
    assert reports == [job] and job.result is None and "no C++ compiler" in str(job.error)
    assert not p.compile
    eager = Predictor.from_pretrained(ckpt, device="cpu", compile=False)
    assert _results(p) == _results(eager)
    idle = W.BackgroundWarmUp(eager)  # nothing to build: no thread
    assert idle.wait(0) and idle.result == W.WarmUp(0, 0.0) and not hasattr(idle, "thread")


def test_the_demo_compiles_in_the_background_on_a_cpu_and_says_so(monkeypatch, capsys):
    import vqa.inference.warmup as W
    from vqa.demo.server import start_warm_up

    monkeypatch.setattr(W, "_build", lambda pred, max_batch, max_beams: 3)  # the graphs, quickly
    p = Predictor.from_pretrained(shared_checkpoint(), device="cpu", compile=True)
    assert start_warm_up(None, 4) is None
    job = start_warm_up(p, 4, prog="app.py")
    assert isinstance(job, W.BackgroundWarmUp) and job.wait(60)
    assert p.compile and job.result.shapes == 3
    err = capsys.readouterr().err
    assert "in the background" in err and "answering eagerly until then" in err
    assert "app.py: compiled 3 batch shapes in" in err
    p.compile = False
    assert start_warm_up(p, 4) is None  # an eager Predictor: nothing to do


def test_the_warm_up_builds_the_cache_lengths_requests_need():
    """A 1,024-position captioner's warm-up builds the 64-slot cache its captions use (the default budget of
    64 tokens after a one-token prompt), not the whole context; answers to questions of up to WARM_PROMPT
    tokens share it, with and without the answer vocabulary; a 48-position model caches at most 64."""
    from types import SimpleNamespace

    from helpers import tiny_config

    from vqa.inference.warmup import WARM_PROMPT, cache_lengths

    def pred(limit, tasks, vocab=None):
        return SimpleNamespace(cfg=tiny_config(dec_max_len=limit), tasks=tasks, answer_vocab=vocab,
                               tokenizer=SimpleNamespace(caption_prompt=lambda: [1]))

    vocab = torch.tensor([3, 4, 5])
    assert cache_lengths(pred(1024, ("caption",))) == {64: [None]}
    lengths = cache_lengths(pred(1024, ("vqa", "caption"), vocab))
    assert list(lengths) == [64] and lengths[64][0] is None and lengths[64][1] is vocab and len(lengths[64]) == 2
    assert WARM_PROMPT + 10 - 1 <= 64
    assert cache_lengths(pred(48, ("vqa", "caption"))) == {64: [None]}
