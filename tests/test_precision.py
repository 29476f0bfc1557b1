"""Reduced precision and the compiled decode step behind the Predictor: dynamic int8 (torchao) on the CPU, its
fallback to float32 where int8 cannot run, bfloat16 weights, torch.compile, a constrained answer vocabulary;
and the --int8 options of `vqa ask`, `vqa eval` and the app."""

from __future__ import annotations

import json

import pytest
import torch
from predict_fixtures import COLOR_Q, ITEMS, SHAPE_Q, draw, shared_checkpoint, write_pictures

from vqa.decoding import quantize
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
    monkeypatch.setattr(quantize, "int8_unavailable", lambda device: "no quantized engine on this test platform")
    with pytest.warns(RuntimeWarning, match="int8 is not available here: no quantized engine on this test "
                                            "platform; running in float32"):
        p = Predictor.from_pretrained(ckpt, device="cpu", quantize="int8")
    assert p.precision == "float32" and "no quantized engine" in p.notice
    assert all(type(m.weight) is torch.nn.Parameter for m in _linears(p.model))
    assert [(a.answer, s.answer, c.caption) for a, s, c in _answers(p)] == \
        [(a.answer, s.answer, c.caption) for a, s, c in _answers(pred)]


def test_int8_unavailable_names_the_reason(monkeypatch):
    assert quantize.int8_unavailable("cpu") is None  # this test machine runs int8
    assert "for CPUs, not cuda" in quantize.int8_unavailable("cuda") and "bfloat16" in quantize.int8_unavailable("cuda")

    def no_torchao():
        raise ImportError("No module named 'torchao'")

    monkeypatch.setattr(quantize, "_import_torchao", no_torchao)
    assert "pip install 'vqa[int8]'" in quantize.int8_unavailable("cpu")
    monkeypatch.undo()
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    assert "no quantized CPU engine" in quantize.int8_unavailable("cpu")


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


def test_compiled_int8_predictor_answers_like_the_eager_one(ckpt, int8, quick_compile):
    """The production path of int8 on a CPU: the decode step and the image encoder compiled, int8 weights
    frozen in (oneDNN's int8 kernels)."""
    from vqa.decoding.compiled import _encoders, compiled_step

    p = Predictor.from_pretrained(ckpt, device="cpu", quantize="int8", compile=True)
    assert p.compile
    assert [(a.answer, s.answer, c.caption) for a, s, c in _answers(p)] == \
        [(a.answer, s.answer, c.caption) for a, s, c in _answers(int8)]
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
    monkeypatch.setattr(quantize, "int8_unavailable", lambda device: "no quantized engine here")
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
