"""What every configuration shares: reading and writing as JSON, unknown fields named with the closest
known ones, removed options told apart from typos, and the `--help` text of a field (`_opt`)."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import types
import typing
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..json_object import read_object

# Options that were removed (docs/results/tried.md), each with its old default. A saved config.json, train_config.json
# or --config file that still holds one at that value loads as if the field were absent; at any other value it
# is refused in one line naming the option: the code that served it is gone from the package.
REMOVED_FIELDS: dict[str, dict[str, Any]] = {
    "ModelConfig": dict(dec_rope=False, dec_cross_rope=False, dec_cross_rope_follow=False, dec_cross_coords=False,
                        vit_keep_prefix=True),
    "TrainConfig": dict(question_weights={}, transpose=0.0, packing="across"),
}


def check_fields(cls, d: dict, what: str) -> dict:
    """Raise ConfigError naming unknown keys of `d` (and the closest field names) for dataclass `cls`, or a
    removed option (REMOVED_FIELDS) set to anything but its old default; return `d` without removed fields."""
    removed = REMOVED_FIELDS.get(cls.__name__, {})
    for key in sorted(set(d) & set(removed)):
        if d[key] != removed[key]:
            raise ConfigError(f"{what} {key}={d[key]!r}: vqa no longer has this option (docs/results/tried.md says "
                              "what it measured)")
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


@functools.cache
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def scalar_type(cls, name: str) -> tuple[type | None, bool]:
    """(int, float, bool or str, whether None is allowed) for field `name` of dataclass `cls`; (None, _) for a
    field of another type."""
    hint, optional = _hints(cls)[name], False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        hint = args[0] if len(args) == 1 else None
    return (hint if hint in (int, float, bool, str) else None), optional


def type_problem(cls, name: str, value: Any, label: str | None = None) -> str | None:
    """What is wrong with `value` as field `name` of dataclass `cls` when that field is an int, float, bool or
    str (or one of them or None), e.g. "dec_depth must be an integer"; None when it fits or the field is of
    another type. A bool is not an int, a whole float is not an int, an int is a float. `label`: the name the
    message gives the field (default `name`)."""
    tp, optional = scalar_type(cls, name)
    if tp is None or (value is None and optional):
        return None
    ok = {int: lambda v: isinstance(v, int) and not isinstance(v, bool),
          float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          bool: lambda v: isinstance(v, bool), str: lambda v: isinstance(v, str)}[tp](value)
    what = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}[tp]
    return None if ok else f"{label or name} must be {what}{' or null' if optional else ''}"


def number_problem(name: str, value: Any, lo: float = -math.inf, *, above: bool = False,
                   below: float | None = None, integer: bool = False) -> str | None:
    """What is wrong with the number `value` (already of its field's type; None: nothing) for `name`: not
    finite, below `lo` (or not above it, with `above`), or not below `below`; None when it is fine."""
    if value is None:
        return None
    try:
        number = value if integer else float(value)
    except OverflowError:  # an int past float's range
        number = math.inf
    if (integer or math.isfinite(number)) and (number > lo if above else number >= lo) and (
            below is None or number < below):
        return None
    need = [] if lo == -math.inf else [f"{'>' if above else '>='} {lo:g}"]
    need += [] if below is None else [f"< {below:g}"]
    return f"{name} must be {'an integer' if integer else 'a finite number'} {' and '.join(need)}".rstrip()


def _opt(help: str, **extra) -> Any:
    return dict(help=help, **extra)
