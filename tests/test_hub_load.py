"""Loading a checkpoint by its Hugging Face Hub name, with no network: a cache in huggingface_hub's documented
layout, HF_HUB_OFFLINE=1. The Predictor, `vqa ask`, `vqa eval` and `vqa train --init-from` take the name; a
revision is pinned with `@rev` or --revision; a name that is neither a folder nor in reach says so in one line."""

from __future__ import annotations

import json

import pytest
from cli_fixtures import fails, vqa
from hub_fixtures import add_snapshot, offline_cache
from predict_fixtures import COLOR_Q, shared_checkpoint, write_pictures

from vqa.errors import CheckpointError
from vqa.inference.predict import Predictor
from vqa.weights import checkpoint, hub

MAIN, V1 = "a" * 40, "b" * 40  # commits


@pytest.fixture
def cache(tmp_path, monkeypatch):
    source = checkpoint.resolve(shared_checkpoint())
    card = json.loads((source / "card.json").read_text())
    add_snapshot(tmp_path / "hub", "user/name", source, MAIN)
    add_snapshot(tmp_path / "hub", "user/name", source, V1, refs=("v1",), card={**card, "step": 7})
    offline_cache(monkeypatch, tmp_path / "hub")
    monkeypatch.chdir(tmp_path)  # no folder called user/name here
    return tmp_path / "hub"


def test_a_name_loads_the_snapshot_its_revision_names(cache):
    local = Predictor.from_pretrained(shared_checkpoint(), device="cpu")
    named = Predictor.from_pretrained("user/name", device="cpu")
    assert named.path == cache / "models--user--name" / "snapshots" / MAIN
    pictures = write_pictures(cache.parent / "pictures")
    for picture in pictures.values():
        assert named.answer(picture, COLOR_Q).answer == local.answer(picture, COLOR_Q).answer
        assert named.caption(picture).caption == local.caption(picture).caption
    assert named.card["step"] == local.card["step"] != 7
    assert Predictor.from_pretrained("user/name@v1", device="cpu").card["step"] == 7
    assert Predictor.from_pretrained("user/name", revision="v1", device="cpu").card["step"] == 7
    assert checkpoint.load(f"user/name@{V1}")[2]["step"] == 7  # a commit, as `vqa train --init-from` passes it


def test_a_name_neither_here_nor_in_the_cache_is_one_line(cache):
    with pytest.raises(CheckpointError) as e:
        Predictor.from_pretrained("user/other", device="cpu")
    assert str(e.value) == (f"no checkpoint at user/other: not a folder here, and user/other is not in the Hugging "
                            f"Face cache ({cache}) while HF_HUB_OFFLINE is set")
    with pytest.raises(CheckpointError, match="user/name@v2 is not in the Hugging Face cache"):
        Predictor.from_pretrained("user/name@v2", device="cpu")


def test_a_folder_of_that_name_wins_over_the_hub(cache, tmp_path):
    folder = tmp_path / "user" / "name"
    checkpoint.save(folder, *checkpoint.load(shared_checkpoint())[:2], card={"step": 11})
    assert Predictor.from_pretrained("user/name", device="cpu").card["step"] == 11
    with pytest.raises(CheckpointError, match="--revision v1: user/name is not a name on the Hugging Face Hub"):
        Predictor.from_pretrained("user/name", revision="v1", device="cpu")


def test_only_safetensors_and_json_are_asked_for(monkeypatch, tmp_path):
    asked = {}

    def fake(repo, **kw):
        asked.update(repo=repo, **kw)
        return str(checkpoint.resolve(shared_checkpoint()))

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake)
    monkeypatch.chdir(tmp_path)
    assert hub.locate("user/name@main", revision="v3") == checkpoint.resolve(shared_checkpoint())
    assert asked == dict(repo="user/name", revision="v3", allow_patterns=["*.safetensors", "*.json"])


@pytest.mark.parametrize("name, split", [("user/name", ("user/name", None)), ("u-1/n.2@v1.0", ("u-1/n.2", "v1.0")),
                                         ("runs/tiny/best", None), ("/abs/path", None), ("./user/name", None),
                                         ("user/..", None), ("user--x/name", None), ("name", None)])
def test_hub_names_have_the_hubs_form(name, split):
    assert hub.split_name(name) == split


def test_the_commands_take_a_name_and_a_revision(cache, capsys):
    picture = write_pictures(cache.parent / "pictures")["red_circle"]
    expected = Predictor.from_pretrained(shared_checkpoint(), device="cpu").answer(picture, COLOR_Q).answer
    capsys.readouterr()
    assert vqa(["ask", "--checkpoint", "user/name", picture, COLOR_Q, "--device", "cpu"]) == 0
    assert capsys.readouterr().out.strip() == expected
    assert vqa(["ask", "--checkpoint", "user/name", "--revision", "v1", picture, COLOR_Q, "--json",
                "--device", "cpu"]) == 0
    assert json.loads(capsys.readouterr().out)["answer"] == expected
    err = fails(capsys, ["caption", "--checkpoint", "nobody/nothing", picture, "--device", "cpu"],
                r"^vqa caption: error: no checkpoint at nobody/nothing: not a folder here, and nobody/nothing is not "
                r"in the Hugging Face cache .* while HF_HUB_OFFLINE is set\n$", status=1)
    assert "train one with" not in err  # the hint is for a run folder that is missing
