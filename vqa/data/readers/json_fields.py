"""Reading the data set's JSON files: bytes (a UTF-8 BOM dropped), text, JSON, and typed fields, each failure a
DataError naming the file and the line and column (or array position) and field.

The official files are parsed with msgspec into typed structs (`decode_fast`); when that fails, the readers read
the file again with the standard library (`read_json`, `get_list`, `required`) to say exactly where.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from ...errors import DataError


def decode_text(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(
            f"{path}:{line}:{col}: not valid UTF-8 (byte 0x{raw[e.start]:02x}); save the file as UTF-8"
        ) from None


def read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e.strerror or e})") from None
    return raw[3:] if raw.startswith(b"\xef\xbb\xbf") else raw


def read_json(path: Path) -> Any:
    """Parsed JSON; malformed JSON or non-UTF-8 bytes -> DataError with the file, line and column."""
    raw = read_bytes(path)
    try:
        return json.loads(decode_text(path, raw))
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}:{e.colno}: malformed JSON: {e.msg}") from None


_FAST_ERRORS = (msgspec.MsgspecError, UnicodeDecodeError, ValueError)


def decode_fast(raw: bytes | msgspec.Raw, decoder: msgspec.json.Decoder) -> Any:
    """The typed decode, or None when it fails (the caller then reads the slow way to say where)."""
    try:
        return decoder.decode(raw)
    except _FAST_ERRORS:
        return None


def get_list(obj: Any, key: str, path: Path, fmt: str) -> list:
    if not isinstance(obj, dict) or not isinstance(obj.get(key), list):
        raise DataError(f"{path}: expected a JSON object with a {key!r} list ({fmt} format)")
    return obj[key]


def required(obj: Any, key: str, types: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise DataError(f"{where}: missing field {key!r}")
    v = obj[key]
    if not isinstance(v, types) or isinstance(v, bool):
        names = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise DataError(f"{where}: field {key!r} must be {names}, got {json.dumps(v)[:60]}")
    return v


def read_list(path: Path, decoder: msgspec.json.Decoder, key: str, fmt: str, item: Callable[[Any, str], Any]) -> list:
    """The `key` list of a JSON object file, typed by `decoder` (a struct with that list field); when that fails,
    read the slow way with `item(element, where)` per element, which raises DataError at the first problem."""
    fast = decode_fast(read_bytes(path), decoder)
    if fast is not None:
        return getattr(fast, key)
    return [item(obj, f"{path}: {key}[{i}]") for i, obj in enumerate(get_list(read_json(path), key, path, fmt))]
