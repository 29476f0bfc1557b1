"""`vqa pretrain`: one command builds the corpus and its tokenizer and trains the tiny preset on it into a run
folder; the same seed gives the same weights; `vqa train --init-from` starts from them; a word the corpus never
used is sub-words of its tokenizer, never <unk>; `--help` says what it trains by default and what it makes."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from vqa.cli import build_parser, main
from vqa.tokenizer import Tokenizer
from vqa.weights import checkpoint, shipped

pytestmark = pytest.mark.slow


def _pretrain(out, *extra):
    return main(["pretrain", "--out", str(out), "--max-steps", "2", "--images", "32", "--val-images", "4",
                 "--workers", "1", *extra])


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    out = tmp_path_factory.mktemp("pre") / "run"
    assert _pretrain(out) == 0
    return out


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_pretrain_makes_a_run_folder_with_its_corpus_and_card(pretrained):
    card = json.loads((pretrained / "pretrain.json").read_text())
    assert card["steps"] == 2 and card["corpus"]["images"] == 32 and card["schedule"] == "cosine"
    assert json.loads((pretrained / "corpus" / "corpus_info.json").read_text())["n_train"] == 32
    model, tok, _ = checkpoint.load(pretrained)
    assert model.cfg.vit_width == 96 and model.cfg.dec_depth == 3  # the tiny preset's towers
    saved = Tokenizer.load(pretrained / "corpus" / "tokenizer.json")
    assert tok.hf.to_str() == saved.hf.to_str()
    cfg = json.loads((pretrained / "train_config.json").read_text())
    assert cfg["captions_per_image"] == 4 and cfg["max_steps"] == 2
    # the recipe on every device: a GPU's memory-sized default batch (256 on an H100) would train another run
    assert cfg["batch_size"] == 32 and card["train_flags"]["batch_size"] == 32


def test_pretraining_trains_the_words_to_look_at_the_corpus_objects(pretrained, tmp_path):
    """--grounding-weight trains the grounding loss on the corpus's boxes, on by default as the shipped towers
    were made (their card's command); 0 turns it off, and the same seed then trains other weights."""
    assert json.loads((pretrained / "train_config.json").read_text())["grounding_weight"] == 1
    assert "--grounding-weight 1" in shipped.card("tiny")["command"]
    assert _pretrain(tmp_path / "off", "--grounding-weight", "0") == 0
    assert json.loads((tmp_path / "off" / "train_config.json").read_text())["grounding_weight"] == 0
    weights = "last/model.safetensors"
    assert _digest(tmp_path / "off" / weights) != _digest(pretrained / weights)


def test_the_same_seed_gives_the_same_weights(pretrained, tmp_path):
    assert _pretrain(tmp_path / "again") == 0
    assert (_digest(tmp_path / "again" / "last" / "model.safetensors")
            == _digest(pretrained / "last" / "model.safetensors"))


def test_words_the_corpus_never_used_are_sub_words_not_unk(pretrained):
    _, tok, _ = checkpoint.load(pretrained)
    for text in ("is the quizzical jackdaw gray?", "how many diamonds are there?", "x-ray 42"):
        ids = tok.encode(text)
        assert tok.unk_id not in ids, text
        assert tok.decode(ids) == text


def test_init_from_starts_a_fine_tune_from_the_pretrained_weights(pretrained, shapes_dir, tmp_path):
    run = tmp_path / "ft"
    assert main(["train", "--data", str(shapes_dir), "--out", str(run), "--init-from", str(pretrained),
                 "--max-steps", "1", "--lr", "0", "--batch-size", "4", "--eval-images", "0"]) == 0
    src, src_tok, _ = checkpoint.load(pretrained)
    got, got_tok, card = checkpoint.load(run / "last")
    assert got_tok.hf.to_str() == src_tok.hf.to_str()  # the shipped tokenizer, not one trained on Shapes
    want = src.state_dict()
    for k, v in got.state_dict().items():
        assert torch.equal(v, want[k]), k  # --lr 0: still the pretrained weights
    assert json.loads((run / "train_config.json").read_text())["preset"] == "tiny"


def test_a_corpus_of_other_settings_in_the_folder_is_refused(pretrained, capsys):
    capsys.readouterr()
    assert main(["pretrain", "--out", str(pretrained), "--max-steps", "2", "--images", "33", "--val-images", "4"]) == 2
    err = capsys.readouterr().err
    assert "holds a corpus of seed 0 with 32 + 4 pictures" in err and "Traceback" not in err


def test_help_says_what_it_trains_by_default_and_what_it_makes():
    text = " ".join(build_parser(["pretrain"]).commands["pretrain"].format_help().split())
    assert "40,000 pictures for 2,500 steps" in text and "--init-from DIR" in text and "--schedule" in text

