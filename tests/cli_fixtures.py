"""What the tests of bad options, devices, checkpoint files and output paths share: `fails`, the check that a
`vqa` command stops with exit status 2 (usage) or 1 (a failure while running) and a one-line message naming the problem,
never a traceback."""

from __future__ import annotations

import re

from vqa.cli import main


def vqa(args: list) -> int:
    """`vqa ARGS` in this process (paths and numbers in ARGS as strings); its exit status."""
    return main([str(a) for a in args])


def fails(capsys, args: list, match: str, status: int = 2) -> str:
    """`vqa ARGS` exits `status` (2: a usage error, 1: a failure while running) with a message matching `match`
    on stderr and no traceback; returns stderr."""
    capsys.readouterr()
    code = vqa(args)
    err = capsys.readouterr().err
    assert code == status, (code, err[-2000:])
    assert re.search(match, err), err[-2000:]
    assert "Traceback" not in err
    return err
