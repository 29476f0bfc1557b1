"""`vqa push`: what huggingface_hub is asked to send (its HfApi methods replaced, no network) against the run
folder -- the files and their paths in the repository, the model card's front matter and text -- and `--out`,
which writes the same files and card into a folder that then loads by name from a Hub cache."""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path

import huggingface_hub
import pytest
import yaml
from cli_fixtures import fails, vqa
from hub_fixtures import add_snapshot, offline_cache
from predict_fixtures import COLOR_Q, shared_checkpoint, write_pictures

from vqa.config import TrainConfig
from vqa.inference.predict import Predictor
from vqa.weights import checkpoint

SECRET = "hf_ThisIsNotARealTokenButMustNeverBeShown"
PUSHED = {"model.safetensors", "config.json", "tokenizer.json", "card.json", "adapter.safetensors",
          "adapter_config.json"}


@pytest.fixture
def run(tmp_path) -> Path:
    """A run folder: best/ (the shared checkpoint, with adapter files and a train state beside), its
    train_config.json, an evaluation of its step and a stale one of an earlier step."""
    run = tmp_path / "runs" / "tiny"
    shutil.copytree(checkpoint.resolve(shared_checkpoint()), run / "best")
    card = json.loads((run / "best" / "card.json").read_text())
    card["data"] = "/home/someone/data/shapes"
    (run / "best" / "card.json").write_text(json.dumps(card))
    (run / "best" / "adapter.safetensors").write_bytes(b"adapter weights")
    (run / "best" / "adapter_config.json").write_text('{"rank": 4}')
    (run / "best" / "train_state.pt").write_bytes(b"a pickle that must stay home")
    TrainConfig.from_dict(dict(data="/home/someone/data/shapes", out=str(run), preset="tiny", max_steps=300,
                               lr=0.002)).save(run / "train_config.json")
    for name, step, acc in (("val", card["step"], 97.5), ("old", card["step"] - 1, 12.0)):
        (run / f"best-eval-{name}").mkdir()
        (run / f"best-eval-{name}" / "summary.json").write_text(json.dumps(
            dict(step=step, data="/home/someone/data/shapes", split=name, vqa_accuracy=acc, **{"CIDEr-D": 88.125})))
    return run


@pytest.fixture
def hub_calls(monkeypatch):
    calls = {}

    def create_repo(self, repo_id, **kw):
        calls["repo"] = (repo_id, kw)

    def create_branch(self, repo_id, **kw):
        calls["branch"] = (repo_id, kw)

    def create_commit(self, repo_id, operations, **kw):
        ops = list(operations)
        content = {}
        for op in ops:
            src = op.path_or_fileobj
            content[op.path_in_repo] = src if isinstance(src, bytes) else Path(src).read_bytes()
        calls["commit"] = (repo_id, content, kw)
        return types.SimpleNamespace(repo_url=f"https://huggingface.co/{repo_id}", oid="0123456789abcdef")

    for name, fn in (("create_repo", create_repo), ("create_branch", create_branch), ("create_commit", create_commit)):
        monkeypatch.setattr(huggingface_hub.HfApi, name, fn)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    return calls


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


def test_push_sends_the_checkpoint_and_its_card_in_one_commit(run, hub_calls, capsys):
    capsys.readouterr()
    assert vqa(["push", run, "--repo-id", "user/name", "--private", "--revision", "dev"]) == 0
    out = capsys.readouterr()
    assert hub_calls["repo"] == ("user/name", dict(private=True, exist_ok=True, repo_type="model"))
    assert hub_calls["branch"] == ("user/name", dict(branch="dev", exist_ok=True, repo_type="model"))
    repo, content, kw = hub_calls["commit"]
    assert repo == "user/name" and kw["revision"] == "dev"
    assert set(content) == PUSHED | {"README.md"}  # no train_state.pt, no eval folders
    for name in PUSHED:
        assert content[name] == (run / "best" / name).read_bytes(), name
    card = content["README.md"].decode()
    meta = front_matter(card)
    assert meta["license"] == "mit" and meta["library_name"] == "vqa"
    assert meta["pipeline_tag"] == "visual-question-answering" and meta["datasets"] == ["shapes"]
    assert {"vqa", "visual-question-answering", "image-to-text"} <= set(meta["tags"])
    results = meta["model-index"][0]["results"]
    got = {(r["task"]["type"], m["type"], m["value"], r["dataset"]["split"]) for r in results for m in r["metrics"]}
    assert got == {("visual-question-answering", "accuracy", 97.5, "val"), ("image-to-text", "cider", 88.125, "val")}
    assert "vqa train --data /home/someone/data/shapes --out " + str(run) + " --preset tiny" in card
    assert "--max-steps 300" in card and "--lr 0.002" in card
    assert 'Predictor.from_pretrained("user/name")' in card and "vqa ask --checkpoint user/name" in card
    assert "https://huggingface.co/user/name" in out.out and "user/name@dev" in out.out
    assert "it scored step" in out.err  # the stale evaluation was left out, and said so
    assert SECRET not in out.out + out.err + card


def test_out_writes_the_same_files_and_card_and_they_load_by_name(run, hub_calls, tmp_path, monkeypatch):
    assert vqa(["push", run, "--repo-id", "user/name"]) == 0
    pushed = hub_calls["commit"][1]
    assert vqa(["push", run, "--repo-id", "user/name", "--out", tmp_path / "folder"]) == 0
    written = {p.name: p.read_bytes() for p in (tmp_path / "folder").iterdir()}
    assert written == pushed
    add_snapshot(tmp_path / "hub", "user/name", tmp_path / "folder", "c" * 40)
    offline_cache(monkeypatch, tmp_path / "hub")
    monkeypatch.chdir(tmp_path)
    for name in ("adapter.safetensors", "adapter_config.json"):  # the fixture's stand-ins, not real adapters
        (tmp_path / "hub" / "models--user--name" / "snapshots" / ("c" * 40) / name).unlink(missing_ok=True)
    picture = write_pictures(tmp_path / "pictures")["blue_square"]
    expected = Predictor.from_pretrained(shared_checkpoint(), device="cpu").answer(picture, COLOR_Q).answer
    assert Predictor.from_pretrained("user/name", device="cpu").answer(picture, COLOR_Q).answer == expected


def test_push_refuses_what_cannot_be_published(run, hub_calls, tmp_path, capsys):
    fails(capsys, ["push", run, "--repo-id", "name-alone"], r"--repo-id name-alone: a Hugging Face Hub name is "
          r"user/name\n$", status=2)
    fails(capsys, ["push", tmp_path / "nowhere", "--repo-id", "user/name"], r"no checkpoint at .*nowhere", status=1)
    (run / "best" / "tokenizer.json").unlink()
    fails(capsys, ["push", run, "--repo-id", "user/name"], r"checkpoint .*best is missing tokenizer.json: nothing "
          r"was published\n$", status=1)
    assert "commit" not in hub_calls


def test_a_refused_token_is_one_line_without_the_token(run, hub_calls, monkeypatch, capsys):
    from huggingface_hub.utils import HfHubHTTPError

    def refuse(self, repo_id, **kw):
        raise HfHubHTTPError(f"401 Client Error: Unauthorized for url (token {SECRET[:6]}...)",
                             response=types.SimpleNamespace(status_code=401, headers={}, request=None))

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", refuse)
    err = fails(capsys, ["push", run, "--repo-id", "user/name"], r"the Hugging Face Hub refused the upload to "
                r"user/name \(401\): log in with `hf auth login` or set HF_TOKEN", status=1)
    assert SECRET not in err
