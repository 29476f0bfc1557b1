"""The fine-tuning recipe: three learning rates (new cross-attention, decoder, encoder), freezing either tower,
`--train-only`, and pretraining on captions then fine-tuning on VQA with `--init-from`."""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import TINY_SET, tiny_set_flags
from helpers import tiny_model
from lm_fixtures import save_tiny_gpt2

from vqa.cli import main
from vqa.config import TrainConfig
from vqa.errors import ConfigError
from vqa.train.optim import param_groups, part_of
from vqa.weights import checkpoint


def train_args(data, out, *extra):
    return ["train", "--data", str(data), "--out", str(out), "--batch-size", "4", "--warmup", "2",
            "--log-every", "1", "--eval-images", "4", "--lr", "3e-3", *tiny_set_flags(), *extra]


def weights(run) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in checkpoint.load(run / "last")[0].state_dict().items()}


def losses(run) -> dict[int, float]:
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


def fails(capsys, args, match: str) -> None:
    """The command exits 2 with a message naming the problem, not a traceback."""
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert re.search(match, err) and "Traceback" not in err, err[-2000:]


def test_every_parameter_belongs_to_one_part():
    model = tiny_model()
    parts = {name: part_of(name) for name, _ in model.named_parameters()}
    assert parts["decoder.blocks.0.cross_attn.q.weight"] == "cross_attention"
    assert parts["decoder.blocks.1.cross_attn.kv.bias"] == "cross_attention"
    assert parts["decoder.blocks.0.ln2.weight"] == "cross_attention"  # the cross-attention's own LayerNorm
    assert parts["vision.proj.weight"] == "cross_attention"  # image tokens to the decoder's width
    for name in ("decoder.embed.weight", "decoder.blocks.0.self_attn.qkv.weight", "decoder.blocks.0.ln1.weight",
                 "decoder.blocks.0.ln3.bias", "decoder.blocks.1.mlp.0.weight", "decoder.ln_f.weight"):
        assert parts[name] == "decoder", name
    assert all(p == "encoder" for n, p in parts.items() if n.startswith("vision.vit."))
    assert set(parts.values()) == {"cross_attention", "decoder", "encoder"}


@pytest.mark.parametrize("muon", [False, True])
def test_three_learning_rates_one_per_part(muon):
    model = tiny_model()
    rates = {"cross_attention": 1e-3, "decoder": 2e-4, "encoder": 1e-4}
    groups = param_groups(model, lr=1e-3, vit_lr=1e-4, weight_decay=0.05, dec_lr=2e-4, muon=muon)
    owner = {id(p): g for g in groups for p in g["params"]}
    for name, p in model.named_parameters():
        g = owner[id(p)]  # every parameter in exactly one group ...
        assert g["part"] == part_of(name), name  # ... of its own part, at that part's rate
        assert g["base_lr"] == pytest.approx(rates[g["part"]] * (10.0 if g["muon"] else 1.0)), name
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    # one rate for the whole text side: one group for it, as before the parts were split
    same = param_groups(tiny_model(), lr=1e-3, vit_lr=1e-4, weight_decay=0.05, muon=muon)
    assert {g["part"] for g in same} == {"text", "encoder"}


def test_a_tower_at_rate_zero_or_left_out_of_train_only_is_frozen():
    model = tiny_model()
    groups = param_groups(model, lr=1e-3, vit_lr=0.0, weight_decay=0.05, dec_lr=0.0)
    trained = {id(p) for g in groups for p in g["params"]}
    for name, p in model.named_parameters():
        assert (part_of(name) == "cross_attention") == (id(p) in trained) == p.requires_grad, name
    model = tiny_model()
    groups = param_groups(model, lr=1e-3, vit_lr=1e-4, weight_decay=0.05, frozen=("cross_attention", "encoder"))
    assert {g["part"] for g in groups} == {"text"}
    for name, p in model.named_parameters():
        assert p.requires_grad == (part_of(name) == "decoder"), name
    with pytest.raises(ConfigError, match="nothing to train"):
        param_groups(tiny_model(), lr=1e-3, vit_lr=0.0, weight_decay=0.0, frozen=("cross_attention", "decoder"))


def test_train_only_options_are_checked():
    cfg = TrainConfig(data="d", out="o", train_only="decoder, cross_attention", lr=1e-3, dec_lr_scale=0.2)
    assert cfg.train_only == ("decoder", "cross_attention") and cfg.frozen_parts == ("encoder",)
    assert cfg.decoder_lr == pytest.approx(2e-4) and cfg.encoder_lr == pytest.approx(1e-3)
    with pytest.raises(ConfigError, match="--train-only 'ears': name one or more of cross_attention, decoder"):
        TrainConfig(data="d", out="o", train_only="ears")
    with pytest.raises(ConfigError, match="--dec-lr 0.0001 trains the decoder, but --train-only cross_attention"):
        TrainConfig(data="d", out="o", train_only="cross_attention", dec_lr=1e-4)


@pytest.mark.slow
def test_train_only_cross_attention_keeps_both_pretrained_towers(shapes_dir, tmp_path, capsys):
    from vqa.data.readers.formats import load_split
    from vqa.data.split import corpus_texts
    from vqa.weights.language_model import build_model

    lm = save_tiny_gpt2(tmp_path / "lm", list(corpus_texts(load_split(shapes_dir, "train"))))
    vit = [a for item in TINY_SET if item.startswith("vit_") for a in ("--set", item)]
    run = tmp_path / "run"
    args = ["train", "--data", str(shapes_dir), "--out", str(run), "--batch-size", "4", "--warmup", "1",
            "--max-steps", "2", "--eval-images", "4", "--lr", "1e-2", "--optimizer", "adamw", *vit,
            "--set", f"dec_pretrained={lm}", "--train-only", "cross_attention"]
    assert main(args) == 0
    trained = weights(run)
    cfg = checkpoint.load(run / "last")[0].cfg
    torch.manual_seed(0)  # the trainer's seed: the same initial weights, the language model read again
    start = build_model(cfg).state_dict()
    moved = {part_of(k) for k, v in trained.items() if not torch.equal(v, start[k])}
    assert moved == {"cross_attention"}
    fails(capsys, [*args[:4], str(tmp_path / "r2"), *args[5:], "--dec-lr", "1e-3"], "freezes it")


@pytest.mark.slow
def test_caption_pretraining_then_vqa_fine_tuning(shapes_dir, tmp_path):
    cap = tmp_path / "caption"
    assert main(train_args(shapes_dir, cap, "--tasks", "caption", "--max-steps", "2")) == 0
    scores = [json.loads(line) for line in (cap / "metrics.jsonl").read_text().splitlines()]
    assert any("val_CIDEr-D" in r for r in scores) and not any("val_vqa_accuracy" in r for r in scores)
    # the tokenizer of the caption run was trained on every text of the data: questions and answers too
    tok = checkpoint.load(cap)[1]
    from vqa.data.readers.formats import load_split

    train = load_split(shapes_dir, "train")
    for r in train.vqa:
        assert tok.unk_id not in tok.encode(r.question) + tok.encode(r.answers[0]), r.question

    vqa = tmp_path / "vqa"
    ft = ["train", "--data", str(shapes_dir), "--out", str(vqa), "--init-from", str(cap), "--tasks", "vqa",
          "--batch-size", "4", "--eval-images", "4", "--log-every", "1", "--max-steps", "2"]
    assert main([*ft, "--lr", "0"]) == 0  # rate 0: the fine-tuning run starts exactly at the caption run's weights
    source = checkpoint.load(cap)[0].state_dict()  # the run folder's best/, as --init-from takes it
    for k, v in weights(vqa).items():
        assert torch.equal(v, source[k]), k
    model, ft_tok, card = checkpoint.load(vqa / "last")
    assert card["init_from"] == str(cap) and card["tasks"] == ["vqa"] and card["preset"] == "tiny"
    assert ft_tok.hf.to_str() == tok.hf.to_str()
    scores = [json.loads(line) for line in (vqa / "metrics.jsonl").read_text().splitlines()]
    assert any("val_vqa_accuracy" in r for r in scores) and not any("val_CIDEr-D" in r for r in scores)
    assert main([*ft[:4], str(tmp_path / "vqa2"), *ft[5:]]) == 0  # and with the preset's rate it trains
    assert sorted(losses(tmp_path / "vqa2")) == [1, 2]
    assert any(not torch.equal(v, source[k]) for k, v in weights(tmp_path / "vqa2").items())
