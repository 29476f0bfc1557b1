"""The image cache's folder (`vqa.data.cache_folder`): its home ($VQA_CACHE, else the user cache folder), a
total budget with least-recently-used eviction of whole files that no process holds, files rebuilt under the
same name never read by a process that opened the old one, and `vqa data cache` to list and clear it.
conftest.py points VQA_CACHE at a temp folder for the test run; these tests point it at their own tmp_path."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
from PIL import Image

from vqa.cli import main
from vqa.data.cache import ImageCache, open_image_cache
from vqa.data.cache_folder import cache_home, image_cache_dir, network_filesystem
from vqa.data.preprocess import Preprocess

SIDE = 16
PRE = Preprocess(SIDE)


def image_lists(root: Path, lists: int, per_list: int = 8) -> list[list[str]]:
    """`lists` different image lists of tiny pictures."""
    root.mkdir(parents=True, exist_ok=True)
    out = []
    for k in range(lists):
        names = []
        for i in range(per_list):
            p = root / f"l{k}_{i}.png"
            Image.new("RGB", (8, 8), (k, i, 0)).save(p)
            names.append(str(p))
        out.append(names)
    return out


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir())


def one_run(images: list[str], budget: str, quiet: bool = True) -> ImageCache | None:
    """What a training run does with the cache: open it, fill it, let it go at the end."""
    c = open_image_cache("auto", budget, images, PRE, quiet=quiet)
    if c is not None:
        for i in range(len(images)):
            c.put(i, torch.full((3, SIDE, SIDE), i, dtype=torch.uint8))
        c.close()
    return c


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("VQA_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_the_cache_lives_in_vqa_cache_else_the_user_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("VQA_CACHE", str(tmp_path / "mine"))
    assert cache_home() == tmp_path / "mine" and image_cache_dir() == tmp_path / "mine" / "images"
    monkeypatch.delenv("VQA_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_home() == tmp_path / "xdg" / "vqa"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert cache_home() == tmp_path / "user" / ".cache" / "vqa"


def test_ten_runs_on_different_images_keep_the_folder_within_its_budget(home, tmp_path):
    """Each file is 4 KiB header + 4 KiB flags + 8 x 768 B = 14 KiB: a 40 KiB budget holds two. Ten runs on
    ten image lists leave the two most recently used files, the folder within its budget after every run."""
    lists = image_lists(tmp_path / "pics", 10)
    budget = 40 * 1024
    sizes = []
    for images in lists:
        assert one_run(images, "40K") is not None
        sizes.append(folder_bytes(home / "images"))
        assert sizes[-1] <= budget
    kept = sorted(p.name for p in (home / "images").glob("*.u8"))
    assert len(kept) == 2 and sizes[-1] == 2 * 14336  # the two files (locks are empty)
    last = [open_image_cache("auto", "40K", images, PRE, quiet=True) for images in lists[-2:]]
    assert all(c.filled() == 8 for c in last)  # the two most recent lists: still there, filled
    for c in last:
        c.close()
    one_run(lists[-2], "40K")  # used again: now the most recent, so the next new list evicts lists[-1]'s
    one_run(lists[0], "40K")
    assert open_image_cache("auto", "40K", lists[-2], PRE, quiet=True).filled() == 8
    assert open_image_cache("auto", "1M", lists[-1], PRE, quiet=True).filled() == 0  # made again


def test_a_file_in_use_is_never_evicted(home, tmp_path, capsys):
    a, b, c = image_lists(tmp_path / "pics", 3)
    held = open_image_cache("auto", "40K", a, PRE)  # a live run: holds its file's lock until close
    held.put(0, torch.ones(3, SIDE, SIDE, dtype=torch.uint8))
    # only a's file would have to go: it is in use, so this run goes without
    assert one_run(b, "20K", quiet=False) is None
    assert "in use by running processes" in capsys.readouterr().err
    assert held.path.exists() and held.filled() == 1
    held.close()
    assert one_run(c, "20K") is not None and not held.path.exists()  # let go: now it may be evicted


def test_a_file_rebuilt_by_another_run_is_never_read_by_one_that_opened_the_old_one(tmp_path, capsys):
    images = image_lists(tmp_path / "pics", 1)[0]
    path = tmp_path / "c.u8"
    old = ImageCache.open(path, images, PRE)
    mine = torch.full((3, SIDE, SIDE), 7, dtype=torch.uint8)
    old.put(0, mine)
    worker = pickle.loads(pickle.dumps(old))  # a loader worker: maps the file again, by path, later
    # another run, other settings, the same name
    other = ImageCache.open(path, images, Preprocess(SIDE, fill=(9, 9, 9)))
    theirs = torch.full((3, SIDE, SIDE), 200, dtype=torch.uint8)
    other.put(0, theirs)
    other.put(1, theirs)
    assert worker.get(0) is None and worker.get(1) is None  # never the other run's pictures
    worker.put(2, mine)  # nor written into its file
    assert other.get(2) is None and torch.equal(other.get(0), theirs)
    assert "no longer this run's" in capsys.readouterr().err
    assert torch.equal(old.get(0), mine)  # the process that mapped the old file keeps it
    worker2 = pickle.loads(pickle.dumps(old))
    # rebuilt smaller: mapping the old size would fault
    smaller = ImageCache.open(path, images[:3], Preprocess(SIDE // 2))
    assert smaller.filled() == 0 and worker2.get(0) is None and worker2.filled() == 0


def test_vqa_data_cache_lists_and_clears_the_folder(home, tmp_path, capsys):
    a, b = image_lists(tmp_path / "pics", 2)
    one_run(a, "1M")
    held = open_image_cache("auto", "1M", b, PRE)
    (home / "images" / "notes.txt").write_text("not the cache's")
    capsys.readouterr()
    assert main(["data", "cache"]) == 0
    out = capsys.readouterr().out
    assert str(home / "images") in out and "2 file(s)" in out
    assert "8 images at 16 px, 8 filled" in out and out.count("in use") == 1
    assert main(["data", "cache", "--clear"]) == 0
    out = capsys.readouterr().out
    assert "removed 1 file(s)" in out and f"kept {held.path.name}" in out
    assert sorted(p.name for p in (home / "images").iterdir()) == sorted(
        [".vqa-image-cache.lock", "notes.txt", held.path.name, held.path.name + ".lock"])
    held.close()
    assert main(["data", "cache", "--clear"]) == 0
    assert sorted(os.listdir(home / "images")) == [".vqa-image-cache.lock", "notes.txt"]


def test_auto_is_off_on_a_network_filesystem(home, tmp_path, monkeypatch, capsys):
    mounts = "/dev/sda1 / ext4 rw 0 0\nserver:/home /home nfs4 rw 0 0\nlocal /home/me/scratch xfs rw 0 0\n"
    assert network_filesystem(Path("/home/me/.cache/vqa"), mounts) == "nfs4"
    assert network_filesystem(Path("/home/me/scratch/vqa"), mounts) is None  # the longest mount point wins
    assert network_filesystem(Path("/tmp/vqa"), mounts) is None
    import vqa.data.cache

    monkeypatch.setattr(vqa.data.cache, "network_filesystem", lambda path: "nfs4")
    assert open_image_cache("auto", "1M", image_lists(tmp_path / "pics", 1)[0], PRE) is None
    assert "network filesystem (nfs4)" in capsys.readouterr().err and not (home / "images").exists()


def test_stale_leftovers_of_a_killed_process_are_removed(home, tmp_path):
    images = image_lists(tmp_path / "pics", 1)[0]
    folder = home / "images"
    folder.mkdir(parents=True)
    dead = folder / "0123456789abcdef-16px.u8.tmp999999999"  # no such process
    dead.write_bytes(b"x" * 100)
    one_run(images, "1M")
    assert not dead.exists()


def test_the_locking_modules_import_where_fcntl_does_not_exist(tmp_path):
    """Windows has no fcntl: the image cache, the run lock and checkpoints import there (their locks are
    filelock's, which locks with LockFileEx on Windows); a second run lock on a folder is refused."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['fcntl'] = None\n"  # `import fcntl` raises ImportError, as on Windows
            "import vqa.data.cache, vqa.data.cache_folder, vqa.locks, vqa.weights.checkpoint\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    from vqa.errors import ConfigError
    from vqa.locks import RunLock

    with RunLock(tmp_path), pytest.raises(ConfigError, match=f"{tmp_path} is being trained by process {os.getpid()}"):
        RunLock(tmp_path).acquire()


def test_a_full_disk_is_a_one_line_error_when_the_file_is_made_and_leaves_no_file(tmp_path, monkeypatch):
    """The module's promise: space is reserved up front, so a full disk stops the run at once with a message,
    never a SIGBUS in the middle of an epoch."""
    import errno

    from vqa.errors import ConfigError

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", full)
    (images,) = image_lists(tmp_path / "pics", 1)
    where = tmp_path / "here.cache"
    with pytest.raises(ConfigError, match=r"cannot reserve .*No space left on device.*--image-cache off"):
        open_image_cache(str(where), "1G", images, PRE)
    assert not where.exists() and not list(tmp_path.glob("here.cache*"))
