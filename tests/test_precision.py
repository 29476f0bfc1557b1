"""Reduced precision and the compiled decode step behind the Predictor: dynamic int8 (torchao) on the CPU, its
fallback to float32 where int8 cannot run, bfloat16 weights, torch.compile, a constrained answer vocabulary;
and the --int8 options of `vqa ask`, `vqa eval` and the app.

Answers of int8 (eager or compiled) and bfloat16 are compared with float32's exactly, which holds on every CPU
because they are the trained test checkpoint's answers on its own pictures: its greedy margins exceed four times
int8's own error (asserted in the compiled int8 test), and the numbers themselves are compared within
tolerances (probabilities within 0.05, step logits within int8's own error)."""

from __future__ import annotations

import json

import pytest
import torch
from predict_fixtures import COLOR_Q, ITEMS, SHAPE_Q, draw, shared_checkpoint, write_pictures

from vqa.config import GenerationConfig
from vqa.decoding import precision
from vqa.errors import InputError
from vqa.inference.predict import Predictor


@pytest.fixture(scope="module")
def ckpt():
    return shared_checkpoint()


@pytest.fixture(scope="module")
def pred(ckpt):
    return Predictor.from_pretrained(ckpt, device="cpu")


@pytest.fixture(scope="module")
def int8(ckpt):
    return Predictor.from_pretrained(ckpt, device="cpu", quantize="int8", compile=False)  # eager


def _linears(model):
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


def _answers(p):
    return [(p.answer(draw(n), COLOR_Q, top_k=2), p.answer(draw(n), SHAPE_Q), p.caption(draw(n))) for n in ITEMS]


def test_int8_quantizes_every_linear_layer_to_int8_weights_and_answers_like_float32(pred, int8):
    assert int8.precision == "int8" and int8.notice is None and "int8" in repr(int8)
    layers = _linears(int8.model)
    assert len(layers) == len(_linears(pred.model)) > 10  # the ViT's and the decoder's
    for lin in layers:
        assert type(lin.weight).__name__ == "Int8Tensor" and lin.weight.qdata.dtype == torch.int8
        assert lin.weight.qdata.shape == lin.weight.shape  # one int8 per weight: a quarter of float32's bytes
    assert type(int8.model.decoder.embed.weight) is torch.nn.Parameter  # the tied LM head stays float32
    # the same answers and captions; probabilities move a little
    for (a32, s32, c32), (a8, s8, c8) in zip(_answers(pred), _answers(int8), strict=True):
        assert (a8.answer, s8.answer, c8.caption) == (a32.answer, s32.answer, c32.caption)
        assert a8.top_k[0][1] == pytest.approx(a32.top_k[0][1], abs=0.05)
    # and the quantization really changed the numbers (it is not float32 under another name)
    x = torch.randn(2, 7, pred.cfg.dec_width)
    lin32, lin8 = pred.model.decoder.blocks[0].mlp[0], int8.model.decoder.blocks[0].mlp[0]
    with torch.no_grad():
        y32, y8 = lin32(x), lin8(x)
    assert not torch.equal(y32, y8) and torch.allclose(y32, y8, atol=0.05 * float(y32.abs().max()))


def test_int8_explains_and_draws_maps(int8):
    ex = int8.explain(draw("red_circle"), COLOR_Q)
    assert ex.text == "red" and ex.cross_weights.shape[0] == int8.cfg.dec_depth
    res = int8.answer(draw("red_circle"), COLOR_Q, return_attention=True)
    assert res.attention.shape[1:] == (int8.cfg.dec_depth, int8.cfg.dec_heads, int8.grid, int8.grid)


def test_int8_where_it_cannot_run_is_a_clear_warning_and_float32(ckpt, pred, monkeypatch):
    monkeypatch.setattr(precision, "int8_unavailable", lambda device: "no quantized engine on this test platform")
    with pytest.warns(RuntimeWarning, match="int8 is not available here: no quantized engine on this test "
                                            "platform; running in float32"):
        p = Predictor.from_pretrained(ckpt, device="cpu", quantize="int8")
    assert p.precision == "float32" and "no quantized engine" in p.notice
    assert all(type(m.weight) is torch.nn.Parameter for m in _linears(p.model))
    assert [(a.answer, s.answer, c.caption) for a, s, c in _answers(p)] == \
        [(a.answer, s.answer, c.caption) for a, s, c in _answers(pred)]


def test_int8_unavailable_names_the_reason(monkeypatch):
    assert precision.int8_unavailable("cpu") is None  # this test machine runs int8
    on_cuda = precision.int8_unavailable("cuda")
    assert "for CPUs, not cuda" in on_cuda and "bfloat16" in on_cuda

    def no_torchao():
        raise ImportError("No module named 'torchao'")

    monkeypatch.setattr(precision, "_import_torchao", no_torchao)
    assert "pip install 'vqa[int8]'" in precision.int8_unavailable("cpu")
    monkeypatch.undo()
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert "no quantized CPU engine" in precision.int8_unavailable("cpu")


def test_bfloat16_weights(ckpt):
    p = Predictor.from_pretrained(ckpt, device="cpu", dtype=torch.bfloat16)
    assert p.precision == "bfloat16" and p.dtype == torch.bfloat16
    assert {t.dtype for t in p.model.parameters()} == {torch.bfloat16}
    assert p.answer(draw("red_circle"), COLOR_Q).answer == "red"  # the images go in as bfloat16 too
    assert p.caption(draw("blue_square")).caption == ITEMS["blue_square"][2]
    assert p.image_features(draw("red_circle")).dtype.name == "float32"
    assert Predictor.from_pretrained(ckpt, device="cpu", dtype="bf16").precision == "bfloat16"


def test_bad_precision_settings_are_input_errors(ckpt):
    with pytest.raises(InputError, match="quantize must be 'int8'"):
        Predictor.from_pretrained(ckpt, device="cpu", quantize="int4")
    with pytest.raises(InputError, match="not both"):
        Predictor.from_pretrained(ckpt, device="cpu", quantize="int8", dtype=torch.bfloat16)
    with pytest.raises(InputError, match="dtype must be float32, bfloat16 or float16"):
        Predictor.from_pretrained(ckpt, device="cpu", dtype=torch.float64)


def _onednn_int_mm(real):
    """torch._int_mm held to the leading dimensions oneDNN's gemm requires, which PyTorch's CPU `_int_mm` uses on
    CPUs with AVX512-VNNI or AMX when each operand has a unit stride (elsewhere a loop reads any strides): there
    oneDNN rejects a smaller one and the output is never written, so this raises instead, on every CPU."""

    def int_mm(a, b, *, out=None):
        int_mm.calls += 1
        if all(1 in t.stride() for t in (a, b)):
            for name, t in (("activation", a), ("weight", b)):
                ld, need = (t.stride(0), t.shape[1]) if t.stride(1) == 1 else (t.stride(1), t.shape[0])
                assert ld >= max(1, need), (f"_int_mm {name} {tuple(t.shape)} with strides {t.stride()}: "
                                            "oneDNN's gemm rejects it and writes nothing")
        return real(a, b, out=out)

    int_mm.calls = 0
    return int_mm


def _greedy_steps(p, name, prompt, path=None):
    """The logits [T, V] (banned tokens at -inf) of each greedy step of `p` on picture `name` after `prompt`,
    fed `path` (teacher forcing: every predictor sees the same inputs) or, without one, its own choices; and
    the tokens fed."""
    from vqa.decoding.batch import DecodingBatch, ban_bias
    from vqa.decoding.generate import _banned

    with torch.no_grad():
        memory, index = p._encode([draw(name)])
        kv = p.model.memory_kv(memory, torch.as_tensor(index))
        ban = ban_bias(p.model, _banned(p.model, p.tokenizer.never_generated))
        dec = DecodingBatch(p.model, kv, [prompt], GenerationConfig(method="greedy"), compiled=p.compile, ban=ban)
        steps, fed = [dec.logits[0] + ban], []
        while True:
            fed.append(int(steps[-1].argmax()) if path is None else path[len(fed)])
            if fed[-1] == p.cfg.eos_id or len(fed) == (dec.max_new if path is None else len(path)):
                break
            steps.append(dec.step(torch.tensor(fed[-1:]))[0] + ban)
    return torch.stack(steps), fed


def test_compiled_int8_stays_within_int8s_own_error_and_answers_like_the_eager_one(ckpt, pred, int8, monkeypatch,
                                                                                   quick_compile):
    """The production path of int8 on a CPU: the decode step and the image encoder compiled, int8 weights frozen
    in. What holds on every CPU: along float32's greedy path, the compiled step's logits (one row, the case that
    once broke) stay within int8's own error (eager int8 against float32) of the eager int8 ones; this trained
    model's greedy margins exceed four times that error (more than both int8 paths together can move a logit),
    so the answers are equal by construction, not by luck of near-ties. `_onednn_int_mm` holds every compiled
    int8 matmul to what oneDNN accepts, so a layout that gives garbage on CPUs with AVX512-VNNI or AMX fails
    here too."""
    from torch._inductor.select_algorithm import extern_kernels

    from vqa.decoding.batch import compiled_step
    from vqa.decoding.compiled import _encoders

    checked = _onednn_int_mm(torch._int_mm)
    monkeypatch.setattr(extern_kernels, "_int_mm", checked)
    p = Predictor.from_pretrained(ckpt, device="cpu", quantize="int8", compile=True)
    assert p.compile and not int8.compile
    prompts = [pred.tokenizer.vqa_prompt(COLOR_Q), pred.tokenizer.vqa_prompt(SHAPE_Q), pred.tokenizer.caption_prompt()]
    own, drift, margin = 0.0, 0.0, float("inf")
    for name in ITEMS:
        for prompt in prompts:
            l32, path = _greedy_steps(pred, name, prompt)
            l8, _ = _greedy_steps(int8, name, prompt, path)
            lc, _ = _greedy_steps(p, name, prompt, path)
            top2 = l32.topk(2, -1).values
            margin = min(margin, float((top2[:, 0] - top2[:, 1]).min()))
            finite = torch.isfinite(l32)
            own = max(own, float((l8 - l32)[finite].abs().max()))
            drift = max(drift, float((lc - l8)[finite].abs().max()))
    # compiled int8 moves logits no further than int8 itself does
    assert checked.calls > 0 and drift <= own, (drift, own)
    assert margin > 4 * own, (margin, own)  # so neither int8 path can flip a greedy choice of float32's
    assert [(a.answer, s.answer, c.caption) for a, s, c in _answers(p)] == \
        [(a.answer, s.answer, c.caption) for a, s, c in _answers(int8)]
    assert [c.caption for c in p.caption_batch([draw(n) for n in ITEMS])] == [ITEMS[n][2] for n in ITEMS]
    assert compiled_step(p.model.decoder).failed is None and _encoders[p.model].failed is None  # both compiled


def test_a_constrained_answer_vocabulary(ckpt, pred):
    p = Predictor.from_pretrained(ckpt, device="cpu", answer_vocab=["red", "blue"])
    assert p.answer_vocab == sorted({*p.tokenizer.target("red"), *p.tokenizer.target("blue")})
    assert p.answer(draw("red_circle"), COLOR_Q).answer == "red"
    # a shape question must now be answered in those tokens ("square" is not among them)
    res = p.answer(draw("blue_square"), SHAPE_Q, top_k=3)
    assert all(set(p.tokenizer.encode(a)) <= set(p.answer_vocab) for a, _ in res.top_k), res.top_k
    assert "square" not in {a for a, _ in res.top_k} and sum(q for _, q in res.top_k) <= 1 + 1e-6
    assert p.caption(draw("blue_square")).caption == pred.caption(draw("blue_square")).caption  # captions are free
    p.set_answer_vocab(None)
    assert p.answer(draw("blue_square"), SHAPE_Q).answer == "square"
    with pytest.raises(InputError, match="at least one"):
        p.set_answer_vocab(["  "])


def test_cli_int8(ckpt, tmp_path, capsys, monkeypatch):
    from vqa.cli import main

    pictures = write_pictures(tmp_path)
    assert main(["ask", "--checkpoint", str(ckpt), str(pictures["red_circle"]), COLOR_Q, "--int8"]) == 0
    assert capsys.readouterr().out.strip() == "red"
    assert main(["caption", "--checkpoint", str(ckpt), str(pictures["blue_square"]), "--int8"]) == 0
    assert capsys.readouterr().out.strip() == ITEMS["blue_square"][2]
    monkeypatch.setattr(precision, "int8_unavailable", lambda device: "no quantized engine here")
    assert main(["ask", "--checkpoint", str(ckpt), str(pictures["red_circle"]), COLOR_Q, "--int8"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == "red" and "vqa ask: int8 is not available here: no quantized engine here" in out.err


def test_eval_int8_reports_its_precision(ckpt, shapes_dir, tmp_path, capsys, quick_compile):
    from vqa.cli import main

    assert main(["eval", "--checkpoint", str(ckpt), "--data", str(shapes_dir), "--split", "val", "--int8",
                 "--out", str(tmp_path / "int8"), "--max-images", "4"]) == 0
    summary = json.loads((tmp_path / "int8" / "summary.json").read_text())
    assert summary["precision"] == "int8" and "(int8)" in capsys.readouterr().out


def test_int8_compiles_by_default_where_it_pays_and_the_one_shot_cli_does_not(ckpt):
    """int8's eager matmuls are slower than float32's on a CPU: a Predictor (and `vqa eval --int8`) decodes
    through the compiled step unless told otherwise; `vqa ask --int8` answers once, eagerly."""
    assert Predictor.from_pretrained(ckpt, device="cpu", quantize="int8").compile
    assert not Predictor.from_pretrained(ckpt, device="cpu", quantize="int8", compile=False).compile
    assert not Predictor.from_pretrained(ckpt, device="cpu").compile  # float32 on a CPU: eager
