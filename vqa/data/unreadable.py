"""Training's tally of the pictures it cannot read (missing, truncated, not a picture, over the pixel limit).

A data set of real pictures often holds a few bad ones; one of them must not stop a run at its first pass, and
many of them (a wrong folder, a broken copy) must not train silently on what is left. So training skips a bad
picture with one warning line (the file, the reason and the count so far), once per picture however many
epochs read it, and stops with a DataError saying so once more than `max_share` of the data set's pictures
failed (`vqa train --max-unreadable`). Evaluation during training does the same over the pictures it
evaluates (`vqa eval` alone stops at the first). `vqa data info --check-images` lists them all before training.

The tally is shared by the loader's workers: flags and a count in shared memory, inherited when the workers
start, so the count is this process's whole, whichever worker read the picture.
"""

from __future__ import annotations

import multiprocessing as mp
import sys

from ..errors import DataError


class UnreadablePictures:
    """Flags for `total` pictures (by index) and the count of those that failed; `add` warns or stops."""

    def __init__(self, total: int, max_share: float, flag: str = "--max-unreadable", what: str = "training"):
        self.total, self.max_share, self.flag, self.what = int(total), float(max_share), flag, what
        self._flags = mp.Array("B", max(1, self.total), lock=False)  # picture i failed
        self._count = mp.Value("q", 0)  # its lock guards the flags too

    @property
    def count(self) -> int:
        return int(self._count.value)

    def allowed(self) -> int:
        """The most pictures that may fail before the run stops."""
        return int(self.max_share * self.total)

    def add(self, i: int, reason: str) -> None:
        """Picture i failed to read (`reason` names the file): one warning the first time, a DataError once
        the failures are over the share."""
        with self._count.get_lock():
            if self._flags[i]:
                return
            self._flags[i] = 1
            self._count.value += 1
            n = self._count.value
        during = "" if self.what == "training" else f" in {self.what}"
        print(f"vqa train: skipped a picture{during}: {reason} ({n:,} unreadable of {self.total:,} so far)",
              file=sys.stderr, flush=True)
        if n > self.allowed():
            raise DataError(f"{n:,} of the {self.total:,} {self.what} pictures are unreadable, more than "
                            f"{self.flag} {self.max_share:g} allows ({self.allowed():,}); `vqa data info "
                            "--check-images` lists them")


__all__ = ["UnreadablePictures"]
