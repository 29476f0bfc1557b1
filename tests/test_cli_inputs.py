"""What the command lines do with what they are given: `vqa ask` / `vqa caption` take INPUTs after options too,
honour --compile for one image, and a collection says which repeated lines it skipped and counts only this
run's inputs; `python -m vqa.export.runtime` refuses an empty question instead of captioning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from collect_fixtures import photo_folder, records
from predict_fixtures import COLOR_Q, shared_checkpoint

from vqa.cli import main
from vqa.inference.predict import Predictor


@pytest.fixture(scope="module")
def ckpt():
    return shared_checkpoint().parent  # the run folder


@pytest.fixture
def spy(monkeypatch):
    """The keywords every Predictor.from_pretrained call got (the model itself loads eagerly, as usual)."""
    calls: list[dict] = []
    load = Predictor.from_pretrained.__func__

    def from_pretrained(cls, path, device=None, **kw):
        calls.append(kw)
        return load(cls, path, device=device, **{**kw, "compile": False})

    monkeypatch.setattr(Predictor, "from_pretrained", classmethod(from_pretrained))
    return calls


# ------------------------------------------------------------------------------------------------ arguments


def test_inputs_may_come_after_options(ckpt, tmp_path, capsys):
    a, b, c = photo_folder(tmp_path / "p", 3)
    out = tmp_path / "captions.jsonl"
    assert main(["caption", "--checkpoint", str(ckpt), str(a), "--batch-size", "2", str(b), "--out", str(out),
                 "--workers", "0"]) == 0
    assert [r["image"] for r in records(out)] == [str(a), str(b)]
    answers = tmp_path / "answers.jsonl"
    assert main(["ask", str(a), "--checkpoint", str(ckpt), str(c), "--top-k", "2", COLOR_Q, "--out", str(answers),
                 "--workers", "0"]) == 0
    got = records(answers)
    assert [r["image"] for r in got] == [str(a), str(c)] and {r["question"] for r in got} == {COLOR_Q}
    capsys.readouterr()
    assert main(["caption", str(a), "--checkpoint", str(ckpt), "--json"]) == 0  # one image, as before
    assert json.loads(capsys.readouterr().out)["image"] == str(a)
    with pytest.raises(SystemExit):  # an unknown option is still argparse's usage error
        main(["caption", "--checkpoint", str(ckpt), str(a), "--no-such-option"])
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


@pytest.mark.parametrize("flags, want", [([], False), (["--compile"], True), (["--no-compile"], False)])
def test_compile_reaches_the_predictor_of_one_image(ckpt, tmp_path, spy, flags, want):
    (img,) = photo_folder(tmp_path / "p", 1)
    assert main(["caption", "--checkpoint", str(ckpt), str(img), *flags]) == 0
    assert main(["ask", "--checkpoint", str(ckpt), str(img), COLOR_Q, *flags]) == 0
    assert [kw["compile"] for kw in spy] == [want, want]


# ------------------------------------------------------------------------------------------------ collections


def _questions(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_repeated_questions_line_is_skipped_and_said(ckpt, tmp_path, capsys):
    a, b = photo_folder(tmp_path / "p", 2)
    ra, rb = (str(x.relative_to(tmp_path)) for x in (a, b))
    rows = [dict(image=ra, question=COLOR_Q), dict(image=rb, question=COLOR_Q),
            dict(image=ra, question="what shape is it?"), dict(image=rb, question="and?"),
            dict(image=ra, question=COLOR_Q)]  # line 5 repeats line 1
    q = _questions(tmp_path / "q.jsonl", rows)
    out = tmp_path / "a.jsonl"
    assert main(["ask", "--checkpoint", str(ckpt), "--questions", str(q), "--out", str(out), "--workers", "0"]) == 0
    err = capsys.readouterr().err
    assert len(records(out)) == 4  # one record per (image, question): a rerun resumes by it
    assert f"{q}: skipped 1 repeated input (the first: line 5 repeats line 1)" in err
    assert "all 4 answered" in err
    # the same image named twice on the command line: one record, and said so
    assert main(["caption", "--checkpoint", str(ckpt), str(a), str(b), str(a), "--out", str(tmp_path / "c.jsonl"),
                 "--workers", "0"]) == 0
    err = capsys.readouterr().err
    assert f"skipped 1 repeated input (the first: {a} again)" in err and len(records(tmp_path / "c.jsonl")) == 2


def test_a_rerun_counts_only_its_own_inputs(ckpt, tmp_path, capsys):
    pics = photo_folder(tmp_path / "p", 6)
    out = tmp_path / "c.jsonl"
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a picture")
    # an earlier run: 5 pictures and a bad file (1 failed)
    assert main(["caption", "--checkpoint", str(ckpt), *map(str, pics[:5]), str(bad), "--out", str(out),
                 "--workers", "0"]) == 1
    assert "1 of 6 failed" in capsys.readouterr().err
    # this run: 2 new pictures and one already done; the output's other records are not this run's
    assert main(["caption", "--checkpoint", str(ckpt), str(pics[5]), str(pics[0]), "--out", str(out),
                 "--workers", "0"]) == 0
    err = capsys.readouterr().err
    assert "1 records written" in err and "1 already in" in err and "all 2 answered" in err, err
    # a rerun that names the bad file: its earlier record is an error, and counted
    assert main(["caption", "--checkpoint", str(ckpt), str(bad), str(pics[1]), "--out", str(out),
                 "--workers", "0"]) == 1
    err = capsys.readouterr().err
    assert "0 records written" in err and "1 of 2 failed" in err, err
    assert len(records(out)) == 7


# ------------------------------------------------------------------------------------------------ ONNX runtime


def test_the_onnx_runtime_refuses_an_empty_question(monkeypatch, capsys):
    import vqa.export.runtime as runtime
    from vqa.tokenizer import Tokenizer

    tok = Tokenizer.load(shared_checkpoint())
    calls = []

    class Fake:  # OnnxPredictor's two tasks, without an exported model: the question as the runtime reads it
        def __init__(self, folder):
            pass

        def answer(self, image, question):
            calls.append("answer")
            tok.vqa_prompt(question)
            return "red"

        def caption(self, image):
            calls.append("caption")
            return "a red circle"

    monkeypatch.setattr(runtime, "OnnxPredictor", Fake)
    for q in ("", "   "):
        assert runtime.main(["folder", "img.png", q]) == 2
        assert "the question is empty" in capsys.readouterr().err
    assert "caption" not in calls
    assert runtime.main(["folder", "img.png"]) == 0 and capsys.readouterr().out.strip() == "a red circle"
    assert runtime.main(["folder", "img.png", COLOR_Q]) == 0 and capsys.readouterr().out.strip() == "red"
