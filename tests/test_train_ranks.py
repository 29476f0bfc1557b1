"""Training's ranks stop together: `--max-unreadable` is checked on the pictures of every rank together (each
rank reads its own share of them), and when one rank stops with its error every rank exits with one line naming
it, not a gloo traceback ("Connection closed by peer"). Two gloo ranks on the CPU, each with its own stderr."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

import pytest
from data_fixtures import write_jsonl
from PIL import Image
from test_train import train_args

from vqa.data.readers.formats import load_split
from vqa.data.sampler import rank_order

pytestmark = pytest.mark.slow
N, BATCH, SEED = 16, 2, 0  # 2 ranks x 2 images: 4 steps an epoch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks(argv: list[str]) -> list[tuple[int, str]]:
    """`python ARGV` as ranks 0 and 1 of a gloo group: each one's (exit status, stderr)."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1"))
             for r in range(2)]
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, err) for p, (_, err) in zip(procs, outs, strict=True)]


def pictures(root, bad_per_rank: tuple[int, int]):
    """N pictures, each with a question and a caption; of the first epoch's shares, the first `bad_per_rank[r]`
    pictures of rank r's are not pictures."""
    (root / "pics").mkdir(parents=True)
    rows = []
    for i in range(N):
        Image.new("RGB", (32, 32), (15 * i, 90, 200 - 10 * i)).save(root / "pics" / f"p{i:02d}.png")
        rows.append({"image": f"pics/p{i:02d}.png", "question": "what colour?", "answers": ["blue"],
                     "caption": f"a picture {i}"})
    write_jsonl(root / "train.jsonl", rows)
    paths = load_split(root, "train").image_files.paths
    for rank, bad in enumerate(bad_per_rank):
        for i in rank_order(N, 0, SEED, 0, rank, 2, BATCH, 1)[:bad]:
            (root / paths[i]).write_text("not a picture")
    return root


def train_two_ranks(data, run, *extra) -> list[tuple[int, str]]:
    return two_ranks(["-m", "vqa.cli", *train_args(data, run, "--batch-size", str(BATCH), "--seed", str(SEED),
                                                   "--workers", "0", "--image-cache", "off", "--device", "cpu",
                                                   "--max-steps", "4", *extra)])


def assert_one_error_line(rank: int, code: int, err: str, match: str) -> None:
    assert code == 1, (rank, err[-3000:])
    assert "Traceback" not in err, (rank, err[-3000:])
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith("vqa train: error: ") and match in errors[0], (rank, err[-3000:])


def test_max_unreadable_counts_the_pictures_of_every_rank(tmp_path):
    """2 bad pictures on each rank's share, 4 of 16 in all, --max-unreadable 0.125 (2): each rank alone stays
    within the limit, which the run as a whole is over; both ranks stop, saying so."""
    data = pictures(tmp_path / "data", (2, 2))
    results = train_two_ranks(data, tmp_path / "run", "--max-unreadable", "0.125")
    for rank, (code, err) in enumerate(results):
        assert_one_error_line(rank, code, err, "of the 16 training pictures are unreadable on the 2 ranks together, "
                                               "more than --max-unreadable 0.125 allows (2)")


def test_when_rank_0_stops_on_unreadable_pictures_every_rank_exits_with_one_line(tmp_path):
    """All 3 bad pictures on rank 0's share, over the limit of 2: no rank ends in a traceback."""
    data = pictures(tmp_path / "data", (3, 0))
    results = train_two_ranks(data, tmp_path / "run", "--max-unreadable", "0.125")
    for rank, (code, err) in enumerate(results):
        assert_one_error_line(rank, code, err, "3 of the 16 training pictures are unreadable")


RANK_0_FAILS = textwrap.dedent("""
    import sys, torch, torch.distributed as tdist
    from vqa import distributed
    from vqa.errors import DataError, VQAError

    dist = distributed.setup("cpu")

    def work():
        tdist.barrier()
        if dist.rank == 0:
            raise DataError("data/pics/p03.png: not an image file")
        while True:  # rank 1 trains on, in the step's all-reduce
            tdist.all_reduce(torch.ones(4))

    try:
        distributed.together(dist, work, distributed.cleanup, wait_s=30)
    except VQAError as e:
        print(f"vqa train: error: {e}", file=sys.stderr)
        sys.exit(1)
""")


def test_a_rank_that_fails_alone_ends_the_others_with_a_line_naming_it(tmp_path):
    """Rank 0 fails on its own while rank 1 waits in a collective: rank 1 says rank 0 failed and why."""
    (code0, err0), (code1, err1) = two_ranks(["-c", RANK_0_FAILS])
    assert code0 == 1 and err0.strip() == "vqa train: error: data/pics/p03.png: not an image file", err0
    assert code1 == 1 and "Traceback" not in err1, err1[-3000:]
    assert err1.strip() == "vqa train: error: rank 0 of 2 failed: DataError: data/pics/p03.png: not an image file"
