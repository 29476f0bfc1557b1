"""`vqa push RUN --repo-id user/name`: publish a checkpoint on the Hugging Face Hub, and `save_pretrained`, the
same files written into a local folder (`vqa push RUN --out DIR`).

What goes: the checkpoint's model.safetensors, config.json, tokenizer.json, card.json and LoRA adapters where
the run trained them (never train_state.pt, a pickle), and README.md, the model card (`vqa.export.model_card`).
The upload is one commit through huggingface_hub (`HfApi.create_repo`, then `create_commit`), which finds the
token itself (HF_TOKEN, or `hf auth login`'s): vqa never reads, prints or writes one.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from ..errors import CheckpointError, ConfigError
from ..weights.checkpoint import read_card, resolve
from ..weights.hub import split_name
from .model_card import eval_summaries, model_card

FILES = ("model.safetensors", "config.json", "tokenizer.json", "card.json")
ADAPTERS = ("adapter.safetensors", "adapter_config.json")  # vqa.weights.lora's, where the run trained them


def checkpoint_files(folder: Path) -> list[str]:
    """The names of the files to publish from checkpoint `folder`; CheckpointError when one it needs is missing."""
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise CheckpointError(f"checkpoint {folder} is missing {', '.join(missing)}: nothing was published")
    return [*FILES, *(name for name in ADAPTERS if (folder / name).is_file())]


def training_command(run: Path) -> str | None:
    """The `vqa train` command of the run whose folder (or checkpoint folder's parent) holds train_config.json."""
    from ..config import TrainConfig
    from ..train.runfolder import SAVED, command_line

    for folder in (run, run.parent):
        if (folder / SAVED).is_file():
            try:
                return command_line(TrainConfig.from_dict(json.loads((folder / SAVED).read_text())))
            except (ValueError, OSError):
                return None
    return None


def prepare(run: str | Path, repo_id: str, license: str = "mit") -> tuple[Path, list[str], str]:
    """(checkpoint folder, files to publish from it, README.md's text) of `run`, a run or checkpoint folder."""
    if split_name(repo_id) is None or "@" in repo_id:
        raise ConfigError(f"--repo-id {repo_id}: a Hugging Face Hub name is user/name")
    if not Path(run).exists():
        raise CheckpointError(f"no checkpoint at {run}: the folder does not exist")
    folder = resolve(Path(run))
    files = checkpoint_files(folder)
    card = read_card(folder)
    text = model_card(repo_id, card, eval_summaries(folder, card), training_command(Path(run)),
                      [*files, "README.md"], license)
    return folder, files, text


def save_pretrained(run: str | Path, out: str | Path, repo_id: str = "user/name", license: str = "mit") -> Path:
    """The files `push_to_hub` would upload, and its README.md, in the folder `out` (new or empty)."""
    folder, files, text = prepare(run, repo_id, license)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out}: the folder is not empty")
    out.mkdir(parents=True, exist_ok=True)
    for name in files:
        shutil.copy2(folder / name, out / name)
    (out / "README.md").write_text(text)
    return out


def push_to_hub(run: str | Path, repo_id: str, private: bool = False, revision: str | None = None,
                license: str = "mit", message: str | None = None):
    """Upload `run`'s checkpoint and model card to the Hub repository `repo_id` (created if new, `private` then;
    `revision`: a branch, created from main if new) in one commit; returns huggingface_hub's CommitInfo."""
    from huggingface_hub import CommitOperationAdd, HfApi

    folder, files, text = prepare(run, repo_id, license)
    api = HfApi()
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    if revision:
        api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
    ops = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(folder / name)) for name in files]
    ops.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=text.encode()))
    return api.create_commit(repo_id, ops, commit_message=message or f"vqa push: {Path(run).name}",
                             revision=revision, repo_type="model")


def run(args: argparse.Namespace) -> int:
    if args.out:
        out = save_pretrained(args.run, args.out, args.repo_id, args.license)
        print(f"wrote {len(list(out.iterdir()))} files to {out}; upload them with `vqa push {args.run} --repo-id "
              f"{args.repo_id}`")
        return 0
    from huggingface_hub.utils import HfHubHTTPError

    try:
        info = push_to_hub(args.run, args.repo_id, args.private, args.revision, args.license, args.message)
    except HfHubHTTPError as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        if status in (401, 403):
            raise CheckpointError(f"the Hugging Face Hub refused the upload to {args.repo_id} ({status}): log in "
                                  "with `hf auth login` or set HF_TOKEN to a token that may write there") from None
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise CheckpointError(f"uploading to {args.repo_id} failed: {first}") from None
    except OSError as e:  # no network, HF_HUB_OFFLINE
        raise CheckpointError(f"uploading to {args.repo_id} failed: {str(e).splitlines()[0][:200]}") from None
    at = f"@{args.revision}" if args.revision else ""
    print(f"pushed {args.run} to {info.repo_url} (commit {str(info.oid)[:8]}); load it with "
          f"Predictor.from_pretrained({args.repo_id + at!r}) or `vqa ask --checkpoint {args.repo_id}{at} ...`")
    return 0


__all__ = ["FILES", "ADAPTERS", "checkpoint_files", "prepare", "save_pretrained", "push_to_hub"]
