"""The image encoder (vqa/model/vision.py): the memory it gives the decoder (the CLS token, then the patches),
ViT weights from timm, from a local file (vqa/weights/vit.py, through `build_model`) or from a checkpoint, a
frozen ViT, the convolutional stem, and the errors a bad ViT choice gets."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import make_batch, random_images, tiny_config, tiny_model

from vqa.errors import ConfigError
from vqa.model import VQAModel
from vqa.weights import model_files
from vqa.weights.language_model import build_model


def test_memory_is_the_cls_token_then_the_patches():
    cfg = tiny_config()
    grid = cfg.vit_image_size // cfg.vit_patch_size
    images = random_images(2, cfg)
    model = tiny_model()
    assert model.vision.grid == grid and model.vision.num_prefix == 1
    assert model.encode(images).shape == (2, 1 + grid * grid, cfg.dec_width)


def test_vit_pretrained_asks_timm_for_its_weights_and_a_checkpoint_never_does(monkeypatch, tmp_path):
    import timm

    asked, real = [], timm.create_model

    def spy(name, pretrained=False, **kwargs):
        asked.append(pretrained)
        return real(name, pretrained=False, **kwargs)  # no download in the tests

    monkeypatch.setattr(timm, "create_model", spy)
    assert tiny_model(vit_pretrained=True) is not None and asked == [False]  # the architecture alone: random
    model = build_model(tiny_config(vit_pretrained=True))
    assert asked == [False, False, True]  # built, then timm's weights copied in (vqa.weights.vit)
    model_files.save(model, tmp_path / "m")
    model_files.load(tmp_path / "m")
    assert asked == [False, False, True, False]  # a checkpoint brings its own weights


def test_vit_freeze_leaves_vit_params_without_grad():
    model = tiny_model(vit_freeze=True)
    model.train()
    assert all(not p.requires_grad for p in model.vision.vit.parameters())
    assert all(p.requires_grad for p in model.vision.proj.parameters())
    assert all(p.requires_grad for p in model.decoder.parameters())
    ids, mask = make_batch([[1, 5]], [[6, 2]])
    model.teacher_forced(random_images(1, model.cfg), ids, loss_mask=mask).loss.backward()
    assert all(p.grad is None for p in model.vision.vit.parameters())
    assert model.vision.proj.weight.grad is not None
    assert model.num_parameters(trainable_only=True) == model.num_parameters() - sum(
        p.numel() for p in model.vision.vit.parameters()
    )
    unfrozen = tiny_model()
    assert all(p.requires_grad for p in unfrozen.vision.vit.parameters())


@pytest.mark.parametrize("suffix", ["safetensors", "pth"])
def test_vit_weights_saved_to_a_local_file_load_back_identically(tmp_path, suffix):
    source = tiny_model(seed=1)
    state = source.vision.vit.state_dict()
    path = tmp_path / f"vit.{suffix}"
    if suffix == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    else:
        torch.save(state, path)
    torch.manual_seed(2)
    loaded = build_model(tiny_config(vit_weights=str(path))).vision.vit.state_dict()
    fresh = tiny_model(seed=2).vision.vit.state_dict()  # the same seed without the file
    assert loaded.keys() == state.keys()
    for k in state:
        assert torch.equal(loaded[k], state[k]), k
    assert not all(torch.equal(fresh[k], state[k]) for k in state if state[k].is_floating_point())
    assert not torch.equal(fresh["patch_embed.proj.weight"], state["patch_embed.proj.weight"])


def test_missing_vit_weights_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no file"):
        build_model(tiny_config(vit_weights=str(tmp_path / "nowhere.safetensors")))


# ---------------------------------------------------------------- convolutional stem


def test_conv_stem_replaces_the_patch_projection_and_keeps_the_token_layout(tmp_path):
    from helpers import tiny_config
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = VQAModel(tiny_config(vit_conv_stem=True)).eval()
    proj = model.vision.vit.patch_embed.proj
    assert isinstance(proj, torch.nn.Sequential)
    strides = [m.stride[0] for m in proj if isinstance(m, torch.nn.Conv2d)]
    assert math.prod(strides) == model.cfg.vit_patch_size  # the stem still cuts the image into grid x grid
    images = torch.randn(2, 3, 32, 32)
    assert model.encode(images).shape == (2, 1 + 4 * 4, model.cfg.dec_width)
    # 3x3 convolutions overlap: a pixel change just across a patch border reaches the neighbouring token
    # (a plain patch projection would leave that token unchanged)
    bumped = images.clone()
    bumped[:, :, 0, 8] += 5.0  # first pixel of patch (0, 1)
    with torch.no_grad():
        a, b = model.vision.vit.forward_features(images), model.vision.vit.forward_features(bumped)
        pa, pb = model.vision.vit.patch_embed(images), model.vision.vit.patch_embed(bumped)
    assert not torch.allclose(pa[:, 0], pb[:, 0])  # token of patch (0, 0) sees across the border
    assert not torch.allclose(a, b)
    # its weights round-trip through a local file like any timm ViT's
    save_file(model.vision.vit.state_dict(), str(tmp_path / "stem.safetensors"))
    again = build_model(tiny_config(vit_conv_stem=True, vit_weights=str(tmp_path / "stem.safetensors")))
    for k, v in model.vision.vit.state_dict().items():
        assert torch.equal(v, again.vision.vit.state_dict()[k]), k


def test_conv_stem_needs_a_power_of_two_patch():
    from helpers import tiny_config

    with pytest.raises(ConfigError, match="power-of-two"):
        VQAModel(tiny_config(vit_conv_stem=True, vit_image_size=36, vit_patch_size=6))


# ---------------------------------------------------------------- bad input


def test_unknown_timm_model_names_it():
    with pytest.raises(ConfigError, match="vit_nonexistent_patch9"):
        VQAModel(tiny_config(vit_name="vit_nonexistent_patch9"))


def test_a_timm_model_that_is_not_a_vit_is_a_config_error():
    with pytest.raises(ConfigError, match="resnet18"):
        VQAModel(tiny_config(vit_name="resnet18"))
