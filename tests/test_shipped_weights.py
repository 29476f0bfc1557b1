"""The tiny preset's pretrained towers ship in the package (vqa/weights/tiny): their card names the command and
hash of the weights, they load with safetensors, a new tiny run starts from them (exactly their weights and
tokenizer at step 0), --from-scratch starts from random weights, and the options that contradict the towers
(another shape, another tokenizer) stop with the way out."""

from __future__ import annotations

import json

import pytest
import torch
from test_train import fails

from vqa.cli import main
from vqa.identity import checkpoint_identity
from vqa.weights import checkpoint, shipped

pytestmark = pytest.mark.slow


def test_the_shipped_towers_are_what_their_card_says():
    folder = shipped.folder("tiny")
    card = shipped.card("tiny")
    assert card["sha256"] == shipped.sha256(folder / "model.safetensors")
    assert card["identity"] == checkpoint_identity(folder)  # the weights with their config and tokenizer
    assert card["command"].startswith("vqa pretrain") and card["steps"] > 0 and card["init_from"] == "random weights"
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


def _before_bytes(model, tok, n: int, folder):
    """The towers as they were before scripts/add_byte_tokens.py: the first `n` rows, the tokenizer without
    the byte tokens, written to `folder`."""
    from tokenizers import Tokenizer as HFTokenizer

    from vqa.model import VQAModel
    from vqa.tokenizer import BYTE_TOKENS
    from vqa.weights import model_files

    spec = json.loads(tok.hf.to_str())
    for t in BYTE_TOKENS:
        del spec["model"]["vocab"][t]
    spec["model"]["byte_fallback"] = False
    spec["decoder"] = spec["decoder"]["decoders"][1]
    old = VQAModel(model.cfg.replace(vocab_size=n))
    state = model.state_dict()
    state["decoder.embed.weight"] = state["decoder.embed.weight"][:n]
    old.load_state_dict(state)
    model_files.save(old, folder)
    HFTokenizer.from_str(json.dumps(spec)).save(str(folder / "tokenizer.json"))
    return old


def test_the_byte_tokens_were_added_as_the_card_says_and_change_no_answer(tmp_path):
    import importlib.util

    from vqa.tokenizer import BYTE_TOKENS

    model, tok, card = shipped.load("tiny")
    made = card["byte_tokens"]
    n = made["tokens_before"]
    assert made["made_by"] == "python scripts/add_byte_tokens.py" and tok.vocab_size == n + 256
    assert [tok.hf.token_to_id(t) for t in BYTE_TOKENS] == list(range(n, n + 256))  # old ids kept their meaning
    emb = model.decoder.embed.weight
    torch.testing.assert_close(emb[n:], emb[:n].mean(0).expand(256, -1), rtol=0, atol=0)
    # the file is reproducible: the towers before it hash to the card's from_sha256, and the script makes
    # exactly the shipped file from them
    old = _before_bytes(model, tok, n, tmp_path / "before")
    assert shipped.sha256(tmp_path / "before" / "model.safetensors") == made["from_sha256"]
    spec = importlib.util.spec_from_file_location("add_byte_tokens", shipped.WEIGHTS.parents[1] / "scripts" /
                                                  "add_byte_tokens.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.add_byte_tokens(tmp_path / "before", tmp_path / "after")
    assert shipped.sha256(tmp_path / "after" / "model.safetensors") == card["sha256"]
    # a mean row's logit is the mean of the old ones: greedy decoding picks what it picked before
    g = torch.Generator().manual_seed(0)
    images = torch.rand(2, 3, 64, 64, generator=g) * 2 - 1
    ids = torch.tensor([tok.vqa_prompt("what color is the circle?")] * 2)
    with torch.no_grad():
        new, before = model.teacher_forced(images, ids).logits, old.teacher_forced(images, ids).logits
    torch.testing.assert_close(new[..., :n], before)
    assert (new[..., n:].amax(-1) < new[..., :n].amax(-1)).all()


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
