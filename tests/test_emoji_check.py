"""scripts/make_emoji_check.py: the kind table holds together, val's emoji are ones train never shows, the set it
writes loads through training's own reader with balanced questions and the same bytes for the same seed, and a
missing or non-emoji font is a one-line error naming the file. Stub glyphs (small PIL pictures) stand in for the
font; the real font's part runs when $VQA_EMOJI_FONT or the apt package's file exists."""

import importlib.util
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from vqa.data.sources import open_split, resolve_splits

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_emoji_check", ROOT / "scripts" / "make_emoji_check.py")
mec = importlib.util.module_from_spec(_spec)
sys.modules["make_emoji_check"] = mec
_spec.loader.exec_module(mec)

FONT = next((Path(p) for p in (os.environ.get("VQA_EMOJI_FONT", ""),
                               "/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf") if p and Path(p).is_file()), None)
needs_font = pytest.mark.skipif(FONT is None, reason="no colour emoji font (set VQA_EMOJI_FONT)")


class StubGlyphs:
    """A small coloured disc per code point, with the code points asked for recorded."""

    def __init__(self):
        self.asked: list[int] = []

    def __call__(self, cp: int) -> Image.Image:
        self.asked.append(cp)
        im = Image.new("RGBA", (12, 10), (0, 0, 0, 0))
        ImageDraw.Draw(im).ellipse((0, 0, 11, 9), fill=(cp % 256, (cp >> 3) % 256, (cp >> 6) % 256, 255))
        return im


def build_stub(out: Path, **kw) -> StubGlyphs:
    glyphs = StubGlyphs()
    mec.build(out, glyphs, **{"n_train": 30, "n_val": 15, "seed": 0, "size": 32, **kw})
    return glyphs


def test_the_kind_table_holds_fifteen_kinds_of_three_or_more_emoji_each_none_shared():
    kinds = mec.KINDS
    assert len(kinds) == 15 and all(len(cps) >= 3 for cps in kinds.values())
    every = [c for cps in kinds.values() for c in cps]
    assert len(every) == len(set(every)), "an emoji shows two kinds"
    assert not set(mec.CLUTTER) & set(every), "a clutter emoji is one of a kind's"
    assert all(k.isalpha() and k.islower() for k in [*kinds, *mec.COLOURS])
    assert not set(kinds) & set(mec.COLOURS) and not set(kinds) & {"yes", "no"}


def test_val_draws_a_kind_from_emoji_train_never_shows_when_it_has_four_or_more():
    table = {"big": (1, 2, 3, 4, 5, 6, 7, 8, 9), "four": (10, 11, 12, 13), "three": (20, 21, 22)}
    s = mec.split_emoji(table)
    assert s["val"]["big"] == (4, 8) and s["val"]["four"] == (13,)
    for kind in ("big", "four"):
        assert not set(s["train"][kind]) & set(s["val"][kind])
        assert sorted(s["train"][kind] + s["val"][kind]) == sorted(table[kind])
    assert s["train"]["three"] == s["val"]["three"] == (20, 21, 22)  # too few to hold any out
    real = mec.split_emoji()
    assert all(not set(real["train"][k]) & set(real["val"][k]) for k, cps in mec.KINDS.items() if len(cps) >= 4)


def test_the_written_set_loads_through_trainings_reader_with_balanced_questions(tmp_path):
    build_stub(tmp_path / "set")
    assert resolve_splits(str(tmp_path / "set"), None, None) == ("train", "val")
    for split, n in (("train", 30), ("val", 15)):
        data = open_split(tmp_path / "set", split)
        assert not data.skipped and len(data.vqa) == 3 * n and len(data.captions) == n
        rows = [data.vqa[i] for i in range(len(data.vqa))]
        by_type = {t: [r for r in rows if r.question_type == t] for t in ("what kind", "is there", "what color")}
        assert Counter(r.multiple_choice_answer for r in by_type["what kind"]) == {k: n // 15 for k in mec.KINDS}
        yes_no = Counter(r.multiple_choice_answer for r in by_type["is there"])
        assert yes_no["yes"] in (n // 2, n - n // 2) and yes_no["yes"] + yes_no["no"] == n
        assert {r.multiple_choice_answer for r in by_type["what color"]} <= set(mec.COLOURS)
        with Image.open(rows[0].image) as im:
            assert im.mode == "RGB" and im.size == (32, 32)


def test_val_pictures_show_only_val_emoji(tmp_path, monkeypatch):
    calls: dict[str, list[int]] = {}
    real_build_split = mec.build_split

    def recording(out, split, emoji, n, seed, size, glyphs):
        stub = StubGlyphs()
        lines = real_build_split(out, split, emoji, n, seed, size, stub)
        calls[split] = stub.asked
        return lines

    monkeypatch.setattr(mec, "build_split", recording)
    mec.build(tmp_path / "set", StubGlyphs(), n_train=45, n_val=45, size=16)
    s = mec.split_emoji()
    shown = {split: set(calls[split]) - set(mec.CLUTTER) for split in calls}
    assert shown["val"] <= {c for cps in s["val"].values() for c in cps}
    assert not shown["val"] & {c for cps in s["train"].values() for c in cps}
    assert shown["train"] <= {c for cps in s["train"].values() for c in cps}


def test_the_same_seed_writes_the_same_bytes_and_another_seed_other_pictures(tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        build_stub(tmp_path / name, seed=seed, n_train=15, size=16)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len(files) == 15 + 15 + 3
    assert all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    assert (tmp_path / "a" / "train.jsonl").read_bytes() != (tmp_path / "c" / "train.jsonl").read_bytes()
    build_stub(tmp_path / "a", n_train=10, n_val=10, size=16)  # a rebuild over an earlier one leaves none of its files
    assert len(list((tmp_path / "a" / "train").iterdir())) == 10


def test_an_out_folder_holding_other_files_is_refused(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(mec.BuildError, match=f"^{tmp_path}: .*holds other files"):
        build_stub(tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


@pytest.mark.parametrize("make", ["missing", "not a font", "a font without emoji"])
def test_a_missing_or_non_emoji_font_is_a_one_line_error_naming_the_file(tmp_path, capsys, make):
    path = tmp_path / "font.ttf"
    if make == "not a font":
        path.write_text("hello")
    elif make == "a font without emoji":
        plain = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
        if not plain.is_file():
            pytest.skip("no DejaVu Sans here")
        path.write_bytes(plain.read_bytes())
    assert mec.main(["--font", str(path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: ") and not (tmp_path / "out").exists(), err


@needs_font
def test_the_real_font_draws_every_emoji_and_builds_a_loadable_set(tmp_path):
    glyphs = mec.font_glyphs(FONT)  # checks that every emoji of the table draws something
    assert all(glyphs(c).getbbox() is not None for cps in mec.KINDS.values() for c in cps)
    mec.build(tmp_path / "set", glyphs, n_train=15, n_val=10, size=32, font=FONT)
    data = open_split(tmp_path / "set", "val")
    assert len(data.vqa) == 30 and len(data.captions) == 10
    with Image.open(data.vqa[0].image) as im:
        arr = np.asarray(im).astype(int)
    assert im.size == (32, 32) and len({tuple(p) for p in arr.reshape(-1, 3)}) > 50  # a drawing, not a tint


@needs_font
def test_an_emoji_the_font_lacks_is_an_error_naming_the_file_and_code_point(monkeypatch):
    monkeypatch.setitem(mec.KINDS, "dog", (*mec.KINDS["dog"], 0xE000))  # private use: no emoji there
    with pytest.raises(mec.BuildError, match=f"^{FONT}: U\\+E000 draws nothing"):
        mec.font_glyphs(FONT)
