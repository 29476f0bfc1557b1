"""The command line's status lines and progress bars. Status lines go through `logging`: the "vqa" logger
writes INFO and above to stderr and does not pass them on to the root logger, so a program that configures
logging itself does not see each line twice (as transformers does; `use_root_logging()` hands them to the
root logger's handlers instead); `--quiet` keeps warnings and errors only and hides the bars, which are drawn only on a
terminal (a log file gets no bar frames)."""

from __future__ import annotations

import logging
import sys

ROOT = "vqa"
_state = {"quiet": False}


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a line is logged (a redirected or captured stderr included)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass  # always sys.stderr at the time of writing


def get_logger(name: str) -> logging.Logger:
    """The logger `vqa.<name>`; the first call gives "vqa" its stderr handler and level."""
    root = logging.getLogger(ROOT)
    if not root.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))  # each line names its command: "vqa train: ..."
        root.addHandler(handler)
        root.setLevel(logging.WARNING if _state["quiet"] else logging.INFO)
        root.propagate = False
    return logging.getLogger(f"{ROOT}.{name}")


def use_root_logging() -> None:
    """For a program with its own logging set-up: vqa's lines go to the root logger's handlers, not stderr."""
    root = logging.getLogger(ROOT)
    for h in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(h)
    root.addHandler(logging.NullHandler())  # marks the set-up as done: get_logger adds no stderr handler again
    root.propagate = True


def set_quiet(quiet: bool) -> None:
    """`--quiet`: warnings and errors only, no progress bars."""
    _state["quiet"] = quiet
    logging.getLogger(ROOT).setLevel(logging.WARNING if quiet else logging.INFO)


def bars_off() -> bool | None:
    """tqdm's `disable`: True under --quiet, else None (tqdm draws only when its stream is a terminal)."""
    return True if _state["quiet"] else None
