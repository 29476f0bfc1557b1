"""Reading a JSON file that must hold one object, with errors that name the file, the line and the column."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import ConfigError, VQAError


def read_object(path: str | Path, error: type[VQAError] = ConfigError, what: str = "a JSON object") -> dict:
    """The object in `path`; `error` (naming the file, and the line and column of bad JSON) otherwise."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
    if not isinstance(d, dict):
        raise error(f"{path}: expected {what}, got {type(d).__name__}")
    return d
