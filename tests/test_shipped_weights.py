"""The tiny preset's pretrained towers ship in the package (vqa/weights/tiny): their card names the command and
hash of the weights, they load with safetensors, a new tiny run starts from them (exactly their weights and
tokenizer at step 0), --from-scratch starts from random weights, and the options that contradict the towers
(another shape, another tokenizer) stop with the way out."""

from __future__ import annotations

import json

import pytest
import torch
from test_train import fails

from vqa.cli import build_parser, main
from vqa.identity import checkpoint_identity
from vqa.weights import checkpoint, shipped

pytestmark = pytest.mark.slow


def test_the_shipped_towers_are_what_their_card_says():
    folder = shipped.folder("tiny")
    card = shipped.card("tiny")
    assert card["sha256"] == shipped.sha256(folder / "model.safetensors")
    assert card["identity"] == checkpoint_identity(folder)  # the weights with their config and tokenizer
    assert card["command"].startswith("vqa pretrain") and card["steps"] > 0 and card["init_from"] == "random weights"
    # the card's command is the one that made them: `vqa pretrain` reads it as the card's corpus and steps
    argv = card["command"].split()[1:]
    made = build_parser(argv).parse_args(argv)
    assert (made.seed, made.max_steps, made.images, made.val_images) == (
        card["corpus"]["seed"], card["steps"], card["corpus"]["images"], card["corpus"]["val_images"])
    model, tok, loaded = shipped.load("tiny")
    assert sum(p.numel() for p in model.parameters()) == card["parameters"]
    assert tok.question_id is not None and tok.answer_id is not None  # pretrained for both tasks
    assert not list(folder.glob("*.pt")) and not list(folder.glob("*.bin"))  # no pickle in the package
    with pytest.raises(Exception, match="no shipped weights named 'huge'.*--from-scratch"):
        shipped.folder("huge")


def _run(shapes_dir, out, *extra) -> list[str]:
    return ["train", "--data", str(shapes_dir), "--out", str(out), "--preset", "tiny", "--batch-size", "2",
            "--eval-images", "2", "--workers", "0", *extra]


def test_a_tiny_run_starts_from_the_shipped_towers_and_from_scratch_does_not(shapes_dir, tmp_path):
    ref, ref_tok, _ = shipped.load("tiny")
    assert main(_run(shapes_dir, tmp_path / "pre", "--max-steps", "1", "--lr", "0")) == 0  # lr 0: step 0's weights
    model, tok, card = checkpoint.load(tmp_path / "pre" / "last")
    assert card["init_from"] == shipped.describe("tiny")
    assert tok.hf.to_str() == ref_tok.hf.to_str()
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(model.state_dict()[k], v, rtol=0, atol=0, msg=k)
    assert main(_run(shapes_dir, tmp_path / "rnd", "--max-steps", "1", "--lr", "0", "--from-scratch")) == 0
    model, tok, card = checkpoint.load(tmp_path / "rnd" / "last")
    assert "init_from" not in card and tok.hf.to_str() != ref_tok.hf.to_str()
    saved = json.loads((tmp_path / "rnd" / "train_config.json").read_text())
    assert saved["from_scratch"] is True


def test_a_shape_or_tokenizer_the_towers_do_not_have_stops_with_the_way_out(shapes_dir, tmp_path, capsys):
    fails(capsys, _run(shapes_dir, tmp_path / "a", "--max-steps", "1", "--set", "vit_width=32"),
          r"tiny preset starts from pretrained towers \(vqa/weights/tiny\).*vit_width.*--from-scratch")
    tok = shipped.folder("tiny") / "tokenizer.json"
    fails(capsys, _run(shapes_dir, tmp_path / "b", "--max-steps", "1", "--tokenizer", str(tok)),
          r"--tokenizer .*own tokenizer.*--from-scratch")
    # a --set that keeps the shape applies to the towers' config
    assert main(_run(shapes_dir, tmp_path / "c", "--max-steps", "1", "--set", "dec_dropout=0.1")) == 0
    assert checkpoint.load(tmp_path / "c" / "last")[0].cfg.dec_dropout == 0.1


def test_a_vocab_size_that_cannot_apply_says_so_in_one_line(shapes_dir, tmp_path, capsys):
    fails(capsys, _run(shapes_dir, tmp_path / "a", "--max-steps", "1", "--vocab-size", "500"),
          r"--vocab-size 500 cannot apply: the tiny preset starts from pretrained towers with their own tokenizer "
          r"\(vqa/weights/tiny\); .*--from-scratch")
    tok = shipped.folder("tiny") / "tokenizer.json"
    fails(capsys, _run(shapes_dir, tmp_path / "b", "--max-steps", "1", "--vocab-size", "500", "--from-scratch",
                       "--tokenizer", str(tok)), r"--vocab-size 500 cannot apply: --tokenizer .* gives the tokenizer")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # stopped before the run folder
    # where a tokenizer is trained it applies: that many BPE tokens at most, and the 256 byte tokens
    assert main(_run(shapes_dir, tmp_path / "c", "--max-steps", "1", "--vocab-size", "60", "--from-scratch")) == 0
    assert checkpoint.load(tmp_path / "c" / "last")[1].vocab_size <= 60 + 256


def test_every_tokenizer_from_elsewhere_refuses_a_vocab_size():
    from vqa.config import TrainConfig
    from vqa.errors import ConfigError
    from vqa.train.build import check_vocab_size

    refused = {"init_from": r"the run starts from --init-from runs/a, whose tokenizer it keeps",
               "lm": r"the pretrained decoder \(distilbert/distilgpt2\) brings its own tokenizer"}
    for kw, why in ((dict(init_from="runs/a"), refused["init_from"]), (dict(preset="small-gpt2"), refused["lm"])):
        with pytest.raises(ConfigError, match=rf"^--vocab-size 500 cannot apply: {why}"):
            check_vocab_size(TrainConfig(data="d", out="o", vocab_size=500, **kw))
    for kw in (dict(from_scratch=True), dict(resume=True), dict(vocab_size=None)):  # trained here, or not given
        check_vocab_size(TrainConfig(data="d", out="o", **{"vocab_size": 500, **kw}))
