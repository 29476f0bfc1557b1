"""`vqa.distributed.cleanup` ends the process group's threads, even when torch._dynamo (timm imports it) loads
after `setup`: a process that exits with gloo's threads alive can abort while its peer exits."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

RANK = """
import glob, sys
from vqa.distributed import cleanup, setup
setup("cpu")
import timm  # noqa: F401 -- as loading a checkpoint does, after setup
cleanup()
print(" ".join(sorted(open(f).read().strip() for f in glob.glob("/proc/self/task/*/comm"))))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread names from /proc")
def test_cleanup_ends_the_groups_threads_when_timm_loads_after_setup():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", RANK], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank),
                                       WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for rank in range(2)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        threads = out.split()
        assert threads and not [t for t in threads if "gloo" in t or "tcpstore" in t], threads
