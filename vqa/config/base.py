"""What every configuration shares: reading and writing as JSON, unknown fields named with the closest
known ones, removed options told apart from typos, and the `--help` text of a field (`_opt`)."""

from __future__ import annotations

import dataclasses
import difflib
import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..jsonfile import read_object

# Options that were removed (docs/tried.md), each with its old default. A saved config.json, train_config.json
# or --config file that still holds one at that value loads as if the field were absent; at any other value it
# is refused in one line naming the option: the code that served it is gone (REMOVED_IN has it).
REMOVED_FIELDS: dict[str, dict[str, Any]] = {
    "ModelConfig": dict(dec_rope=False, dec_cross_rope=False, dec_cross_rope_follow=False, dec_cross_coords=False,
                        vit_keep_prefix=True),
    "TrainConfig": dict(question_weights={}, transpose=0.0),
}
REMOVED_IN = "cb9f6a9"  # the last commit with their code


def check_fields(cls, d: dict, what: str) -> dict:
    """Raise ConfigError naming unknown keys of `d` (and the closest field names) for dataclass `cls`, or a
    removed option (REMOVED_FIELDS) set to anything but its old default; return `d` without removed fields."""
    removed = REMOVED_FIELDS.get(cls.__name__, {})
    for key in sorted(set(d) & set(removed)):
        if d[key] != removed[key]:
            raise ConfigError(f"{what} {key}={d[key]!r}: vqa no longer has this option (docs/tried.md; its code "
                              f"is in commit {REMOVED_IN})")
    d = {k: v for k, v in d.items() if k not in removed}
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(d) - set(known))
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, known, n=3, cutoff=0.75)
            close += [k for k in known if len(key) > 3 and key in k and k not in close]  # beams -> num_beams
            hints.append(f"{key!r}" + (f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""))
        raise ConfigError(f"unknown {what} field(s): {', '.join(hints)}")
    return d


class _Config:
    """to_dict / from_dict / save / load / replace for the config dataclasses."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, what: str | None = None):
        if not isinstance(d, dict):
            raise ConfigError(f"a {cls.__name__} must be a JSON object, got {type(d).__name__}")
        d = check_fields(cls, d, what or cls.__name__)
        try:
            return cls(**d)
        except TypeError as e:
            raise ConfigError(f"{cls.__name__}: {e}") from None

    def replace(self, **changes):
        changes = check_fields(type(self), changes, type(self).__name__)
        return dataclasses.replace(self, **changes)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path):
        return cls.from_dict(read_object(path, ConfigError), what=f"{path}:")


def _opt(help: str, **extra) -> Any:
    return dict(help=help, **extra)
