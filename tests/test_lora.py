"""LoRA adapters (vqa.weights.lora): merged equals unmerged, only adapters and the cross-attention train, the
checkpoint keeps them beside the base weights and loads them back (merged for the Predictor and export, apart
for a resume), and a killed LoRA run resumes exactly."""

from __future__ import annotations

import pytest
import torch
from helpers import make_batch, random_images, tiny_model
from test_train import assert_same_run, run_halted, train_args

from vqa.cli import main
from vqa.config import TrainConfig
from vqa.errors import CheckpointError
from vqa.tokenizer import Tokenizer
from vqa.train.build import memory_options
from vqa.train.optim import make_optimizer
from vqa.weights import checkpoint, lora


def _inputs(model):
    ids, mask = make_batch([[1, 5, 7], [1, 9]], [[11, 12, 2], [13, 2]])
    return random_images(2, model.cfg), ids, mask


def _adapted(targets=("self_attn", "mlp"), seed=0, **overrides):
    model = tiny_model(seed, **overrides)
    lora.add_lora(model, 4, 8.0, targets)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():  # B starts at zero (the base model); a trained adapter is not
        for layer in lora.lora_layers(model).values():
            layer.lora_B.copy_(torch.randn(layer.lora_B.shape, generator=g) * 0.2)
    return model


def test_a_fresh_adapter_leaves_the_model_unchanged_and_a_trained_one_changes_it():
    base = tiny_model(0)
    images, ids, _ = _inputs(base)
    fresh = tiny_model(0)
    names = lora.add_lora(fresh, 4, 8.0, ("self_attn", "mlp"))
    assert names and all(".cross" not in n for n in names) and all(n.startswith("decoder.blocks.") for n in names)
    with torch.no_grad():
        assert torch.equal(fresh.teacher_forced(images, ids).logits, base.teacher_forced(images, ids).logits)
        assert not torch.allclose(_adapted().teacher_forced(images, ids).logits,
                                  base.teacher_forced(images, ids).logits, atol=1e-3)


@pytest.mark.parametrize("targets", [("self_attn", "mlp"), ("self_attn", "mlp", "vit")])
def test_merged_logits_equal_unmerged(targets):
    model = _adapted(targets)
    images, ids, _ = _inputs(model)
    with torch.no_grad():
        before = model.teacher_forced(images, ids).logits
        lora.merge_lora(model)
        after = model.teacher_forced(images, ids).logits
    assert not lora.lora_layers(model)
    assert all(type(m) is torch.nn.Linear for n, m in model.named_modules() if n.endswith((".qkv", ".fc1")))
    assert (after - before).abs().max() <= 1e-5


def test_only_adapters_and_the_cross_attention_train():
    model = tiny_model(0)
    memory_options(TrainConfig(lora_rank=4), model)
    make_optimizer(model, 1e-3, 1e-3, 0.05)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    lora_params = {n for n in trained if n.endswith((".lora_A", ".lora_B"))}
    assert lora_params and all(n.startswith("decoder.blocks.") for n in lora_params)
    rest = trained - lora_params
    assert rest and all(".cross_attn." in n or ".ln2." in n or n.startswith("vision.") for n in rest)
    assert "decoder.embed.weight" not in trained and "decoder.blocks.0.self_attn.qkv.weight" not in trained
    assert "vision.vit.blocks.0.attn.qkv.weight" in trained  # the ViT is not adapted: it trains as configured
    # a step moves only those
    images, ids, mask = _inputs(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model.train()
    model.teacher_forced(images, ids, mask).loss.backward()
    opt.step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved <= trained and any(n.endswith(".lora_B") for n in moved)


def test_vit_target_freezes_the_rest_of_the_vit():
    model = tiny_model(0)
    memory_options(TrainConfig(lora_rank=4, lora_targets="self_attn,mlp,vit"), model)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "vision.vit.blocks.0.attn.qkv.lora_A" in trained and "vision.vit.patch_embed.proj.weight" not in trained
    assert "vision.proj.weight" in trained  # the image projection belongs to the cross-attention


def test_save_then_load_gives_the_same_logits(tmp_path):
    tok = Tokenizer.train([["a red square", "a blue circle"]], vocab_size=50)
    model = _adapted(vocab_size=tok.vocab_size)
    images, ids, _ = _inputs(model)
    with torch.no_grad():
        want = model.teacher_forced(images, ids).logits
    folder = checkpoint.save(tmp_path / "ckpt", model, tok)
    assert (folder / lora.ADAPTER_WEIGHTS).is_file() and (folder / lora.ADAPTER_CONFIG).is_file()
    from safetensors.torch import load_file

    base_names = set(load_file(str(folder / "model.safetensors")))
    assert "decoder.blocks.0.self_attn.qkv.weight" in base_names and not any("lora" in n for n in base_names)
    assert lora.lora_layers(model)  # saving leaves the adapters in place
    apart, _, _ = checkpoint.load(folder, merge_adapters=False)
    merged, _, _ = checkpoint.load(folder)
    assert lora.lora_layers(apart) and not lora.lora_layers(merged)
    with torch.no_grad():
        assert torch.equal(apart.teacher_forced(images, ids).logits, want)
        assert (merged.teacher_forced(images, ids).logits - want).abs().max() <= 1e-5
    from vqa.inference.predict import Predictor

    p = Predictor.from_pretrained(folder, device="cpu")  # one merged model, as vqa export's
    assert not lora.lora_layers(p.model)
    with torch.no_grad():
        assert (p.model.teacher_forced(images, ids).logits - want).abs().max() <= 1e-5


def test_a_damaged_adapter_file_is_a_checkpoint_error(tmp_path):
    tok = Tokenizer.train([["a red square", "a blue circle"]], vocab_size=50)
    model = _adapted(vocab_size=tok.vocab_size)
    folder = checkpoint.save(tmp_path / "ckpt", model, tok)
    (folder / lora.ADAPTER_WEIGHTS).write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="adapter.safetensors"):
        checkpoint.load(folder)


@pytest.mark.slow
def test_a_killed_lora_run_resumes_exactly(shapes_dir, tmp_path):
    full, cut = tmp_path / "full", tmp_path / "cut"
    opts = ["--lora-rank", "4", "--grad-checkpointing", "--set", "dec_dropout=0.1"]
    assert main(train_args(shapes_dir, full, "--max-steps", "6", *opts)) == 0
    run_halted(train_args(shapes_dir, cut, "--max-steps", "6", *opts), 3)
    assert main(train_args(shapes_dir, cut, "--max-steps", "6", "--resume", *opts)) == 0
    assert_same_run(full, cut, 6)
    assert (full / "last" / lora.ADAPTER_WEIGHTS).is_file()
    apart, _, _ = checkpoint.load(full / "last", merge_adapters=False)
    assert not apart.decoder.blocks[0].self_attn.qkv.lora_B.abs().max() == 0  # the adapters trained


def test_bad_lora_options_are_one_line_errors():
    from vqa.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--lora-targets 'mlp,lm_head': name one or more of self_attn, mlp, vit"):
        TrainConfig(lora_targets="mlp,lm_head")
    with pytest.raises(ConfigError, match="--lora-rank"):
        TrainConfig(lora_rank=0)
    with pytest.raises(ConfigError, match="--train-only"):
        TrainConfig(train_only="decoder,head")


def test_resuming_with_other_adapter_settings_is_refused():
    from vqa.errors import ConfigError

    model = tiny_model(0)
    memory_options(TrainConfig(lora_rank=4), model)
    memory_options(TrainConfig(lora_rank=4), model)  # the same settings: resumes
    with pytest.raises(ConfigError, match="adapters have rank 4, alpha 8, targets self_attn,mlp; resume it with "
                                          r"those \(given: --lora-rank 8"):
        memory_options(TrainConfig(lora_rank=8), model)
    with pytest.raises(ConfigError, match=r"\(given: none\)"):
        memory_options(TrainConfig(), model)
