"""Command-line options generated from the config dataclasses, and config files.

Every field of a config dataclass becomes an option (`max_steps` -> `--max-steps`, help and choices from the
field's metadata, booleans as `--x / --no-x`), whose default is *suppressed*: the parsed namespace holds only
what the user typed, so layers can be merged in order (defaults < preset < config file < saved run < command
line) without a default ever overriding a real choice.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any

from .errors import ConfigError


def _base_type(tp: Any) -> Any:
    """int for `int | None`, etc.; None for types an option cannot hold directly."""
    if isinstance(tp, str):
        tp = {"int": int, "float": float, "str": str, "bool": bool}.get(tp.split("|")[0].strip(), str)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _base_type(args[0]) if len(args) == 1 else str
    return tp if tp in (int, float, str, bool) else None


def _parse_set(item: str) -> tuple[str, Any]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{item!r}: expected FIELD=VALUE")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def parse_set(items: list[str]) -> dict:
    """["dec_depth=4", "vit_name=vit_small_patch16_224"] -> {"dec_depth": 4, "vit_name": "vit_small_patch16_224"}."""
    out = {}
    for item in items:
        try:
            key, value = _parse_set(item)
        except argparse.ArgumentTypeError as e:
            raise ConfigError(f"--set {e}") from None
        out[key] = value
    return out


class _SetAction(argparse.Action):
    """--set FIELD=VALUE (repeatable) into one dict; VALUE is read as JSON when it parses (3, 0.1, true)."""

    def __call__(self, parser, namespace, values, option_string=None):
        d = dict(getattr(namespace, self.dest, None) or {})
        key, value = values
        d[key] = value
        setattr(namespace, self.dest, d)


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls, *, exclude: tuple[str, ...] = (),
                            rename: dict[str, str] | None = None, title: str | None = None) -> None:
    """Add an option for every field of dataclass `cls` (defaults suppressed; see the module docstring).
    `rename` maps a field to another flag (e.g. to avoid a clash with a command's own option)."""
    rename = rename or {}
    group = parser.add_argument_group(title) if title else parser
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        meta = dict(f.metadata)
        flag = rename.get(f.name) or meta.get("flag") or "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        help_ = meta.get("help", "")
        if default not in (None, "", False) and not isinstance(default, dict):
            shown = ",".join(default) if isinstance(default, tuple) else default
            help_ += f" (default: {shown})"
        dest = f.name if f.name not in rename else rename[f.name].lstrip("-").replace("-", "_")
        # argparse formats help: a literal % is written %%
        kw: dict[str, Any] = dict(dest=dest, default=argparse.SUPPRESS, help=help_.replace("%", "%%"))
        if meta.get("metavar"):
            kw["metavar"] = meta["metavar"]
        if hints[f.name] is dict:  # FIELD=VALUE pairs, repeatable: --set
            group.add_argument(flag, action=_SetAction, type=_parse_set, **kw)
            continue
        tp = _base_type(hints[f.name])
        if tp is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
            continue
        choices = meta.get("choices")
        if callable(choices):  # computed late, e.g. from a registry that imports torch
            choices = choices()
        if choices:
            kw["choices"] = tuple(choices)
        elif "metavar" not in kw and tp in (int, float):
            kw["metavar"] = "N" if tp is int else "X"
        group.add_argument(flag, type=tp or str, **kw)


def given(args: argparse.Namespace, cls, rename: dict[str, str] | None = None) -> dict:
    """The fields of `cls` the user gave on the command line (`rename` as given to add_dataclass_arguments)."""
    dests = {f.name: f.name for f in dataclasses.fields(cls)}
    for name, flag in (rename or {}).items():
        dests[name] = flag.lstrip("-").replace("-", "_")
    values = vars(args)
    return {name: values[dest] for name, dest in dests.items() if dest in values}


def read_config_file(path: str | Path) -> dict:
    """A config file as a dict: JSON (`.json`) or YAML (`.yaml`, `.yml`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file")
    text = path.read_text()
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}:{e.lineno}:{e.colno}: not valid JSON: {e.msg}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of option names to values, got {type(data).__name__}")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def check_out_folder(flag: str, path: str | Path) -> None:
    """Refuse an output folder that is a file, or lies under one, before any work: ConfigError naming `flag`."""
    path = Path(path)
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise ConfigError(f"{flag} {path}" + (f": {p}" if p != path else "") + " is a file, not a folder")
            return


__all__ = ["add_dataclass_arguments", "check_out_folder", "given", "read_config_file", "parse_set"]
