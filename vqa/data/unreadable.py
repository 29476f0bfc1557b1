"""Training's tally of the pictures it cannot read (missing, truncated, not a picture, over the pixel limit).

A data set of real pictures often holds a few bad ones; one of them must not stop a run at its first pass, and
many of them (a wrong folder, a broken copy) must not train silently on what is left. So training skips a bad
picture with one warning line (the file, the reason and the count so far), once per picture however many
epochs read it, and stops with a DataError saying so once more than `max_share` of the data set's pictures
failed (`vqa train --max-unreadable`). Evaluation during training does the same over the pictures it
evaluates (`vqa eval` alone stops at the first). `vqa data info --check-images` lists them all before training.

The tally is shared by the loader's workers: flags and a count in shared memory, inherited when the workers
start, so the count is this process's whole, whichever worker read the picture. Under several ranks each reads
its own share of the pictures, so the limit is checked on all of them together: `agree`, called by every rank at
the same points (training's logged steps and evaluations, the end of an evaluation), ORs the ranks' flags and
stops every rank with the same DataError once the pictures failed anywhere are over the share.
"""

from __future__ import annotations

import multiprocessing as mp
import sys

from ..errors import DataError


class UnreadablePictures:
    """Flags for `total` pictures (by index) and the count of those that failed; `add` warns or stops."""

    def __init__(self, total: int, max_share: float, flag: str = "--max-unreadable", what: str = "training",
                 world: int = 1):
        """`world`: the ranks reading the `total` pictures between them; over 1, `agree` checks the limit."""
        self.total, self.max_share, self.flag, self.what = int(total), float(max_share), flag, what
        self.world = int(world)
        self._flags = mp.Array("B", max(1, self.total), lock=False)  # picture i failed
        self._count = mp.Value("q", 0)  # its lock guards the flags too
        self._agreed = 0  # the count the last `agree` left (in the rank's main process)

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
        print(f"vqa train: skipped a picture{during}: {reason} ({n:,} unreadable of {self.total:,} so far"
              f"{' on this rank' if self.world > 1 else ''})", file=sys.stderr, flush=True)
        if self.world == 1:  # under several ranks, `agree` checks the count of them all
            self._check(n)

    def agree(self, device) -> None:
        """Every rank at the same point: the pictures failed on any rank, each counted once, against the limit;
        every rank raises the same DataError when over it. One scalar all_reduce, and when a rank has new
        failures one of the flags (on `device`: the process group's)."""
        if self.world == 1:
            return
        import numpy as np
        import torch
        import torch.distributed as tdist

        flags = np.ctypeslib.as_array(self._flags)
        with self._count.get_lock():
            news = torch.tensor([self.count - self._agreed], dtype=torch.int64, device=device)
        tdist.all_reduce(news)
        if not int(news.item()):
            return
        anywhere = torch.from_numpy(flags.copy()).to(device)
        tdist.all_reduce(anywhere, op=tdist.ReduceOp.MAX)
        anywhere = anywhere.cpu().numpy()
        with self._count.get_lock():  # a picture failed on another rank is not warned about again here
            np.maximum(flags, anywhere, out=flags)
            self._count.value = self._agreed = int(np.count_nonzero(flags))
        self._check(int(np.count_nonzero(anywhere)), f" on the {self.world} ranks together")

    def _check(self, n: int, where: str = "") -> None:
        if n > self.allowed():
            raise DataError(f"{n:,} of the {self.total:,} {self.what} pictures are unreadable{where}, more than "
                            f"{self.flag} {self.max_share:g} allows ({self.allowed():,}); `vqa data info "
                            "--check-images` lists them")


__all__ = ["UnreadablePictures"]
