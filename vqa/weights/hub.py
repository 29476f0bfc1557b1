"""Checkpoints by name on the Hugging Face Hub: `locate("user/name")` downloads one with huggingface_hub's
`snapshot_download` (the safetensors and JSON files only: weights, config, tokenizer, card, adapters) into
the user's Hugging Face cache (HF_HUB_CACHE / HF_HOME) and returns the local folder; HF_HUB_OFFLINE=1 reads
that cache alone. A revision (branch, tag or commit) is pinned with `revision=` or as `user/name@rev`.

A name that is a folder here is always the folder: the Hub is asked only for a name that is not one, and a
name that is neither says so in one CheckpointError line.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import CheckpointError

ALLOW_PATTERNS = ["*.safetensors", "*.json"]  # never a pickle, nor the model card or anything else in the repo
# owner/name as the Hub spells them (letters, digits, "-", "_", "."), then an optional @revision
_REPO_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})(?:@(?P<rev>[\w./-]+))?")


def split_name(name: str) -> tuple[str, str | None] | None:
    """("user/name", revision or None) for a Hub name (`user/name` or `user/name@rev`), else None."""
    m = _REPO_ID.fullmatch(str(name))
    if m is None or ".." in m["repo"] or "--" in m["repo"] or m["repo"].endswith((".", "-")):
        return None
    return m["repo"], m["rev"]


def is_hub_name(name: str | Path) -> bool:
    """A name that is not a folder here and has the Hub's `user/name[@rev]` form."""
    return not isinstance(name, Path) and not Path(name).exists() and split_name(name) is not None


def download(name: str, revision: str | None = None) -> Path:
    """The local snapshot folder of the Hub model `name` (`user/name` or `user/name@rev`; `revision` wins over
    the `@rev`) holding its safetensors and JSON files; a CheckpointError line when it cannot be had."""
    split = split_name(name)
    if split is None:
        raise CheckpointError(f"no checkpoint at {name}: not a folder, nor a Hugging Face Hub name (user/name)")
    repo, rev = split
    rev = revision or rev
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.utils import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    at = f"{repo}@{rev}" if rev else repo
    where = f"no checkpoint at {name}: not a folder here"
    try:
        folder = snapshot_download(repo, revision=rev, allow_patterns=ALLOW_PATTERNS)
    except GatedRepoError:
        raise CheckpointError(f"{where}, and the Hub's {repo} is gated: accept its terms on its page, then log "
                              "in with `hf auth login`") from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{where}, and the Hub's {repo} has no revision {rev!r}") from None
    except RepositoryNotFoundError:
        raise CheckpointError(f"{where}, and the Hugging Face Hub has no model {repo} (or it is private: log in "
                              "with `hf auth login`)") from None
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise CheckpointError(f"{where}, and {at} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) "
                                  "while HF_HUB_OFFLINE is set") from None
        raise CheckpointError(f"{where}, and the Hugging Face Hub could not be reached to download {at} (nor "
                              "is it in the cache)") from None
    except (HfHubHTTPError, OSError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise CheckpointError(f"{where}, and downloading {at} from the Hugging Face Hub failed ({first})") from None
    folder = Path(folder)
    if not (folder / "model.safetensors").is_file():
        raise CheckpointError(f"{at} on the Hugging Face Hub holds no model.safetensors: not a vqa checkpoint")
    return folder


def locate(name: str | Path, revision: str | None = None) -> Path:
    """The folder a checkpoint name stands for: a folder here as it is (`checkpoint.resolve` picks its
    best/ or last/), else the Hub snapshot of `user/name[@rev]`. A revision for a folder is an error."""
    if is_hub_name(name):
        return download(str(name), revision)
    if revision is not None:
        raise CheckpointError(f"--revision {revision}: {name} is not a name on the Hugging Face Hub (user/name)")
    return Path(name)


__all__ = ["ALLOW_PATTERNS", "split_name", "is_hub_name", "download", "locate"]
