"""One place for each decision: presets (model + training defaults), image statistics from timm, the
generated command line, config files, the layered resolution of `vqa train` (preset < file < saved run <
flags), field-name typos, and `save_pretrained` / `from_pretrained`."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from helpers import random_images, tiny_model

from vqa.cli import build_parser
from vqa.config import PRESETS, GenerationConfig, ModelConfig, TrainConfig, preset
from vqa.errors import CheckpointError, ConfigError
from vqa.options import given
from vqa.train import resolve
from vqa.weights import model_files


@pytest.mark.parametrize("name", list(PRESETS))
def test_each_preset_normalizes_images_as_its_timm_weights_expect(name):
    import timm
    from timm.data import resolve_model_data_config

    cfg = preset(name, dec_pretrained=None)  # the *-gpt2 presets' language model is not needed (nor downloaded)
    vit = timm.create_model(cfg.vit_name, pretrained=False, num_classes=0)
    data = resolve_model_data_config(vit)
    assert cfg.vit_mean == pytest.approx(data["mean"]) and cfg.vit_std == pytest.approx(data["std"])
    if "vit_image_size" not in PRESETS[name].model:  # presets for timm's weights keep timm's input size
        assert cfg.vit_image_size == data["input_size"][-1]


def test_a_weights_tag_brings_its_own_statistics():
    clip = ModelConfig(vit_name="vit_base_patch16_clip_224.openai")
    assert clip.vit_mean == pytest.approx((0.48145466, 0.4578275, 0.40821073))
    assert ModelConfig(vit_name="vit_small_patch16_224").vit_mean == (0.5, 0.5, 0.5)
    assert ModelConfig(vit_mean=(0.1, 0.2, 0.3)).vit_mean == (0.1, 0.2, 0.3)  # explicit values win (old checkpoints)
    with pytest.raises(ConfigError, match="unknown timm model 'vit_nosuch'"):
        ModelConfig(vit_name="vit_nosuch")


@pytest.mark.parametrize("name", list(PRESETS))
def test_a_preset_is_one_entry_with_its_training_defaults(name):
    p = PRESETS[name]
    cfg = TrainConfig(data="d", out="o", preset=name).with_preset_defaults()
    assert (cfg.lr, cfg.optimizer) == (p.lr, p.optimizer)
    for key, value in p.train.items():
        assert getattr(resolve({"data": "d", "out": "o", "preset": name}), key) == value
    assert set(p.model) <= {f.name for f in dataclasses.fields(ModelConfig)}


def test_naming_a_timm_model_brings_its_own_architecture():
    cfg = preset("tiny", vit_name="vit_small_patch16_224")
    assert (cfg.vit_width, cfg.vit_depth, cfg.vit_heads) == (None, None, None)  # timm's ViT-S: 384 x 12, 6 heads
    assert (cfg.vit_image_size, cfg.vit_patch_size, cfg.vit_conv_stem) == (64, 8, True)  # the rest stays
    from vqa.model.vision import create_vit

    vit = create_vit(cfg)
    assert vit.embed_dim == 384 and len(vit.blocks) == 12 and vit.blocks[0].attn.num_heads == 6
    assert preset("tiny", vit_name="vit_small_patch16_224", vit_depth=2).vit_depth == 2


def test_a_misspelt_field_names_the_closest_real_ones(shapes_dir, tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"'dec_dept' \(did you mean 'dec_depth'\?\)"):
        preset("tiny", dec_dept=4)
    from vqa.cli import main

    assert main(["train", "--data", str(shapes_dir), "--out", str(tmp_path / "r"), "--set", "vit_widht=32"]) == 2
    err = capsys.readouterr().err
    assert "unknown model config field(s): 'vit_widht' (did you mean 'vit_width'" in err and "Traceback" not in err


def test_every_train_config_field_is_an_option_and_help_comes_from_the_field():
    p = build_parser(["train"])
    text = " ".join(p._subparsers._group_actions[0].choices["train"].format_help().split())
    for f in dataclasses.fields(TrainConfig):
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        assert flag in text, flag
    assert "epochs, --max-steps" not in text  # nothing hand-written beside the fields
    assert "cosine schedule is fitted to it" in text


def test_every_option_says_what_it_is():
    """A TrainConfig field's help is its option's --help text; a ModelConfig field (set with --set, which
    points to them) has its help in the comment on its line."""
    import inspect

    for f in dataclasses.fields(TrainConfig):
        assert len(f.metadata.get("help", "")) > 10, f.name
    lines = inspect.getsource(ModelConfig).splitlines()
    for f in dataclasses.fields(ModelConfig):
        line = next(x for x in lines if x.strip().startswith(f"{f.name}:"))
        assert len(line.partition("  # ")[2].strip()) > 10, f.name


def _resolve(argv: list[str]) -> TrainConfig:
    args = ["train", *argv]
    ns = build_parser(args).parse_args(args)
    return resolve(given(ns, TrainConfig), ns.config, quiet=True)


def test_layers_preset_then_file_then_flags(tmp_path):
    plain = _resolve(["--data", "d", "--out", str(tmp_path / "a")])
    assert (plain.preset, plain.lr, plain.optimizer, plain.vit_lr_scale, plain.captions_per_image) == (
        "tiny", 1e-3, "muon", 0.3, 2)
    small = _resolve(["--data", "d", "--out", str(tmp_path / "a"), "--preset", "small"])
    assert (small.lr, small.optimizer, small.vit_lr_scale, small.captions_per_image) == (3e-4, "adamw", 1.0, 1)
    one = _resolve(["--data", "d", "--out", str(tmp_path / "a"), "--captions-per-image", "1"])
    assert one.captions_per_image == 1  # a flag typed wins over the preset's training default
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("preset: small\nlr: 0.002\nmax_steps: 50\nmodel:\n  dec_depth: 2\ntasks: vqa\n")
    from_file = _resolve(["--data", "d", "--out", str(tmp_path / "a"), "--config", str(yaml_file)])
    assert (from_file.preset, from_file.lr, from_file.max_steps, from_file.model, from_file.tasks) == (
        "small", 0.002, 50, {"dec_depth": 2}, ("vqa",))
    both = _resolve(["--data", "d", "--out", str(tmp_path / "a"), "--config", str(yaml_file), "--lr", "1e-5",
                     "--set", "dec_width=64", "--time-limit", "1m"])
    assert both.lr == 1e-5 and both.model == {"dec_depth": 2, "dec_width": 64}
    assert both.time_limit == "1m" and both.max_steps is None  # one length option replaces another
    json_file = tmp_path / "run.json"
    json_file.write_text(json.dumps({"lr": 0.01, "batch-size": 8}))
    assert _resolve(["--data", "d", "--out", "o", "--config", str(json_file)]).batch_size == 8
    json_file.write_text(json.dumps({"learning_rate": 0.01}))
    with pytest.raises(ConfigError, match=r"'learning_rate'"):
        _resolve(["--data", "d", "--out", "o", "--config", str(json_file)])
    with pytest.raises(ConfigError, match="give one of --epochs, --max-steps, --time-limit"):
        _resolve(["--data", "d", "--out", "o", "--epochs", "2", "--max-steps", "3"])
    with pytest.raises(ConfigError, match="--data is required"):
        _resolve(["--out", str(tmp_path / "fresh")])


def test_resume_takes_the_saved_run_and_the_flags_typed_now_win(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    first = _resolve(["--data", "d", "--out", str(run), "--max-steps", "3", "--set", "dec_depth=1", "--seed", "4"])
    first.save(run / "train_config.json")
    again = _resolve(["--out", str(run), "--resume"])  # nothing else needed
    assert dataclasses.replace(again, resume=False) == first
    more = _resolve(["--out", str(run), "--resume", "--max-steps", "8", "--lr", "5e-4"])
    assert (more.max_steps, more.lr, more.seed, more.model) == (8, 5e-4, 4, {"dec_depth": 1})
    timed = _resolve(["--out", str(run), "--resume", "--time-limit", "2m"])
    assert timed.time_limit == "2m" and timed.max_steps is None
    for bad in (["--set", "dec_depth=2"], ["--preset", "small"], ["--optimizer", "adamw"]):
        with pytest.raises(ConfigError, match="cannot change on --resume"):
            _resolve(["--out", str(run), "--resume", *bad])


def test_generation_config_is_validated_in_one_place():
    assert GenerationConfig.for_task("vqa").max_new_tokens == 10
    assert GenerationConfig.for_task("caption").max_new_tokens == 64
    assert GenerationConfig(max_new_tokens=5).budget(3) == 3 and GenerationConfig().budget(7) == 7
    for bad, match in ((dict(method="nucleus"), "unknown decoding method"), (dict(num_beams=0), "num_beams"),
                       (dict(top_p=0), "top_p"), (dict(temperature=0), "temperature"), (dict(top_k=-1), "top_k"),
                       (dict(max_new_tokens=0), "max_new_tokens"), (dict(min_new_tokens=-1), "min_new_tokens")):
        with pytest.raises(ConfigError, match=match):
            GenerationConfig(**bad)
    with pytest.raises(ConfigError, match="did you mean 'num_beams'"):
        GenerationConfig().replace(beams=3)


def test_save_pretrained_and_from_pretrained_round_trip(tmp_path):
    model = tiny_model(seed=2)
    model_files.save(model, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    again = model_files.load(tmp_path / "m")
    assert again.cfg == model.cfg and not again.training
    images = random_images(2, model.cfg)
    ids = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]])
    torch.testing.assert_close(again.teacher_forced(images, ids).logits, model.teacher_forced(images, ids).logits,
                               atol=0, rtol=0)


def test_a_config_json_from_before_the_timm_statistics_still_loads(tmp_path):
    old = preset("tiny").to_dict()
    old.update(vit_mean=[0.5, 0.5, 0.5], vit_std=[0.5, 0.5, 0.5])  # written explicitly, as every checkpoint was
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert ModelConfig.load(tmp_path / "config.json") == preset("tiny")


def test_a_removed_option_loads_at_its_old_default_and_is_refused_when_on(tmp_path, shapes_dir, capsys):
    """Checkpoints and runs saved while vqa had an option that is gone (REMOVED_FIELDS, docs/results/tried.md) still
    load when the option held its default; one that had it on is refused in one line naming the option."""
    from vqa.config import REMOVED_FIELDS

    model = tiny_model()
    model_files.save(model, tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    old = {**saved, **REMOVED_FIELDS["ModelConfig"]}  # a config.json written before the removals
    (tmp_path / "m" / "config.json").write_text(json.dumps(old))
    assert model_files.load(tmp_path / "m").cfg == model.cfg
    for name, off in REMOVED_FIELDS["ModelConfig"].items():
        (tmp_path / "m" / "config.json").write_text(json.dumps({**saved, name: not off}))
        with pytest.raises(CheckpointError) as e:
            model_files.load(tmp_path / "m")
        assert f"{name}={not off!r}: vqa no longer has this option (docs/results/tried.md says" in str(e.value)
        assert "\n" not in str(e.value)
        with pytest.raises(ConfigError, match=f"{name}={not off!r}: vqa no longer has this option"):
            preset("tiny", **{name: not off})
    assert preset("tiny", dec_rope=False) == preset("tiny")  # --set at the old default: nothing to do
    # a run folder's train_config.json from before: resumes; with a removed option on: refused
    run = tmp_path / "run"
    run.mkdir()
    cfg = _resolve(["--data", "d", "--out", str(run), "--max-steps", "3"])
    (run / "train_config.json").write_text(json.dumps(
        {**cfg.to_dict(), **REMOVED_FIELDS["TrainConfig"], "model": {"dec_rope": False, "dec_depth": 1}}))
    again = _resolve(["--out", str(run), "--resume"])
    assert again.model == {"dec_depth": 1} and dataclasses.replace(again, resume=False, model={}) == cfg
    (run / "train_config.json").write_text(json.dumps({**cfg.to_dict(), "transpose": 0.5}))
    with pytest.raises(ConfigError, match=r"transpose=0.5: vqa no longer has this option"):
        _resolve(["--out", str(run), "--resume"])
    (run / "train_config.json").write_text(json.dumps({**cfg.to_dict(), "question_weights": {"spatial": 3}}))
    with pytest.raises(ConfigError, match=r"question_weights=\{'spatial': 3\}: vqa no longer has this option"):
        _resolve(["--out", str(run), "--resume"])
    (run / "train_config.json").write_text(json.dumps({**cfg.to_dict(), "packing": "image"}))
    with pytest.raises(ConfigError, match=r"packing='image': vqa no longer has this option \(docs/results/tried.md"):
        _resolve(["--out", str(run), "--resume"])
    # and on the command line: the flag is gone; --set of a removed model field says so
    from vqa.cli import main

    assert main(["train", "--data", str(shapes_dir), "--out", str(tmp_path / "r"), "--set", "dec_cross_rope=true"]) == 2
    err = capsys.readouterr().err
    assert "dec_cross_rope=True: vqa no longer has this option" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        _resolve(["--data", "d", "--out", "o", "--transpose", "0.5"])


def test_command_line_gives_back_the_config_it_was_made_from(tmp_path):
    """The `--max-steps` command a time-limited run prints: parsed again, it is the same configuration with
    the time limit replaced by the steps, and it names only what differs from the preset's defaults."""
    import shlex

    from vqa.train.runfolder import command_line

    typed = ["--data", "data/shapes", "--out", "runs/t", "--time-limit", "10m", "--set", "dec_depth=2", "--seed", "1",
             "--caption-weight", "1.0", "--tasks", "vqa", "--hflip", "--lr", "0.002", "--resume"]
    cfg = _resolve(typed)
    cmd = command_line(cfg, time_limit=None, max_steps=1837, out="runs/t-1837")
    words = shlex.split(cmd)
    assert words[:2] == ["vqa", "train"] and "--time-limit" not in words and "--resume" not in words
    again = _resolve(words[2:])
    assert again == dataclasses.replace(cfg, time_limit=None, max_steps=1837, out="runs/t-1837", resume=False)
    plain = _resolve(["--data", "data/shapes", "--out", "runs/tiny", "--time-limit", "10m"])
    assert command_line(plain, time_limit=None, max_steps=900) == (
        "vqa train --data data/shapes --out runs/tiny --preset tiny --max-steps 900")
