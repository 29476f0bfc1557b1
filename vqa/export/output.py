"""Where an export may write: never into, over or around the checkpoint it reads; into a non-empty folder
only with --force and only over an earlier export (it holds MARKER); written beside the target and swapped in
only once complete. Shared by `vqa export --onnx` and `--transformers`."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from ..errors import ConfigError

MARKER = "vqa-export.json"  # written last into every export folder: what --force may replace


def _check_apart(checkpoint_path: str | Path, out: str | Path, flag: str = "--onnx") -> None:
    """An export never writes into, over or around the checkpoint (or run) folder it reads."""
    src, dst = Path(checkpoint_path).resolve(), Path(out).resolve()
    if dst == src or src.is_relative_to(dst) or dst.is_relative_to(src):
        where = "is" if dst == src else "holds" if src.is_relative_to(dst) else "lies inside"
        raise ConfigError(f"{flag} {out} {where} the checkpoint folder {checkpoint_path}: choose an output "
                          "folder outside it")


def check_output(checkpoint_path: str | Path, out: str | Path, force: bool = False, flag: str = "--onnx") -> bool:
    """Refuse an output folder that is, holds, or lies inside the checkpoint (or run) folder, and one that
    holds files unless `force` is given and it is an earlier export (it holds MARKER). True when `out` holds
    an earlier export that `force` allows to be replaced."""
    _check_apart(checkpoint_path, out, flag)
    dst = Path(out).resolve()
    if not dst.exists():
        return False
    if not dst.is_dir():
        raise ConfigError(f"{flag} {out} is a file, not a folder")
    if not any(dst.iterdir()):
        return False
    if not force:
        raise ConfigError(f"{out} is not empty; pass --force to replace it")
    if not (dst / MARKER).is_file():
        raise ConfigError(f"{out} is not empty and was not written by vqa export (no {MARKER}); --force only "
                          "replaces an earlier export: remove it yourself or choose another folder")
    return True


def export_replacing(checkpoint_path: str | Path, out: str | Path, force: bool, writer, flag: str) -> Path:
    """`writer(checkpoint_path, folder)` (`vqa.export.onnx.export_onnx`, `vqa.export.hf_export.export_transformers`)
    into a temporary sibling of `out`, swapped in only once the export succeeded: an earlier export in `out`
    (which `force` allows) stays as it was when the export fails."""
    replace = check_output(checkpoint_path, out, force, flag)
    out = Path(out).resolve()  # `--onnx .` has a name to put the temporary sibling beside
    out.parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    tmp, old = out.with_name(f".{out.name}.tmp-{tag}"), out.with_name(f".{out.name}.old-{tag}")
    try:
        writer(checkpoint_path, tmp)
        if replace:
            out.rename(old)
        elif out.exists():
            out.rmdir()  # empty
        try:
            tmp.rename(out)
        except OSError:
            if replace:
                old.rename(out)  # the earlier export back in place
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return out


