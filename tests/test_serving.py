"""The batching layer (vqa.inference.serving): concurrent requests share one batched call, each caller gets exactly its
own result (or its own error), the pending queue is bounded, and a batched answer is the one-by-one answer:
same answers, same probabilities, same attention maps, for mixed questions and pictures."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from predict_fixtures import COLOR_Q, SHAPE_Q, draw, shared_checkpoint

from vqa.errors import InputError
from vqa.inference.serving import Busy, RequestBatcher, SharedPredictor


def _wait_until(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.002)


def _count_submissions(batcher) -> list:
    """Make `batcher` record each submission (in a list, returned) before queueing it."""
    seen, real = [], batcher.submit

    def submit(key, item):
        future = real(key, item)
        seen.append(key)
        return future

    batcher.submit = submit
    return seen


def _gated(calls):
    """run_batch that records its batches and waits for `gate` on the first call (so others queue)."""
    gate = threading.Event()

    def run(key, items):
        calls.append((key, list(items)))
        if len(calls) == 1:
            gate.wait(10)
        if any(i == "bad" for i in items):
            raise ValueError("bad item")
        return [f"{key}:{i}" for i in items]

    return run, gate


def _held_batcher(max_batch: int = 8):
    """A batcher whose first call (key "k", item 0) is running and held at the gate: what is submitted next
    queues up behind it. Returns (batcher, the calls made, the gate)."""
    calls = []
    run, gate = _gated(calls)
    b = RequestBatcher(run, max_batch=max_batch, max_wait=0.0)
    b.submit("k", 0)
    _wait_until(lambda: len(calls) == 1)
    return b, calls, gate


def test_requests_that_wait_together_are_answered_by_one_call_each_with_its_own_result():
    calls = []
    run, gate = _gated(calls)
    b = RequestBatcher(run, max_batch=8, max_wait=0.0)
    first = b.submit("k", 0)
    _wait_until(lambda: len(calls) == 1)  # the worker is busy with the first request
    futures = [b.submit("k", i) for i in range(1, 6)]
    gate.set()
    assert first.result(5) == "k:0"
    assert [f.result(5) for f in futures] == [f"k:{i}" for i in range(1, 6)]
    assert [len(items) for _, items in calls] == [1, 5]  # the five waiting ones went in one call
    assert b.largest == 5


def test_different_keys_never_share_a_call_and_max_batch_is_respected():
    calls = []
    run, gate = _gated(calls)
    b = RequestBatcher(run, max_batch=3, max_wait=0.0)
    b.submit("x", -1)
    _wait_until(lambda: len(calls) == 1)
    futures = [b.submit("a" if i % 2 else "b", i) for i in range(8)]
    gate.set()
    assert [f.result(5) for f in futures] == [f"{'a' if i % 2 else 'b'}:{i}" for i in range(8)]
    for key, items in calls[1:]:
        assert len(items) <= 3 and all(f"{key}:{i}" == f"{'a' if i % 2 else 'b'}:{i}" for i in items)
    assert len(calls) > 3  # 8 requests in batches of at most 3, split by key


def test_a_bad_request_fails_alone():
    b, calls, gate = _held_batcher(max_batch=8)
    good1, bad, good2 = b.submit("k", 1), b.submit("k", "bad"), b.submit("k", 2)
    gate.set()
    assert good1.result(5) == "k:1" and good2.result(5) == "k:2"
    with pytest.raises(ValueError, match="bad item"):
        bad.result(5)


def test_the_pending_queue_is_bounded_with_a_message_for_people():
    calls = []
    run, gate = _gated(calls)
    b = RequestBatcher(run, max_batch=1, max_wait=0.0, max_pending=2)
    b.submit("k", 0)
    _wait_until(lambda: len(calls) == 1)
    waiting = [b.submit("k", 1), b.submit("k", 2)]
    with pytest.raises(Busy, match="busy.*try again"):
        b.submit("k", 3)
    gate.set()
    assert [f.result(5) for f in waiting] == ["k:1", "k:2"]


def test_the_batch_wait_lets_requests_that_arrive_together_share_a_call():
    calls = []
    b = RequestBatcher(lambda k, items: calls.append(len(items)) or list(items), max_batch=16, max_wait=0.5)
    futures = []
    threads = [threading.Thread(target=lambda i=i: futures.append(b.submit("k", i))) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(f.result(5) for f in futures) == list(range(6))
    assert calls == [6]  # all six within the half-second wait: one call


# ------------------------------------------------------------------------------------------- the predictor


@pytest.fixture(scope="module")
def pred():
    from vqa.inference.predict import Predictor

    return Predictor.from_pretrained(shared_checkpoint(), device="cpu")


def _mixed():
    """Mixed pictures (two kinds, three sizes, so different encodings and letterboxes) and questions."""
    pics = [draw("red_circle"), draw("blue_square", (40, 56)), draw("red_circle", (64, 30)),
            draw("blue_square")]
    qs = [COLOR_Q, SHAPE_Q, "is it red?", COLOR_Q + " please tell me", SHAPE_Q, COLOR_Q]
    return [(pics[i % len(pics)], qs[i % len(qs)], 1 + i % 3) for i in range(10)]


def _same(a, b):
    assert a.answer == b.answer
    assert [t for t, _ in a.top_k] == [t for t, _ in b.top_k]
    np.testing.assert_allclose([p for _, p in a.top_k], [p for _, p in b.top_k], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(a.attention, b.attention, rtol=1e-4, atol=1e-6)


def test_batched_answers_equal_one_by_one_answers_for_mixed_questions_and_pictures(pred):
    jobs = _mixed()
    alone = [pred.answer(img, q, top_k=k, return_attention=True) for img, q, k in jobs]
    server = SharedPredictor(pred, max_batch=16, max_wait=0.0)
    submitted = _count_submissions(server.batcher)
    results = [None] * len(jobs)
    with pred._lock:  # hold the model so every request is waiting when the batch starts
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, server.answer(*jobs[i])))
                   for i in range(len(jobs))]
        for t in threads:
            t.start()
        _wait_until(lambda: len(submitted) == len(jobs))
    for t in threads:
        t.join(30)
    # the first batch may have started with the few that were there; the rest were answered together
    assert server.batcher.batches <= 2 and server.batcher.largest >= len(jobs) // 2
    for (res, ratio), one in zip(results, alone, strict=True):
        assert ratio is None  # no familiarity reference given
        _same(res, one)
    assert len({r.answer for r, _ in results}) > 1  # mixed pictures gave different answers


def _calls_of(server) -> list:
    """Make `server`'s batcher record each batched call as (generation method, number of items)."""
    calls, real = [], server.batcher.run_batch

    def run(key, items):
        calls.append((items[0][1].method, len(items)))
        return real(key, items)

    server.batcher.run_batch = run
    return calls


def _at_once(fn, args) -> list:
    """fn(*a) for each a in `args`, from threads started together; the results in order."""
    out = [None] * len(args)
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, fn(*args[i]))) for i in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_batched_captions_equal_one_by_one_and_samples_are_never_batched(pred):
    from vqa.config import GenerationConfig

    pics = [draw("red_circle"), draw("blue_square", (40, 56)), draw("red_circle", (30, 64))]
    greedy = GenerationConfig.for_task("caption")
    # max_batch = the number of requests and a long wait: the batch closes when all three are there
    server = SharedPredictor(pred, max_batch=3, max_wait=10.0)
    calls = _calls_of(server)
    out = _at_once(server.caption, [(p, greedy) for p in pics])
    assert calls == [("greedy", 3)]  # the three greedy captions went in one call ...
    for (res, _), img in zip(out, pics, strict=True):  # ... and each is its one-by-one caption
        one = pred.caption(img, greedy, return_attention=True)
        assert res.caption == one.caption and res.log_prob == pytest.approx(one.log_prob, rel=1e-5, abs=1e-6)
        torch.testing.assert_close(res.attention, one.attention, rtol=1e-4, atol=1e-6)

    # two identical seeded samples asked at once, with room for both in a batch: each gets a call of its own
    sample = greedy.replace(method="sample", temperature=2.0, seed=3)
    server = SharedPredictor(pred, max_batch=2, max_wait=10.0)
    calls = _calls_of(server)
    (a, _), (b, _) = _at_once(server.caption, [(pics[0], sample)] * 2)
    assert calls == [("sample", 1), ("sample", 1)]
    assert a.caption == b.caption == pred.caption(pics[0], sample).caption


def test_a_seeded_sampled_answer_is_the_same_alone_and_among_others(pred):
    """Sampled answers in one batched call would share one random generator, so a seeded answer would depend on
    what else was in the batch: each sampled request gets a call, and so a generator, of its own."""
    from vqa.config import GenerationConfig

    pics = [draw("red_circle"), draw("blue_square", (40, 56)), draw("red_circle", (30, 64)), draw("blue_square")]
    qs = [COLOR_Q, SHAPE_Q, "is it red?", COLOR_Q]
    for seeds in ((11, 12, 13, 14), (5, 5, 5, 5), (40, 41, 42, 43)):
        jobs = [(pic, q, 1, GenerationConfig.for_task("vqa", method="sample", temperature=2.0, seed=seed))
                for pic, q, seed in zip(pics, qs, seeds, strict=True)]
        alone = [pred.answer(img, q, top_k=k, generation=g).answer for img, q, k, g in jobs]
        server = SharedPredictor(pred, max_batch=len(jobs), max_wait=10.0)  # room for all four in one call
        calls = _calls_of(server)
        together = [res.answer for res, _ in _at_once(server.answer, jobs)]
        assert together == alone, seeds
        assert calls == [("sample", 1)] * len(jobs)


def test_bad_input_reaches_only_its_caller(pred):
    server = SharedPredictor(pred, max_batch=8, max_wait=0.2)
    out = {}

    def call(name, q):
        try:
            out[name] = server.answer(draw("red_circle"), q, 1)[0].answer
        except InputError as e:
            out[name] = e

    threads = [threading.Thread(target=call, args=("good", COLOR_Q)), threading.Thread(target=call, args=("bad", "  "))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out["good"] == "red"
    assert isinstance(out["bad"], InputError) and "empty" in str(out["bad"])


# ------------------------------------------------------------------ settings, messages and the plumbing
# (cases the mutation run, make mutation, showed unchecked)


def test_batcher_defaults_and_bad_settings():
    b = RequestBatcher(lambda k, items: list(items))
    assert (b.max_batch, b.max_wait, b.max_pending, b.name) == (16, 0.01, None, "vqa-batcher")
    assert b.batches == b.largest == 0  # nothing answered yet
    with pytest.raises(ValueError, match=r"^max_batch must be at least 1, got 0$"):
        RequestBatcher(lambda k, items: items, max_batch=0)
    with pytest.raises(ValueError, match=r"^max_wait must be >= 0 seconds, got -1$"):
        RequestBatcher(lambda k, items: items, max_wait=-1)


def test_the_worker_is_a_named_daemon_and_counts_its_calls():
    b, calls, gate = _held_batcher(max_batch=8)
    assert b._worker.name == "vqa-batcher" and b._worker.daemon  # never keeps the process alive
    futures = [b.submit("k", i) for i in range(1, 4)]
    gate.set()
    assert [f.result(5) for f in futures] == ["k:1", "k:2", "k:3"]
    assert b.batches == 2 and b.largest == 3


def test_max_batch_caps_one_key_too():
    b, calls, gate = _held_batcher(max_batch=2)
    futures = [b.submit("k", i) for i in range(1, 6)]
    gate.set()
    assert [f.result(5) for f in futures] == [f"k:{i}" for i in range(1, 6)]
    assert [len(items) for _, items in calls] == [1, 2, 2, 1]


def test_the_busy_message_and_the_call_timeout():
    calls = []
    run, gate = _gated(calls)
    b = RequestBatcher(run, max_batch=1, max_wait=0.0, max_pending=1)
    b.submit("k", 0)
    _wait_until(lambda: len(calls) == 1)
    b.submit("k", 1)
    with pytest.raises(Busy) as e:
        b.submit("k", 2)
    assert str(e.value) == "The demo is busy: 1 questions are waiting. Please try again in a few seconds."
    b.max_pending = None
    from concurrent.futures import TimeoutError as FutureTimeout

    with pytest.raises(FutureTimeout):
        b("k", 3, timeout=0.05)  # the caller's timeout is honoured while the worker is busy
    gate.set()


def test_a_lone_bad_request_and_a_wrong_result_count_reach_their_caller():
    b = RequestBatcher(lambda k, items: [1 / 0 for _ in items], max_wait=0.0)
    with pytest.raises(ZeroDivisionError):
        b("k", 1, timeout=5)
    short = RequestBatcher(lambda k, items: [], max_wait=0.0)
    with pytest.raises(RuntimeError, match=r"^run_batch returned 0 results for 1 requests$"):
        short("k", 1, timeout=5)


class _FakePredictor:
    """Records what SharedPredictor asks of a Predictor; answers with values that name their inputs."""

    def __init__(self):
        self._lock, self.calls = threading.RLock(), []

    def answer_settings(self, top_k, generation):
        from vqa.config import GenerationConfig

        self.calls.append(("settings", top_k, generation))
        return generation or GenerationConfig.for_task("vqa", method="beam", num_beams=max(top_k, 3))

    def answer_batch(self, images, questions, top_k, generation, return_attention):
        from types import SimpleNamespace

        self.calls.append(("answer", list(images), list(questions), top_k, generation, return_attention))
        return [SimpleNamespace(top_k=[(f"{q}{i}", 0.1) for i in range(top_k)]) for q in questions]

    def caption_batch(self, images, settings, return_attention):
        self.calls.append(("caption", list(images), settings, return_attention))
        return [f"caption of {img}" for img in images]

    def image_features(self, images):
        return np.array([[float(img)] for img in images])


class _Ratio:
    def ratio(self, features):
        return features[:, 0] * 10


def test_batched_predictor_passes_its_settings_through():
    from vqa.config import GenerationConfig

    server = SharedPredictor(_FakePredictor())
    assert (server.batcher.max_batch, server.batcher.max_wait, server.batcher.max_pending) == (16, 0.01, None)
    server = SharedPredictor(_FakePredictor(), max_batch=3, max_wait=0.5, max_pending=7)
    assert (server.batcher.max_batch, server.batcher.max_wait, server.batcher.max_pending) == (3, 0.5, 7)

    fake = _FakePredictor()
    server = SharedPredictor(fake, max_wait=0.0, attention=False)
    res, ratio = server.answer(1, "q")  # top_k defaults to 1
    assert fake.calls[0] == ("settings", 1, None) and [t for t, _ in res.top_k] == ["q0"] and ratio is None
    g = GenerationConfig.for_task("vqa", method="greedy")
    server.answer(2, "r", 2, generation=g)
    assert fake.calls[2] == ("settings", 2, g) and fake.calls[3] == ("answer", [2], ["r"], 2, g, False)
    assert server.caption(3) == ("caption of 3", None)
    assert fake.calls[4] == ("caption", [3], GenerationConfig.for_task("caption"), False)


def test_batched_predictor_gives_each_picture_its_familiarity():
    fake = _FakePredictor()
    server = SharedPredictor(fake, max_batch=2, max_wait=10.0, familiarity=_Ratio())
    out = _at_once(server.answer, [(1, "a", 1), (2, "b", 3)])
    assert [r for _, r in out] == [10.0, 20.0]
    assert [len(res.top_k) for res, _ in out] == [1, 3]  # one call with top_k 3, each cut to its own
    assert [c[0] for c in fake.calls].count("answer") == 1
