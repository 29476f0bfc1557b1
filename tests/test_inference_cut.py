"""An answer or a caption stopped by its budget (max_new_tokens, or the end of the context) before <eos> is
never passed off as whole: the result's `cut` says so, `vqa ask` / `vqa caption` say it in a line, and a
collection counts them and says the share once."""

from __future__ import annotations

import re

import pytest
from collect_fixtures import photo_folder
from predict_fixtures import COLOR_Q, draw, shared_checkpoint

from vqa.cli import main
from vqa.inference.predict import Predictor


@pytest.fixture(scope="module")
def ckpt():
    return shared_checkpoint()


def test_a_result_says_it_was_cut(ckpt):
    pred = Predictor.from_pretrained(ckpt, device="cpu")
    whole = pred.answer(draw("red_circle"), COLOR_Q)
    assert whole.answer == "red" and not whole.cut
    # one token at most: "a red circle" cannot end with <eos> (which may not come first) -- cut
    short = pred.caption(draw("red_circle"), max_new_tokens=1)
    assert short.caption == "a" and short.cut
    assert not pred.caption(draw("red_circle")).cut


def test_the_commands_say_what_they_cut(ckpt, tmp_path, capsys):
    capsys.readouterr()
    img = tmp_path / "a.png"
    draw("red_circle").save(img)
    assert main(["caption", "--checkpoint", str(ckpt), str(img), "--max-new-tokens", "1"]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == "a"
    assert "vqa: the caption reached its 1-token budget without <eos> and was cut" in out.err
    for json_flag in ([], ["--json"]):  # the answer "red" is one token: its <eos> has no room
        assert main(["ask", "--checkpoint", str(ckpt), str(img), COLOR_Q, "--max-new-tokens", "1", *json_flag]) == 0
        assert "vqa: the answer reached its 1-token budget without <eos> and was cut" in capsys.readouterr().err
    photo_folder(tmp_path / "p", 3)
    assert main(["caption", "--checkpoint", str(ckpt), str(tmp_path / "p"), "--out", str(tmp_path / "c.jsonl"),
                 "--workers", "0", "--max-new-tokens", "1"]) == 0
    err = capsys.readouterr().err
    assert len(re.findall(r"^vqa: 3 of 3 captions written \(100\.00%\) reached their budget without <eos> and "
                          r"were cut", err, re.M)) == 1, err
    assert main(["caption", "--checkpoint", str(ckpt), str(tmp_path / "p"), "--out", str(tmp_path / "d.jsonl"),
                 "--workers", "0"]) == 0
    assert "were cut" not in capsys.readouterr().err
