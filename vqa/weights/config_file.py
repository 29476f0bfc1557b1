"""A checkpoint's `config.json`: the ModelConfig's fields and the checkpoint format version they follow.

    {"format_version": 1, "vit_name": "vit_tiny_patch16_224", ...}

FORMAT_VERSION counts changes to what a checkpoint's files mean. A file of an older version is migrated on
reading (MIGRATIONS, one step per version); a file of a newer version, or one whose version is not a
number, is refused with one line that names the version and what to do. A file without the field was
written before versions were recorded (version 0).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from ..config import ModelConfig
from ..errors import CheckpointError, ConfigError
from ..json_object import read_object

FORMAT_VERSION = 1
KEY = "format_version"


# version v -> the same content as v + 1; version 0 (no `format_version` field) holds version 1's fields
MIGRATIONS: dict[int, Callable[[dict], dict]] = {0: lambda d: d}


def write(cfg: ModelConfig, path: str | Path) -> None:
    Path(path).write_text(json.dumps({KEY: FORMAT_VERSION, **cfg.to_dict()}, indent=2) + "\n")


def migrate(d: dict, where: str) -> dict:
    """The fields of a config.json's object `d`, brought to FORMAT_VERSION."""
    d = dict(d)
    version = d.pop(KEY, 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise CheckpointError(f"{where}: format_version {version!r} is not a version number; the file is damaged "
                              "or was not written by vqa")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{where}: checkpoint format version {version} is newer than this vqa reads "
                              f"(up to {FORMAT_VERSION}); load it with the vqa release that wrote it, or a newer one")
    while version < FORMAT_VERSION:
        d = MIGRATIONS[version](d)
        version += 1
    return d


def read(path: str | Path) -> ModelConfig:
    """The ModelConfig of a checkpoint's config.json, any version this vqa reads."""
    path = Path(path)
    d = read_object(path, CheckpointError, "a JSON object of model fields")
    try:
        return ModelConfig.from_dict(migrate(d, str(path)))  # the path leads the message below
    except (ConfigError, TypeError) as e:
        raise CheckpointError(f"{path}: incompatible config: {e}") from None
