"""A checkpoint's config.json carries its format version: an older file is migrated, a newer or damaged one is
refused with one line that names the version and what to do (never a KeyError or TypeError from inside)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import random_images, tiny_model
from lm_fixtures import edit_config

from vqa.cli import main
from vqa.errors import CheckpointError
from vqa.weights import config_file, model_files
from vqa.weights.config_file import FORMAT_VERSION


@pytest.fixture
def saved(tmp_path):
    model = tiny_model(seed=3)
    folder = model_files.save(model, tmp_path / "m")
    return model, folder


def test_a_saved_config_names_the_current_version_and_loads_the_same_model(saved):
    model, folder = saved
    text = (folder / "config.json").read_text()
    d = json.loads(text)
    assert d["format_version"] == FORMAT_VERSION == 1
    assert text == json.dumps(d, indent=2) + "\n" and list(d)[0] == "format_version"  # readable, version first
    again = model_files.load(folder)
    assert again.cfg == model.cfg
    images, ids = random_images(2, model.cfg), torch.tensor([[1, 5, 6], [1, 7, 8]])
    torch.testing.assert_close(again.teacher_forced(images, ids).logits, model.teacher_forced(images, ids).logits,
                               atol=0, rtol=0)


def test_an_older_checkpoint_without_a_version_is_migrated(saved):
    model, folder = saved
    edit_config(folder, format_version=None)  # as every checkpoint was written before versions were recorded
    assert "format_version" not in json.loads((folder / "config.json").read_text())
    assert model_files.load(folder).cfg == model.cfg


def test_every_older_version_has_a_migration_step():
    assert sorted(config_file.MIGRATIONS) == list(range(FORMAT_VERSION))


def test_a_migration_step_is_applied(monkeypatch):
    # a future version 2 that renamed a field: version 1 files get the new name on reading
    monkeypatch.setattr(config_file, "FORMAT_VERSION", 2)
    monkeypatch.setitem(config_file.MIGRATIONS, 1, lambda d: {("dec_depth" if k == "old_depth" else k): v
                                                               for k, v in d.items()})
    assert config_file.migrate({"format_version": 1, "old_depth": 5}, "x") == {"dec_depth": 5}
    seen = []
    monkeypatch.setitem(config_file.MIGRATIONS, 0, lambda d: seen.append(dict(d)) or d)
    assert config_file.migrate({"old_depth": 5}, "x") == {"dec_depth": 5}  # 0 -> 1 -> 2
    assert seen == [{"old_depth": 5}]  # a file without the field is version 0: every step runs


def test_a_newer_checkpoint_is_refused_in_one_line(saved):
    _, folder = saved
    edit_config(folder, format_version=FORMAT_VERSION + 1, some_future_field=3)
    with pytest.raises(CheckpointError) as e:
        model_files.load(folder)
    msg = str(e.value)
    assert "\n" not in msg and f"version {FORMAT_VERSION + 1}" in msg
    assert "the vqa release that wrote it, or a newer one" in msg
    assert str(folder / "config.json") in msg


@pytest.mark.parametrize("bad", ["1", -1, 1.5, True, [1]])
def test_a_version_that_is_not_a_number_is_refused(saved, bad):
    _, folder = saved
    edit_config(folder, format_version=bad)
    with pytest.raises(CheckpointError, match="is not a version number; the file is damaged or was not written by vqa"):
        model_files.load(folder)


def test_a_config_that_is_not_an_object_is_refused(saved):
    _, folder = saved
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="expected a JSON object of model fields, got list"):
        model_files.load(folder)
    (folder / "config.json").write_text("{ nope")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        model_files.load(folder)


def test_the_cli_says_it_in_one_line(saved, tmp_path, capsys):
    _, folder = saved
    (folder / "tokenizer.json").write_text("{}")  # never reached: the config is read first
    edit_config(folder, format_version=99)
    image = tmp_path / "x.png"
    from PIL import Image

    Image.new("RGB", (8, 8)).save(image)
    assert main(["caption", "--checkpoint", str(folder), str(image)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "format version 99 is newer" in err[0]


def test_an_unknown_field_names_the_file_once_and_the_field(saved):
    _, folder = saved
    edit_config(folder, no_such_field=1)
    with pytest.raises(CheckpointError) as e:
        model_files.load(folder)
    assert str(e.value) == (f"{folder / 'config.json'}: incompatible config: unknown ModelConfig field(s): "
                            "'no_such_field'")
