"""One process trains in a run folder at a time: an exclusive lock on `RUN/.lock`, held for the whole run.

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
    def __init__(self, folder: str | Path):
        self.path = Path(folder) / ".lock"
        self._file = None

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
            raise ConfigError(f"{self.path.parent} is being trained by {owner}; wait for it to finish, stop it, "
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
