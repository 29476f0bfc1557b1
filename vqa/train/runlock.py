"""One process trains in a run folder at a time: an exclusive lock on `RUN/.lock`, held for the whole run.
(`vqa caption / ask --out FILE` locks its output the same way: `RunLock.for_file`.)

The lock is `flock`, which the operating system releases when the process ends however it ends (a kill
included), so a stale lock never blocks a resume. The file holds the owner's pid and host for the message a
second process gets. (On a platform without `fcntl` the lock is skipped.)
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from ..errors import ConfigError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


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
        if fcntl is None:
            return self
        f = open(self.path, "a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            owner = f.read().strip() or "another process"
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
