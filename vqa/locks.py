"""One process writes a place at a time: `vqa train` holds an exclusive lock on `RUN/.lock` for the whole run, and
`vqa caption / ask --out FILE` one on `.FILE.lock` beside its output (`RunLock.for_file`).

The lock is the operating system's (filelock's descriptor lock: `flock` on Unix, `LockFileEx` on Windows), which
it releases when the process ends however it ends (a kill included), so a stale lock never blocks a resume. The
file holds the owner's pid and host for the message a second process gets.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from filelock import lock_descriptor

from .errors import ConfigError


class RunLock:
    def __init__(self, folder: str | Path, what: str | None = None, doing: str = "trained"):
        self.path = Path(folder) / ".lock"
        self.what, self.doing = what or str(Path(folder)), doing  # for the message a second process gets
        self._file = None

    @classmethod
    def for_file(cls, path: str | Path) -> RunLock:
        """A lock for writing the file `path`: `.NAME.lock` beside it."""
        path = Path(path)
        lock = cls(path.parent, what=str(path), doing="written")
        lock.path = path.parent / f".{path.name}.lock"
        return lock

    def acquire(self) -> RunLock:
        f = open(self.path, "a+")
        if not lock_descriptor(f.fileno(), blocking=False):
            try:
                f.seek(0)
                owner = f.read().strip() or "another process"
            except OSError:  # Windows: the owner's locked byte cannot be read
                owner = "another process"
            f.close()
            raise ConfigError(f"{self.what} is being {self.doing} by {owner}; wait for it to finish, stop it, "
                              "or choose another --out") from None
        f.seek(0)
        f.truncate()
        f.write(f"process {os.getpid()} on {socket.gethostname()}")
        f.flush()
        self._file = f
        return self

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing the file drops the lock
            self._file = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


__all__ = ["RunLock"]
