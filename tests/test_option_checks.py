"""Options that cannot work are refused before any work, in one line naming the option: `vqa train`'s numbers
(TrainConfig), its `--set` model fields (ModelConfig), the decoding settings (GenerationConfig) and `vqa eval`'s
counts. The values that mean something on purpose (a rate of 0 freezes a part, --grad-clip 0 and
--eval-images 0 switch a thing off) are kept."""

from __future__ import annotations

import json
import math

import pytest
from cli_fixtures import fails, vqa
from conftest import tiny_set_flags
from predict_fixtures import shared_checkpoint, write_pictures

from vqa.config import GenerationConfig, ModelConfig, TrainConfig
from vqa.errors import ConfigError


def train_args(data, out, *extra):
    return ["train", "--data", data, "--out", out, "--batch-size", "4", "--warmup", "2", "--log-every", "1",
            "--eval-images", "4", "--lr", "3e-3", *tiny_set_flags(), *extra]


@pytest.mark.parametrize("flags, match", [
    (["--lr", "nan"], r"--lr must be a finite number >= 0, got nan"),
    (["--lr", "-1"], r"--lr must be a finite number >= 0, got -1"),
    (["--lr", "inf"], r"--lr must be a finite number >= 0, got inf"),
    (["--vit-lr", "-0.001"], r"--vit-lr must be a finite number >= 0"),
    (["--dec-lr", "inf"], r"--dec-lr must be a finite number >= 0, got inf"),
    (["--caption-weight", "-1"], r"--caption-weight must be a finite number >= 0, got -1"),
    (["--questions-per-image", "0"], r"--questions-per-image must be >= 1 while --tasks includes vqa"),
    (["--captions-per-image", "-1"], r"--captions-per-image must be an integer >= 0, got -1"),
    (["--captions-per-image", "0"], r"--captions-per-image must be >= 1 while --tasks includes caption"),
    (["--warmup", "-5"], r"--warmup must be an integer >= 0, got -5"),
    (["--eval-every", "-1"], r"--eval-every must be an integer >= 0, got -1"),
    (["--eval-images", "-1"], r"--eval-images must be an integer >= 0, got -1"),
    (["--dist-timeout", "0"], r"--dist-timeout must be a finite number > 0, got 0"),
    (["--weight-decay", "-0.1"], r"--weight-decay must be a finite number >= 0"),
    (["--weight-decay", "nan"], r"--weight-decay must be a finite number >= 0, got nan"),
    (["--grad-clip", "-1"], r"--grad-clip must be a finite number >= 0, got -1"),
    (["--grad-clip", "nan"], r"--grad-clip must be a finite number >= 0, got nan"),
    (["--workers", "-2"], r"--workers must be an integer >= -1, got -2"),
])
def test_a_training_option_out_of_its_range_is_refused_naming_it(shapes_dir, tmp_path, capsys, flags, match):
    run = tmp_path / "run"
    fails(capsys, train_args(shapes_dir, run, "--max-steps", "1", *flags), match)
    assert not run.exists()  # refused before the run folder was made


@pytest.mark.parametrize("flags, match", [
    (["--time-limit", "0"], r"--time-limit must be longer than 0 seconds, got '0'"),
    (["--time-limit", "0m"], r"--time-limit must be longer than 0 seconds, got '0m'"),
    (["--epochs", "inf"], r"--epochs must be a finite number > 0, got inf"),
])
def test_a_run_length_of_nothing_or_forever_is_refused(shapes_dir, tmp_path, capsys, flags, match):
    fails(capsys, train_args(shapes_dir, tmp_path / "run", *flags), match)


def test_the_values_that_switch_something_off_are_kept():
    assert TrainConfig(data="d", out="o", lr=0.0).lr == 0.0  # keeps the weights (tests of --init-from use it)
    cfg = TrainConfig(data="d", out="o", vit_lr=0.0, dec_lr=0.0, grad_clip=0.0, eval_every=0, eval_images=0,
                      warmup=0, weight_decay=0.0, caption_weight=0.0, tasks="caption", questions_per_image=0)
    assert (cfg.encoder_lr, cfg.decoder_lr, cfg.grad_clip, cfg.eval_images) == (0.0, 0.0, 0.0, 0)
    assert TrainConfig(data="d", out="o", tasks="vqa", captions_per_image=0).captions_per_image == 0
    with pytest.raises(ConfigError, match="--accum must be an integer >= 1, got 0"):
        TrainConfig(data="d", out="o", accum=0)
    with pytest.raises(ConfigError, match=r"--lr must be a number or null, got 'fast'"):  # e.g. from a --config file
        TrainConfig(data="d", out="o", lr="fast")
    with pytest.raises(ConfigError, match=r"--hflip must be true or false, got 'yes please'"):
        TrainConfig(data="d", out="o", hflip="yes please")


@pytest.mark.parametrize("item, match", [
    ("dec_depth=abc", r"--set dec_depth=abc: dec_depth must be an integer"),
    ("dec_depth=0", r"--set dec_depth=0: dec_depth must be an integer >= 1"),
    ("dec_depth=2.5", r"--set dec_depth=2.5: dec_depth must be an integer"),
    ("dec_heads=0", r"--set dec_heads=0: dec_heads must be an integer >= 1"),
    ("dec_dropout=2", r"--set dec_dropout=2: dec_dropout must be a finite number >= 0 and < 1"),
    ("dec_dropout=1", r"--set dec_dropout=1: dec_dropout must be a finite number >= 0 and < 1"),
    ("dec_mlp_ratio=0", r"--set dec_mlp_ratio=0: dec_mlp_ratio must be a finite number > 0"),
    ("vit_width=-32", r"--set vit_width=-32: vit_width must be an integer >= 1"),
    ("dec_qk_norm=maybe", r"--set dec_qk_norm=maybe: dec_qk_norm must be true or false"),
    ("vit_mean=[0.5,0.5]", r"--set vit_mean=\[0.5, 0.5\]: vit_mean must be three finite numbers"),
    ("vit_name=7", r"--set vit_name=7: vit_name must be a string"),
])
def test_a_bad_set_value_is_refused_naming_the_field(shapes_dir, tmp_path, capsys, item, match):
    run = tmp_path / "run"
    fails(capsys, train_args(shapes_dir, run, "--max-steps", "1", "--set", item), match)
    assert not run.exists()


def test_fields_that_do_not_fit_together_are_refused_before_training(shapes_dir, tmp_path, capsys):
    odd = ["--set", "dec_width=33", "--set", "dec_heads=3", "--set", "vit_memory_pos=false"]  # tiny's is on
    fails(capsys, train_args(shapes_dir, tmp_path / "a", "--max-steps", "1", *odd),
          r"dec_width=33 must be even for dec_positions='sinusoidal'")
    fails(capsys, train_args(shapes_dir, tmp_path / "b", "--max-steps", "1", "--set", "vit_heads=3"),
          r"vit_width=32 is not divisible by vit_heads=3")
    with pytest.raises(ConfigError, match=r"dec_width=33 must be even for dec_positions='sinusoidal'"):
        ModelConfig(vit_image_size=32, vit_patch_size=8, dec_width=33, dec_heads=3)
    assert ModelConfig(vit_image_size=32, vit_patch_size=8, dec_width=33, dec_heads=3,
                       dec_positions="learned").dec_width == 33  # learned positions take any width
    with pytest.raises(ConfigError, match=r"dec_depth must be an integer >= 1, got 0"):  # a config.json, an API call
        ModelConfig(vit_image_size=32, vit_patch_size=8, dec_depth=0)


@pytest.mark.parametrize("changes, match", [
    (dict(temperature=1e-45), r"temperature must be a finite number >= 0.0001, got 1e-45 .*method greedy"),
    (dict(temperature=math.inf), r"temperature must be a finite number >= 0.0001, got inf"),
    (dict(temperature=math.nan), r"temperature must be a finite number >= 0.0001, got nan"),
    (dict(length_penalty=math.nan), r"length_penalty must be a finite number, got nan"),
    (dict(length_penalty=-math.inf), r"length_penalty must be a finite number, got -inf"),
])
def test_decoding_settings_that_break_decoding_are_refused(changes, match):
    with pytest.raises(ConfigError, match=match):
        GenerationConfig(method="sample", **changes)


def test_the_apps_controls_stay_inside_what_the_config_accepts():
    for f in GenerationConfig.__dataclass_fields__.values():
        if "ui" in f.metadata:
            for end in GenerationConfig.ui_bounds(f.name):
                GenerationConfig(**{f.name: end})  # both ends of every slider and box are valid settings


def test_the_lowest_temperature_samples_and_a_lower_one_is_refused_on_the_command_line(tmp_path, capsys):
    ckpt, img = shared_checkpoint(), write_pictures(tmp_path)["red_circle"]
    capsys.readouterr()
    assert vqa(["caption", "--checkpoint", ckpt, "--device", "cpu", img]) == 0
    greedy = capsys.readouterr().out
    assert vqa(["caption", "--checkpoint", ckpt, "--device", "cpu", img, "--method", "sample",
                 "--temperature", "1e-4", "--seed", "1"]) == 0
    assert capsys.readouterr().out == greedy  # at 1e-4, sampling picks the likeliest token
    fails(capsys, ["caption", "--checkpoint", ckpt, img, "--method", "sample", "--temperature", "1e-45"],
          r"temperature must be a finite number >= 0.0001")


@pytest.mark.parametrize("flags, match", [
    (["--batch-size", "0"], r"--batch-size must be at least 1, got 0"),
    (["--max-images", "0"], r"--max-images must be at least 1, got 0"),
    (["--max-images", "-1"], r"--max-images must be at least 1, got -1"),
])
def test_eval_refuses_counts_below_one_and_writes_nothing(shapes_dir, tmp_path, capsys, flags, match):
    out = tmp_path / "scores"
    fails(capsys, ["eval", "--checkpoint", shared_checkpoint(), "--data", shapes_dir, "--device", "cpu",
                   "--out", out, *flags], match)
    assert not out.exists()


def test_eval_images_0_trains_without_evaluating_and_logs_no_empty_scores(shapes_dir, tmp_path, capsys):
    run = tmp_path / "run"
    capsys.readouterr()
    assert vqa(train_args(shapes_dir, run, "--max-steps", "2", "--eval-images", "0")) == 0
    err = capsys.readouterr().err
    assert "step 2:" not in err and "step 1:" not in err, err[-2000:]  # no "step 2: " line without scores
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert records and not any(k.startswith("val_") for r in records for k in r)
    assert (run / "best" / "model.safetensors").is_file() and (run / "last" / "train_state.pt").is_file()
    assert "0: no evaluation" in " ".join(TrainConfig.__dataclass_fields__["eval_images"].metadata["help"].split())
