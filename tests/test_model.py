"""The model: positions, the decoder (QK-norm, the tied head, dropout), causality, cross-attention, the loss,
overfitting, presets and the errors bad input gets. Attention and its masks are in test_attention.py, the
image encoder in test_vision.py."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_causal, make_batch, overfit_model, random_images, tiny_config, tiny_model

from vqa.config import PRESETS, ModelConfig, preset
from vqa.errors import ConfigError, InputError
from vqa.model import VQAModel, sinusoidal_positions


def _ids(rows: list[list[int]]) -> torch.Tensor:
    return torch.as_tensor(rows, dtype=torch.long)


# ---------------------------------------------------------------- positions


def test_sinusoidal_positions_match_vaswani_formula_by_hand():
    d = 16
    pe = sinusoidal_positions(50, d)
    assert pe.shape == (50, d) and pe.dtype == torch.float32
    # PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(pos / 10000^(2i/d))
    assert pe[0, 0::2].abs().max() == 0 and torch.all(pe[0, 1::2] == 1)
    assert pe[1, 0] == pytest.approx(math.sin(1.0), abs=1e-6)
    assert pe[1, 1] == pytest.approx(math.cos(1.0), abs=1e-6)
    assert pe[7, 4] == pytest.approx(math.sin(7 / 10000 ** (4 / 16)), abs=1e-6)  # i = 2
    assert pe[7, 5] == pytest.approx(math.cos(7 / 10000 ** (4 / 16)), abs=1e-6)
    assert pe[49, 14] == pytest.approx(math.sin(49 / 10000 ** (14 / 16)), abs=1e-6)  # i = 7, the last pair
    assert pe[49, 15] == pytest.approx(math.cos(49 / 10000 ** (14 / 16)), abs=1e-6)
    assert pe[23, 9] == pytest.approx(math.cos(23 / 10000 ** (8 / 16)), abs=1e-6)  # i = 4


def test_the_decoder_uses_the_sinusoidal_table_and_learned_positions_replace_it():
    sin = tiny_model()
    assert torch.equal(sin.decoder.pe, sinusoidal_positions(sin.cfg.dec_max_len, sin.cfg.dec_width))
    learned = tiny_model(dec_positions="learned")
    assert not hasattr(learned.decoder, "pe")
    assert learned.decoder.pos.weight.shape == (learned.cfg.dec_max_len, learned.cfg.dec_width)
    assert learned.decoder.pos.weight.requires_grad
    # the learned table is really what the decoder adds
    images = random_images(1, learned.cfg)
    ids = _ids([[1, 5, 6, 7]])
    before = learned.teacher_forced(images, ids).logits
    with torch.no_grad():  # not a constant vector: every LayerNorm would subtract that away
        learned.decoder.pos.weight[2] += torch.linspace(-1.0, 1.0, learned.cfg.dec_width)
    after = learned.teacher_forced(images, ids).logits
    assert torch.allclose(before[:, :2], after[:, :2], atol=1e-6)
    assert (after[:, 2:] - before[:, 2:]).abs().max() > 1e-2


def test_unknown_position_kind_is_a_config_error():
    with pytest.raises(ConfigError, match="dec_positions"):
        tiny_config(dec_positions="rotary")


# ---------------------------------------------------------------- the decoder


def test_qk_norm_decoder_is_still_causal_and_the_flags_reach_the_model():
    model = tiny_model(dec_qk_norm=True, vit_qk_norm=True).eval()
    assert all(isinstance(b.self_attn.q_norm, torch.nn.LayerNorm) for b in model.decoder.blocks)
    assert all(isinstance(b.cross_attn.k_norm, torch.nn.LayerNorm) for b in model.decoder.blocks)
    assert all(isinstance(b.attn.q_norm, torch.nn.LayerNorm) for b in model.vision.vit.blocks)
    images = random_images(1, model.cfg)
    ids = _ids([[1, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        a = model.teacher_forced(images, ids).logits
        b = model.teacher_forced(images, _ids([[1, 5, 6, 7, 8, 20]])).logits
    torch.testing.assert_close(a[:, :5], b[:, :5])
    assert not torch.allclose(a[:, 5], b[:, 5])


def test_lm_head_is_tied_to_the_embedding():
    model = tiny_model()
    dec, cfg = model.decoder, model.cfg
    vd = [p for p in model.parameters() if p.shape == (cfg.vocab_size, cfg.dec_width)]
    assert len(vd) == 1 and vd[0] is dec.embed.weight  # no second [V, D] matrix anywhere
    head = getattr(dec, "lm_head", None) or getattr(model, "lm_head", None)
    if head is not None:
        assert head.weight.data_ptr() == dec.embed.weight.data_ptr()
    h = torch.randn(3, cfg.dec_width)
    torch.testing.assert_close(dec.logits(h), h @ dec.embed.weight.t())
    # a gradient through the head alone reaches the embedding
    dec.logits(h).sum().backward()
    assert dec.embed.weight.grad is not None and dec.embed.weight.grad.abs().sum() > 0


def test_dec_dropout_drops_in_training_only():
    images, ids = random_images(1, tiny_config()), _ids([[1, 5, 6, 7, 8]])
    with torch.no_grad():
        for p, random_in_training in ((0.0, False), (0.5, True)):
            model = tiny_model(dec_dropout=p)
            torch.testing.assert_close(model.teacher_forced(images, ids).logits,
                                       model.teacher_forced(images, ids).logits)  # eval: no dropout
            model.train()
            a, b = model.teacher_forced(images, ids).logits, model.teacher_forced(images, ids).logits
            assert (not torch.allclose(a, b)) is random_in_training


# ---------------------------------------------------------------- the joined model


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_causality_a_later_token_never_changes_earlier_logits(positions):
    assert_causal(tiny_model(dec_positions=positions), min_change=1e-4)  # and every later position does change


def test_cross_attention_is_used_different_images_give_different_logits():
    model = tiny_model()
    images = random_images(2, model.cfg)
    ids = _ids([[1, 5, 9, 13]] * 2)
    logits = model.teacher_forced(images, ids).logits
    assert (logits[0] - logits[1]).abs().amax(-1).min() > 1e-3  # at every position
    same = model.teacher_forced(images[:1].expand(2, -1, -1, -1), ids).logits
    torch.testing.assert_close(same[0], same[1])
    # image_index routes text rows to images
    swapped = model.teacher_forced(images, ids, image_index=torch.tensor([1, 0])).logits
    torch.testing.assert_close(swapped[0], logits[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(swapped[1], logits[0], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_loss_ignores_prompt_and_padding_and_targets_are_shifted_by_one():
    model = tiny_model()
    cfg = model.cfg
    images = random_images(2, cfg)
    prompts = [[1, 5, 6], [1, 7, 8, 9, 10]]
    targets = [[20, 21, 2], [23, 24, 25, 2]]
    ids, mask = make_batch(prompts, targets, cfg.pad_id)  # row 0: 6 tokens then 3 of right padding
    assert ids.shape == (2, 9) and ids[0, 6:].tolist() == [cfg.pad_id] * 3
    out = model.teacher_forced(images, ids, loss_mask=mask)
    assert out.n_targets == 7
    logp = out.logits.log_softmax(-1)
    # by hand: position t predicts token t+1, only target tokens count
    terms = []
    for b, (p, t) in enumerate(zip(prompts, targets, strict=True)):
        for k, tok in enumerate(t):
            pos = len(p) + k
            terms.append(-logp[b, pos - 1, tok])
    expected = torch.stack(terms).mean()
    torch.testing.assert_close(out.loss, expected, atol=1e-5, rtol=1e-5)
    # off by one in either direction would give another number
    for shift in (0, 2):
        wrong = torch.stack(
            [-logp[b, len(p) + k - shift, tok] for b, (p, t) in enumerate(zip(prompts, targets, strict=True))
             for k, tok in enumerate(t)]
        ).mean()
        assert abs(float(wrong) - float(expected)) > 1e-3
    # padding: other pad ids after the end change nothing; the prompt tokens are never predicted
    repadded = ids.clone()
    repadded[0, 6:] = 33
    torch.testing.assert_close(model.teacher_forced(images, repadded, loss_mask=mask).loss, out.loss)
    # a loss_mask on the prompt too would count the prompt: the code must not be doing that already
    everything = mask.clone()
    everything[0, 1 : len(prompts[0])] = True
    assert abs(float(model.teacher_forced(images, ids, loss_mask=everything).loss) - float(out.loss)) > 1e-3
    # the loss alone (no logits) is the same number
    alone = model.teacher_forced(images, ids, loss_mask=mask, return_logits=False)
    assert alone.logits is None
    torch.testing.assert_close(alone.loss, out.loss)
    # and it is the plain cross-entropy of the shifted, selected positions
    sel = mask[:, 1:]
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[:, :-1][sel], ids[:, 1:][sel]),
                               atol=1e-5, rtol=1e-5)


def test_tiny_model_overfits_8_triples_until_greedy_reproduces_every_target():
    from vqa.decoding.generate import generate

    model, images, prompts, targets, steps = overfit_model()
    assert len(targets) == 8 and len(set(map(tuple, prompts))) == 4  # pairs share a prompt: images must decide
    got = generate(model, prompts, images, max_new_tokens=8).sequences
    assert got == targets, f"after {steps} steps"
    # one by one as well
    for i in range(8):
        assert generate(model, [prompts[i]], images[i : i + 1], max_new_tokens=8).sequences[0] == targets[i]


# ---------------------------------------------------------------- presets


def _meta_count(name: str) -> tuple[int, VQAModel]:
    with torch.device("meta"):
        model = VQAModel(preset(name))
    return model.num_parameters(), model


@pytest.mark.parametrize(
    "name, low, high",
    [("tiny", 0.3e6, 2e6), ("small", 30e6, 45e6), ("base", 140e6, 190e6)],
)
def test_preset_parameter_counts(name, low, high):
    n, model = _meta_count(name)
    assert low <= n <= high, f"{name}: {n / 1e6:.1f} M parameters"
    cfg = preset(name)
    assert model.decoder.embed.weight.shape == (cfg.vocab_size, cfg.dec_width)
    assert len(model.decoder.blocks) == cfg.dec_depth
    g = cfg.vit_image_size // cfg.vit_patch_size
    assert tuple(model.vision.vit.patch_embed.grid_size) == (g, g)
    if not cfg.vit_conv_stem:  # tiny: a convolutional stem in place of the patch projection
        assert model.vision.vit.patch_embed.proj.weight.shape[-1] == cfg.vit_patch_size


def test_preset_overrides_and_names():
    assert set(PRESETS) == {"tiny", "small", "base", "small-gpt2", "base-gpt2", "small-smollm2", "base-smollm2"}
    cfg = preset("tiny", vocab_size=77, dec_depth=1)
    assert (cfg.vocab_size, cfg.dec_depth, cfg.dec_width) == (77, 1, 96)


# ---------------------------------------------------------------- bad input


def test_unknown_preset_names_it_and_the_choices():
    with pytest.raises(ConfigError, match="'huge'") as e:
        preset("huge")
    assert "tiny" in str(e.value) and "small" in str(e.value) and "base" in str(e.value)


def test_bad_config_values_are_config_errors():
    with pytest.raises(ConfigError, match="dec_heads"):
        tiny_config(dec_width=30, dec_heads=4)
    with pytest.raises(ConfigError, match="vit_patch_size"):
        tiny_config(vit_image_size=30)
    with pytest.raises(ConfigError, match="bogus"):
        ModelConfig.from_dict({**tiny_config().to_dict(), "bogus": 1})


@pytest.mark.parametrize(
    "shape, what",
    [((1, 3, 16, 16), "32"), ((1, 1, 32, 32), "3, 32, 32"), ((1, 4, 32, 32), "3, 32, 32"), ((3, 32, 32), "32")],
)
def test_wrong_image_size_or_channels_is_an_input_error(shape, what):
    model = tiny_model()
    with pytest.raises(InputError, match="images must be") as e:
        model.encode(torch.randn(*shape))
    assert what in str(e.value) and str(tuple(shape)) in str(e.value)  # says what it wants and what it got
    with pytest.raises(InputError, match="images"):  # through forward too (an unbatched image: a count mismatch)
        model(torch.randn(*shape), _ids([[1, 5]]))


def test_integer_images_are_an_input_error():
    with pytest.raises(InputError, match="dtype"):
        tiny_model().encode(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))


def test_teacher_forced_rejects_empty_and_too_long_sequences():
    model = tiny_model()
    images = random_images(1, model.cfg)
    with pytest.raises(InputError, match="T >= 1"):
        model.teacher_forced(images, torch.zeros(1, 0, dtype=torch.long))
    too_long = torch.ones(1, model.cfg.dec_max_len + 1, dtype=torch.long)
    with pytest.raises(InputError, match="dec_max_len=32"):
        model.teacher_forced(images, too_long)
    model.teacher_forced(images, torch.ones(1, model.cfg.dec_max_len, dtype=torch.long))  # exactly the maximum is fine
    with pytest.raises(InputError, match="2 images for 1 text rows"):
        model.teacher_forced(random_images(2, model.cfg), _ids([[1, 5]]))


def test_default_config_is_still_valid():
    cfg = ModelConfig()
    assert dataclasses.asdict(cfg)["dec_positions"] == "sinusoidal"
