"""`Predictor.stream`: the text grows as it is decoded and ends equal to the text `answer` / `caption`
return, for every decoding method; its return value is their result; a reader that stops reading stops the
decoding. The model is lively (random weights that give long, varied outputs), so the text takes many steps."""

from __future__ import annotations

import queue
import sys
import threading
import types

import pytest
from helpers import lively_model
from predict_fixtures import COLOR_Q, draw, shared_checkpoint

from vqa.config import DECODING_METHODS
from vqa.decoding.batch import DecodingBatch
from vqa.inference import streaming
from vqa.inference.predict import Predictor
from vqa.weights import checkpoint

# each decoding method with settings that make it differ from the others; every method must be here
SETTINGS = {"greedy": dict(method="greedy"), "beam": dict(method="beam", num_beams=3),
            "sample": dict(method="sample", seed=5, top_p=0.9, temperature=1.5)}
GROWS = {"greedy", "sample"}  # one token a step: each text extends the one before


@pytest.fixture(scope="module")
def pred():
    _, tok, _ = checkpoint.load(shared_checkpoint())
    model = lively_model(**tok.model_ids())
    return Predictor(model, tok, dict(tasks=["vqa", "caption"]), device="cpu")


def drain(gen):
    """(every text yielded, the generator's return value)."""
    texts = []
    while True:
        try:
            texts.append(next(gen))
        except StopIteration as stop:
            return texts, stop.value


def test_every_method_is_covered():
    assert set(SETTINGS) == set(DECODING_METHODS)


class Lockstep(queue.Queue):
    """The stream's queue, its decoding thread held after each step until the reader has decoded it: a reader
    on a loaded machine then sees every step (a slow one gets only the latest, by design)."""

    read = threading.Event()

    def put(self, item, block=True, timeout=None):
        Lockstep.read.clear()
        super().put(item, block, timeout)
        if item[0] == "text":
            Lockstep.read.wait(10)


@pytest.mark.parametrize("method", list(SETTINGS))
@pytest.mark.parametrize("task", ["caption", "vqa"])
def test_the_streamed_text_ends_as_the_plain_one(pred, method, task, monkeypatch):
    decode = pred.tokenizer.decode
    monkeypatch.setattr(streaming, "queue", types.SimpleNamespace(Queue=Lockstep))  # this module's queues only
    monkeypatch.setattr(pred.tokenizer, "decode", lambda ids: (decode(ids), Lockstep.read.set())[0])
    picture = draw("red_circle")
    settings = dict(SETTINGS[method], min_new_tokens=6, max_new_tokens=12)
    if task == "vqa":
        plain = pred.answer(picture, COLOR_Q, **settings)
        texts, res = drain(pred.stream(picture, COLOR_Q, **settings))
        final = plain.answer
        assert (res.answer, res.top_k, res.ids) == (plain.answer, plain.top_k, plain.ids)
    else:
        plain = pred.caption(picture, **settings)
        texts, res = drain(pred.stream(picture, **settings))
        final = plain.caption
        assert (res.caption, res.ids, res.log_prob) == (plain.caption, plain.ids, plain.log_prob)
    assert len(plain.ids) >= 6
    assert texts[-1] == final
    assert len(texts) >= 2 and all(a != b for a, b in zip(texts, texts[1:], strict=False))
    if method in GROWS:
        assert len(texts) >= 4, texts
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False)), texts


def test_a_reader_that_stops_stops_the_decoding(pred, monkeypatch):
    steps, closed = [], threading.Event()
    real = DecodingBatch.step

    def step(self, tokens):
        steps.append(1)
        if threading.current_thread().name == "vqa-stream":
            closed.wait(timeout=30)  # the decoding waits at its first step until the reader has gone
        return real(self, tokens)

    monkeypatch.setattr(DecodingBatch, "step", step)
    pred.caption(draw("blue_square"), min_new_tokens=20, max_new_tokens=20)
    assert len(steps) == 19  # 20 tokens, the first from the prompt's pass
    steps.clear()
    gen = pred.stream(draw("blue_square"), min_new_tokens=20, max_new_tokens=20)
    next(gen)
    gen.close()
    closed.set()
    for t in threading.enumerate():
        if t.name == "vqa-stream":
            t.join(timeout=30)
    assert 1 <= len(steps) <= 2, len(steps)


def test_errors_reach_the_reader(pred):
    with pytest.raises(Exception, match="the question is empty"):
        next(pred.stream(draw("red_circle"), " "))


@pytest.mark.parametrize("command", ["ask", "caption"])
def test_the_cli_prints_as_it_decodes_on_a_terminal_only(command, tmp_path, capsys, monkeypatch):
    from cli_fixtures import vqa

    picture = tmp_path / "p.png"
    draw("red_circle").save(picture)
    run = checkpoint.resolve(shared_checkpoint())
    args = [command, "--checkpoint", run, picture, *([COLOR_Q] if command == "ask" else []), "--device", "cpu",
            "--method", "greedy"]
    streamed = []
    real = Predictor.stream
    monkeypatch.setattr(Predictor, "stream", lambda self, *a, **kw: streamed.append(1) or real(self, *a, **kw))
    capsys.readouterr()
    assert vqa(args) == 0
    piped = capsys.readouterr().out
    assert not streamed and piped.strip()
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert vqa(args) == 0
    assert streamed and capsys.readouterr().out == piped  # the same text, written as it came


def test_a_streamed_caption_samples_with_the_options_given(tmp_path, monkeypatch):
    from cli_fixtures import vqa

    picture = tmp_path / "p.png"
    draw("red_circle").save(picture)
    seen = {}
    real = Predictor.stream
    monkeypatch.setattr(Predictor, "stream", lambda self, *a, **kw: seen.update(kw) or real(self, *a, **kw))
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert vqa(["caption", "--checkpoint", checkpoint.resolve(shared_checkpoint()), picture, "--device", "cpu",
                "--method", "sample", "--top-k", "3", "--temperature", "0.7"]) == 0
    g = seen["generation"]
    assert (g.method, g.top_k, g.temperature) == ("sample", 3, 0.7) and seen.get("top_k", 1) == 1


def test_streamed_requests_share_a_batch_and_each_hears_its_own_row(pred):
    from concurrent.futures import ThreadPoolExecutor

    from vqa.inference.serving import SharedPredictor

    server = SharedPredictor(pred, max_batch=4, max_wait=0.5, attention=False)
    jobs = [(draw("red_circle"), COLOR_Q), (draw("blue_square"), "what shape is it?")]
    heard = [[], []]
    settings = pred.answer_settings(1, None, dict(method="greedy", min_new_tokens=6, max_new_tokens=12))
    submitted, submit = [], server.batcher.submit
    server.batcher.submit = lambda *a: submitted.append(1) or submit(*a)
    with ThreadPoolExecutor(2) as pool:
        with pred._lock:  # the model held: both requests gather into one batch
            futures = [pool.submit(server.answer, img, q, 1, settings, heard[i].append)
                       for i, (img, q) in enumerate(jobs)]
            for _ in range(3000):
                if len(submitted) == 2:
                    break
                threading.Event().wait(0.01)
    results = [f.result(timeout=60)[0] for f in futures]
    assert server.batcher.batches == 1 and server.batcher.largest == 2
    for (img, q), res, tokens in zip(jobs, results, heard, strict=True):
        assert res.ids == pred.answer(img, q, generation=settings).ids
        assert len(tokens) >= 6 and tokens[-1] == res.ids  # its own row, step by step, to its end
        assert all(b[: len(a)] == a for a, b in zip(tokens, tokens[1:], strict=False))
    assert results[0].ids != results[1].ids
