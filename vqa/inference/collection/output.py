"""The JSON Lines a `vqa caption` / `vqa ask` job writes: one record a line, flushed as it is written, what a
rerun finds already done, the part files of many processes and their merge.

What this tool writes: every line a JSON object whose first field is "image" (`RECORD_START`); a file that is
not that (another program's JSON) is refused, never changed. A rerun skips the records whose key
(`loader.record_key`) is written, once their `settings` match the run's; a last line cut short by a kill is
removed (and said so), a malformed line elsewhere stops the job before any work, naming the line. One process
writes an output at a time (`.NAME.lock` beside it, as `vqa.locks` locks a run folder).

Many processes: rank r appends to `NAME.part-0000r`, its records carrying their `index` (position in the input
order); the merge writes the records already in NAME first (a prefix), then the parts' records by index
without it, replaces NAME at once (a temporary file renamed over it) and removes the parts. `vqa caption
--merge NAME` does the same by hand, for parts gathered from several machines.

`JobSettings`: each record carries as `settings` the digest of the model (`vqa.identity`), its precision, the
task and the decoding settings; a rerun into an output whose records carry another digest is refused before
any decoding (it would skip every input and mix two models' records). Batch size, workers, the device and
compiling change no output beyond float rounding: not part of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ...errors import ConfigError, DataError
from ...locks import RunLock
from .loader import record_key


def part_path(out: Path, rank: int) -> Path:
    return out.with_name(f"{out.name}.part-{rank:05d}")


def part_files(out: Path) -> list[Path]:
    if not out.parent.is_dir():
        return []
    prefix = f"{out.name}.part-"
    return sorted(p for p in out.parent.iterdir() if p.name.startswith(prefix) and p.name[len(prefix):].isdigit())


RECORD_START = b'{"image": '  # how every line this tool writes begins


def read_records(path: Path, repair: bool = False) -> list[dict]:
    """The records of a JSON Lines output. A last line without its newline that starts as a record is a write
    cut short: with `repair`, removed from the file (or completed, when it parses). Any other line that is not
    a record: DataError, the file unchanged."""
    if not path.is_file():
        return []
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    out = []
    for lineno, line in enumerate(lines, 1):
        if line.strip():
            out.append(_parse(path, lineno, line))
    if tail.strip():
        try:
            rec = _parse(path, len(lines) + 1, tail)
        except DataError:
            if not tail.startswith(RECORD_START):
                raise
            rec = None
        if repair:
            with open(path, "r+b") as f:
                if rec is None:
                    f.truncate(len(raw) - len(tail))
                    print(f"vqa: {path}:{len(lines) + 1}: removed a record cut short by an interrupted run",
                          file=sys.stderr)
                else:
                    f.seek(0, os.SEEK_END)
                    f.write(b"\n")
        if rec is not None:
            out.append(rec)
    return out


def _parse(path: Path, lineno: int, line: bytes) -> dict:
    where = f"{path}:{lineno}"
    try:
        rec = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{where}: malformed JSON in the output file ({e}); is it another program's file? It is "
                        "never changed: choose another --out") from None
    if not isinstance(rec, dict) or not line.startswith(RECORD_START):
        raise DataError(f"{where}: not a record of vqa caption / ask (a JSON object whose first field is 'image'); "
                        "a file of another program is never changed: choose another --out")
    return rec


class Output:
    """Where a job's records go: `out` (None: standard output), or this rank's part of it."""

    def __init__(self, out: str | Path | None, rank: int = 0, world: int = 1):
        self.out = Path(out) if out is not None else None
        self.rank, self.world = rank, world
        self.parted = self.out is not None and (world > 1 or bool(part_files(self.out)))
        self.path = part_path(self.out, rank) if self.parted else self.out
        self._file = None
        self._locks: list[RunLock] = []
        self.written = self.errors = 0
        self.done_keys: set = set()  # what `done()` found, once the output is open (`job.open_output`)
        self.failed_keys: set = set()
        self.settings_found: set = set()  # the `settings` digests of the records found

    def lock(self) -> None:
        """Refuse a second writer: rank 0 locks the output, every rank its part (ConfigError when taken)."""
        if self.out is None:
            return
        if self.out.is_dir():
            raise ConfigError(f"--out {self.out} is a folder, not a file")
        try:  # the lock file lies beside the output: its folder is made first
            self.out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            why = "a file is in the way" if isinstance(e, (FileExistsError, NotADirectoryError)) else e.strerror
            raise ConfigError(f"--out {self.out}: cannot create its folder {self.out.parent}: {why}") from None
        targets = ([self.out] if self.rank == 0 else []) + ([self.path] if self.parted else [])
        for t in targets:
            self._locks.append(RunLock.for_file(t).acquire())

    def lock_fds(self) -> tuple[int, ...]:
        return tuple(lk._file.fileno() for lk in self._locks if lk._file is not None)

    def done(self) -> tuple[set, set]:
        """(keys already written to the output and any part, the keys among them whose record is an error);
        repairs this process's file."""
        if self.out is None:
            return set(), set()
        recs = read_records(self.out, repair=self.path == self.out)
        for p in part_files(self.out):
            recs += read_records(p, repair=p == self.path)
        self.settings_found = {r.get("settings") for r in recs}
        return {record_key(r) for r in recs}, {record_key(r) for r in recs if "error" in r}

    def write(self, rec: dict, index: int) -> None:
        if self._file is None:
            if self.path is None:
                self._file = sys.stdout
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")
        if self.parted:
            rec = {**rec, "index": index}
        self._file.write(json.dumps(rec, ensure_ascii=False) + "\n")
        self._file.flush()
        self.written += 1
        self.errors += "error" in rec

    def close(self) -> None:
        if self._file is not None and self._file is not sys.stdout:
            self._file.close()
        self._file = None

    def release(self) -> None:
        self.close()
        for lk in self._locks:
            lk.release()
        self._locks = []


def merge(out: str | Path) -> tuple[int, int]:
    """Merge `out`'s part files into it (the module docstring); returns (records, errors) in `out`."""
    out = Path(out)
    parts = part_files(out)
    first = read_records(out)
    seen = {record_key(r) for r in first}
    made_with = {r.get("settings"): out for r in first[:1]}  # a settings digest -> a file whose records carry it
    rest = []
    for p in parts:
        for r in read_records(p):
            if "index" not in r:
                raise DataError(f"{p}: a record without its 'index': not a part file of vqa caption / ask")
            made_with.setdefault(r.get("settings"), p)
            rest.append(r)
    if len(made_with) > 1:  # records of two models or two decoding settings are never mixed in one output
        (a, fa), (b, fb) = list(made_with.items())[:2]
        raise DataError(f"{fb}: its records were made with other settings ({b}) than those of {fa} ({a}); "
                        "nothing merged")
    rest.sort(key=lambda r: r["index"])
    records = list(first)
    for r in rest:
        r.pop("index")
        if record_key(r) not in seen:
            seen.add(record_key(r))
            records.append(r)
    tmp = out.with_name(f".{out.name}.merging")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    for p in parts:
        p.unlink()
        p.with_name(f".{p.name}.lock").unlink(missing_ok=True)
    return len(records), sum(1 for r in records if "error" in r)


# ------------------------------------------------------------------------- what a record's `settings` say


@dataclass(frozen=True)
class JobSettings:
    """The settings of one job; `digest` is what its records carry."""

    fields: dict  # {"task" (caption, ask, point), "weights", "precision", "answers" (top-k), GenerationConfig's}

    @classmethod
    def of(cls, pred, task: str, generation, top_k: int = 1) -> JobSettings:
        weights = pred.identity or "in-memory"
        return cls(dict(task=task, weights=weights, precision=pred.precision, answers=int(top_k),
                        **generation.to_dict()))

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.fields, sort_keys=True, default=str).encode()).hexdigest()[:12]

    def describe(self) -> str:
        g = {k: v for k, v in self.fields.items() if k not in ("task", "weights", "precision", "answers")}
        shown = ", ".join(f"{k}={v}" for k, v in g.items() if v is not None)
        return f"{self.fields['task']}, weights {self.fields['weights']}, {self.fields['precision']}, {shown}"

    def check(self, out: Path | None, found: set) -> None:
        """ConfigError when the records already in `out` carry another digest than this job's."""
        other = sorted(str(d or "none") for d in found if d != self.digest)
        if out is None or not other:
            return
        raise ConfigError(f"--out {out}: its records were made with other settings (settings {other[0]}; this "
                          f"run's are {self.digest}: {self.describe()}); another model or other decoding options "
                          "need another --out")


__all__ = ["Output", "merge", "read_records", "part_files", "part_path", "JobSettings"]
