"""vqa.locks' promise: the lock is the operating system's, so a process killed while it holds one (SIGKILL: no
cleanup runs) leaves a `.lock` file behind that blocks nobody, while a live holder does block."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from vqa.errors import ConfigError
from vqa.locks import RunLock

ROOT = Path(__file__).resolve().parents[1]
HOLD = ("import sys, time; from vqa.locks import RunLock; lock = RunLock(sys.argv[1]).acquire(); "
        "print('held', flush=True); time.sleep(600)")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_a_lock_left_by_a_killed_process_never_blocks_the_next_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"being trained by process {holder.pid} on"):
            RunLock(tmp_path).acquire()  # a live holder blocks
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    assert (tmp_path / ".lock").exists()  # the kill left the file ...
    with RunLock(tmp_path):  # ... and it blocks nobody
        pass
