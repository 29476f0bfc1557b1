"""No text is cut without a word: the questions, answer targets and caption targets too long for dec_max_len
are counted over the training split (`split_cuts`, the same count `ItemMaker` cuts) and said once, with the
share, before the first step; the answers and captions an evaluation stops at their budget, and the
questions it cuts, once a run however many evaluations it makes."""

from __future__ import annotations

import re
from pathlib import Path

from vqa.cli import main
from vqa.data.dataset import ItemMaker
from vqa.data.lengths import split_cuts
from vqa.data.records import CaptionRecord, VQARecord
from vqa.data.split import SplitData
from vqa.tokenizer import Tokenizer

SHORT_Q, LONG_Q = "what color?", "what color is the very big round shiny circle on the left of the square?"
LONG = "a red circle above a blue square, left of three small green stars on a grey and white ground"


def _split() -> SplitData:
    img = Path("x.png")
    vqa = [VQARecord(img, SHORT_Q, ["red"] * 9 + [LONG], 1, 1), VQARecord(img, LONG_Q, ["red"] * 10, 2, 1),
           VQARecord(img, SHORT_Q, ["blue", ""], 3, 1)]
    caps = [CaptionRecord(img, "a red circle", 1, 1), CaptionRecord(img, LONG, 1, 2)]
    return SplitData("train", Path("."), vqa=vqa, captions=caps)


def test_the_cut_texts_are_counted_as_the_dataset_cuts_them():
    split = _split()
    tok = Tokenizer.train([SHORT_Q, LONG_Q, LONG, "blue"], vocab_size=60)
    max_len = 16
    maker = ItemMaker(tok, None, max_len, 4, 1, train=True)
    # what ItemMaker really cuts: each (question, answer) and each caption, as training would draw them
    cut_q = cut_a = 0
    for r in split.vqa:
        prompt = maker._vqa_prompt(r.question)
        cut_q += len(prompt) - 3 < len(tok.encode(r.question))
        for a in (a for a in r.answers if a):
            row = maker._row(prompt, a, "vqa", {})
            cut_a += tok.decode(row["input_ids"][row["prompt_len"]:]) != a
    cut_c = sum(tok.decode(maker._row(tok.caption_prompt(), c.caption, "caption", {})["input_ids"][2:]) != c.caption
                for c in split.captions)
    assert cut_q == 1 and cut_a >= 1 and cut_c == 1  # each kind cut at least once
    assert split_cuts(tok, max_len, split) == [
        "vqa: 1 of 3 questions (33.33%) were longer than the 11 tokens dec_max_len=16 leaves a question and were cut",
        f"vqa: {cut_a} of 21 answer targets ({100 * cut_a / 21:.2f}%) did not fit dec_max_len=16 after their "
        "question and were cut",
        "vqa: 1 of 2 caption targets (50.00%) were longer than the 13 tokens dec_max_len=16 leaves a caption and "
        "were cut"]
    assert split_cuts(tok, 16, split, tasks=("caption",)) == split_cuts(tok, 16, split)[2:]
    assert split_cuts(tok, 64, split) == []  # nothing cut, nothing said


def test_a_run_says_each_kind_of_cut_once(shapes_dir, tmp_path, capsys):
    from conftest import TINY_SET

    flags = ["--from-scratch", *(a for s in TINY_SET if not s.startswith("dec_max_len") for a in ("--set", s))]
    capsys.readouterr()
    assert main(["train", "--data", str(shapes_dir), "--out", str(tmp_path / "r"), "--batch-size", "2",
                 "--max-steps", "2", "--eval-every", "1", "--eval-images", "2", "--workers", "0",
                 "--set", "dec_max_len=9", *flags]) == 0
    err = capsys.readouterr().err
    # (Shapes' answers are one token each: a cut question leaves room for one and <eos>, so none is cut)
    for kind in (r"questions \(", "caption targets", "questions evaluated", "answers generated", "captions generated"):
        said = re.findall(rf"^vqa: [\d,]+ of [\d,]+ {kind}.* were cut.*$", err, re.M)
        assert len(said) == 1, (kind, err[-3000:])  # two evaluations, one line
    assert "answer targets" not in err
    assert re.search(r"^vqa: 12 of 12 answers generated \(100\.00%\) reached the 10-token budget \(or the end of "
                     r"dec_max_len=9\) without <eos> and were cut", err, re.M), err[-3000:]
