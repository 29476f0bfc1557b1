"""Build the emoji check: pictures of real kinds of things (dogs, buses, trees...) drawn from a colour emoji font,
with questions and captions in the project's JSONL schema, to measure whether pretrained towers beat random
weights on pictures of real things. A transfer check: the project's pretraining never trains or tunes on it.

    apt-get install fonts-noto-color-emoji
    python scripts/make_emoji_check.py --font /usr/share/fonts/truetype/noto/NotoColorEmoji.ttf --out data/emoji

Writes DIR/train.jsonl, DIR/val.jsonl, the PNGs under DIR/train/ and DIR/val/, and DIR/emoji_check.json (what
was built, from which font, which emoji went to which split). The same arguments and font give the same bytes.
Where a kind has four or more emoji, val draws from emoji that train never shows (`split_emoji`). See
docs/emoji-check.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

# kind -> emoji (code points) that show one; the order chooses the held-out ones (`split_emoji`)
KINDS: dict[str, tuple[int, ...]] = {
    "dog": (0x1F415, 0x1F436, 0x1F429, 0x1F9AE),
    "cat": (0x1F408, 0x1F431, 0x1F63A, 0x1F63C, 0x1F640, 0x1F638),
    "bird": (0x1F426, 0x1F424, 0x1F414, 0x1F413, 0x1F54A, 0x1F985, 0x1F989, 0x1F986, 0x1F99C, 0x1F99A, 0x1F427,
             0x1F9A2, 0x1F9A9),
    "fish": (0x1F41F, 0x1F420, 0x1F421, 0x1F988),
    "horse": (0x1F40E, 0x1F434, 0x1F3A0, 0x1F3C7),
    "cow": (0x1F404, 0x1F42E, 0x1F403, 0x1F402),
    "car": (0x1F697, 0x1F698, 0x1F695, 0x1F699, 0x1F693, 0x1F694, 0x1F3CE, 0x1F696),
    "bus": (0x1F68C, 0x1F68D, 0x1F690, 0x1F68E),
    "train": (0x1F682, 0x1F683, 0x1F684, 0x1F685, 0x1F686, 0x1F688, 0x1F68A, 0x1F69D, 0x1F69E, 0x1F68B),
    "tree": (0x1F333, 0x1F332, 0x1F384, 0x1F334),
    "flower": (0x1F337, 0x1F338, 0x1F339, 0x1F33A, 0x1F33B, 0x1F33C, 0x1FAB7, 0x1FABB),
    "fruit": (0x1F34E, 0x1F34F, 0x1F350, 0x1F351, 0x1F352, 0x1F353, 0x1F34A, 0x1F34B, 0x1F34C, 0x1F34D, 0x1F349,
              0x1F347, 0x1F348, 0x1F96D, 0x1F95D, 0x1FAD0),
    "house": (0x1F3E0, 0x1F3E1, 0x1F3DA, 0x1F3D8, 0x1F6D6),
    "boat": (0x26F5, 0x1F6A4, 0x1F6F6, 0x1F6E5, 0x1F6A2, 0x26F4, 0x1F6F3),
    "airplane": (0x2708, 0x1F6E9, 0x1F6EB, 0x1F6EC),
}
# things of no kind above, drawn small beside the main one as clutter
CLUTTER: tuple[int, ...] = (0x2B50, 0x1F388, 0x1F3B5, 0x1F4A1, 0x1F511, 0x2602, 0x1F4DA, 0x1F381, 0x1F9E9, 0x270F,
                            0x1F514, 0x1F319, 0x2601, 0x26BD, 0x1F3C0, 0x1F4CE)
# background colour names (the answers of "what color is the background?") and their base RGB
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (200, 40, 40), "orange": (240, 140, 30), "yellow": (240, 220, 60), "green": (60, 160, 70),
    "blue": (50, 100, 210), "purple": (130, 60, 170), "pink": (240, 150, 190), "brown": (130, 85, 50),
    "gray": (128, 128, 128), "white": (245, 245, 245), "black": (25, 25, 25),
}
HELD_OUT_EVERY = 4  # a kind with >= 4 emoji gives every 4th one (in table order) to val only
PROBE = 0x1F34E  # red apple: a colour emoji font draws it in colour, any other font in one ink or not at all
FONT_PX = 109  # the one pixel size of Noto Color Emoji's bitmaps (CBDT)
SCALE = 4  # pictures are drawn at 4x and area-reduced

Glyphs = Callable[[int], Image.Image]  # code point -> RGBA picture of the emoji, cropped to what it draws


class BuildError(Exception):
    """Bad input to the build: the message is one line naming the file or option at fault."""


def article(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def split_emoji(kinds: dict[str, tuple[int, ...]] = KINDS) -> dict[str, dict[str, tuple[int, ...]]]:
    """{"train": {kind: emoji}, "val": {kind: emoji}}: a kind with >= HELD_OUT_EVERY emoji keeps every
    HELD_OUT_EVERY-th one for val, so val asks about drawings train never shows; a smaller kind shares all."""
    out: dict[str, dict[str, tuple[int, ...]]] = {"train": {}, "val": {}}
    for kind, cps in kinds.items():
        if len(cps) >= HELD_OUT_EVERY:
            held = {i for i in range(len(cps)) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1}
            out["train"][kind] = tuple(c for i, c in enumerate(cps) if i not in held)
            out["val"][kind] = tuple(c for i, c in enumerate(cps) if i in held)
        else:
            out["train"][kind] = out["val"][kind] = cps
    return out


def _draw(font: ImageFont.FreeTypeFont, cp: int) -> Image.Image:
    im = Image.new("RGBA", (FONT_PX * 2, FONT_PX * 2), (0, 0, 0, 0))
    ImageDraw.Draw(im).text((FONT_PX // 4, FONT_PX // 4), chr(cp), font=font, embedded_color=True,
                            fill=(0, 0, 0, 255))
    return im


def _coloured(im: Image.Image) -> bool:
    a = np.asarray(im).astype(np.int16)
    drawn = a[..., 3] > 0
    chroma = a[..., :3].max(-1) - a[..., :3].min(-1)
    return bool(drawn.any()) and float((chroma[drawn] > 40).mean()) > 0.2


def font_glyphs(path: str | Path) -> Glyphs:
    """The emoji of a colour emoji font (CBDT, drawn at 109 px), checked: every emoji of KINDS and CLUTTER must
    draw something. BuildError naming the file when it is missing, not a font, or not a colour emoji font."""
    path = Path(path)
    if not path.is_file():
        raise BuildError(f"{path}: no such font file (apt-get install fonts-noto-color-emoji)")
    try:
        font = ImageFont.truetype(str(path), FONT_PX)
        probe = _draw(font, PROBE)
    except OSError as e:
        raise BuildError(f"{path}: not a colour emoji font at {FONT_PX} px ({e})") from None
    if not _coloured(probe):
        raise BuildError(f"{path}: not a colour emoji font (U+{PROBE:X} draws without colour)")
    cache: dict[int, Image.Image] = {}

    def glyph(cp: int) -> Image.Image:
        if cp not in cache:
            im = _draw(font, cp)
            box = im.getbbox()
            if box is None:
                raise BuildError(f"{path}: U+{cp:X} draws nothing (the font lacks this emoji)")
            cache[cp] = im.crop(box)
        return cache[cp]

    for cp in [c for cps in KINDS.values() for c in cps] + list(CLUTTER):
        glyph(cp)
    return glyph


def background(rng: np.random.Generator, side: int) -> tuple[np.ndarray, str]:
    """(side x side x 3 float array, colour name): a plain tint, a gradient of one colour's shades, or a
    textured one (grain and blotches) around a named colour."""
    name = list(COLOURS)[int(rng.integers(len(COLOURS)))]
    base = np.array(COLOURS[name], np.float32) + rng.uniform(-12, 12, 3).astype(np.float32)
    style = int(rng.integers(3))
    if style == 0:
        arr = np.broadcast_to(base, (side, side, 3)).copy()
    elif style == 1:  # from a darker to a lighter shade along a random direction
        angle = rng.uniform(0, 2 * np.pi)
        yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side - 0.5
        t = (np.cos(angle) * xx + np.sin(angle) * yy)[..., None] + 0.5
        lo, hi = rng.uniform(0.8, 0.95), rng.uniform(1.05, 1.15)
        arr = base * (lo + (hi - lo) * t)
    else:  # blotches (coarse noise, smoothly enlarged) and grain
        coarse = rng.normal(0, 18, (6, 6)).astype(np.float32)
        blotch = np.asarray(Image.fromarray(coarse).resize((side, side), Image.BICUBIC))[..., None]
        arr = base + blotch + rng.normal(0, rng.uniform(4, 12), (side, side, 3)).astype(np.float32)
    return np.clip(arr, 0, 255), name


def place(canvas: Image.Image, glyph: Image.Image, rng: np.random.Generator, lo: float, hi: float,
          turn: bool = True) -> None:
    """Paste the emoji with its longer side at lo..hi of the canvas side, turned by up to 15 degrees and
    mirrored half the time (when `turn`), at a random position wholly inside."""
    side = canvas.width
    target = rng.uniform(lo, hi) * side
    k = target / max(glyph.size)
    im = glyph.resize((max(1, round(glyph.width * k)), max(1, round(glyph.height * k))), Image.LANCZOS)
    if turn:
        if rng.random() < 0.5:
            im = im.transpose(Image.FLIP_LEFT_RIGHT)
        im = im.rotate(float(rng.uniform(-15, 15)), Image.BICUBIC, expand=True)
        im = im.crop(im.getbbox() or (0, 0, 1, 1))
    if max(im.size) > side:  # a turned square can outgrow the canvas: shrink it back inside
        f = side / max(im.size)
        im = im.resize((max(1, int(im.width * f)), max(1, int(im.height * f))), Image.LANCZOS)
    x = int(rng.integers(0, side - im.width + 1))
    y = int(rng.integers(0, side - im.height + 1))
    canvas.alpha_composite(im, (x, y))


def picture(glyphs: Glyphs, cp: int, rng: np.random.Generator, size: int) -> tuple[Image.Image, str]:
    """(RGB picture of `size` px, background colour name): emoji `cp` at 40-90% of the side on a varied
    background, with a smaller clutter emoji behind it a third of the time; drawn at SCALE x, area-reduced."""
    side = size * SCALE
    arr, colour = background(rng, side)
    canvas = Image.fromarray(arr.astype(np.uint8), "RGB").convert("RGBA")
    if rng.random() < 1 / 3:
        place(canvas, glyphs(CLUTTER[int(rng.integers(len(CLUTTER)))]), rng, 0.15, 0.3)
    place(canvas, glyphs(cp), rng, 0.4, 0.9)
    return canvas.convert("RGB").reduce(SCALE), colour


def texts(name: str, kind: str, asked: str, colour: str) -> list[dict]:
    """The JSONL lines of one picture: what kind, is there a KIND (`asked`: the kind or another), the background
    colour, and a caption."""
    image, base = f"{name}.png", name.replace("/", "-")
    return [
        {"image": image, "question_id": f"{base}-kind", "question": "what kind of thing is this?",
         "answers": [kind], "answer_type": "other", "question_type": "what kind"},
        {"image": image, "question_id": f"{base}-is-there", "question": f"is there {article(asked)} in the picture?",
         "answers": ["yes" if asked == kind else "no"], "answer_type": "yes/no", "question_type": "is there"},
        {"image": image, "question_id": f"{base}-background", "question": "what color is the background?",
         "answers": [colour], "answer_type": "other", "question_type": "what color"},
        {"image": image, "caption_id": f"{base}-caption",
         "caption": f"{article(kind)} on {article(colour)} background"},
    ]


def build_split(out: Path, split: str, emoji: dict[str, tuple[int, ...]], n: int, seed: int, size: int,
                glyphs: Glyphs) -> list[dict]:
    """Draw `n` pictures of `split` into out/split/ and return their JSONL lines. Kinds come round equally
    often and half the "is there" questions are yes, both in a seeded order."""
    code = {"train": 1, "val": 2}[split]
    order = np.random.default_rng([seed, code])
    kinds = list(emoji)
    which = order.permutation(np.arange(n) % len(kinds))
    says_yes = order.permutation(np.arange(n) % 2 == 0)
    (out / split).mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        rng = np.random.default_rng([seed, code, i])
        kind = kinds[int(which[i])]
        cp = emoji[kind][int(rng.integers(len(emoji[kind])))]
        im, colour = picture(glyphs, cp, rng, size)
        name = f"{split}/{i:05d}"
        im.save(out / f"{name}.png", optimize=False)
        others = [k for k in kinds if k != kind]
        asked = kind if says_yes[i] else others[int(rng.integers(len(others)))]
        lines += texts(name, kind, asked, colour)
    (out / f"{split}.jsonl").write_text("".join(json.dumps(x, sort_keys=True) + "\n" for x in lines))
    return lines


def _clear(out: Path) -> None:
    """Make `out` ready: a new or empty folder, or an earlier emoji check's (whose files are removed first)."""
    if out.exists() and not out.is_dir():
        raise BuildError(f"{out}: --out is a file, not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not (out / "emoji_check.json").is_file():
            raise BuildError(f"{out}: --out is a folder that holds other files (not an emoji check); choose another")
        for split in ("train", "val"):
            shutil.rmtree(out / split, ignore_errors=True)
            (out / f"{split}.jsonl").unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


def build(out: str | Path, glyphs: Glyphs, n_train: int = 2200, n_val: int = 500, seed: int = 0, size: int = 64,
          font: Path | None = None) -> dict:
    """Write the whole set to `out` and return what emoji_check.json records."""
    for flag, v, least in (("--train", n_train, 1), ("--val", n_val, 1), ("--size", size, 16)):
        if v < least:
            raise BuildError(f"{flag} must be at least {least}, got {v}")
    out = Path(out)
    _clear(out)
    splits = split_emoji()
    counts = {}
    for split, n in (("train", n_train), ("val", n_val)):
        counts[split] = len(build_split(out, split, splits[split], n, seed, size, glyphs)) // 4
    info = {
        "made_by": "python scripts/make_emoji_check.py",
        "seed": seed, "size": size, "pictures": counts,
        "font": None if font is None else {"name": font.name,
                                           "sha256": hashlib.sha256(font.read_bytes()).hexdigest()},
        "emoji": {s: {k: [f"U+{c:X}" for c in cps] for k, cps in by_kind.items()} for s, by_kind in splits.items()},
        "clutter": [f"U+{c:X}" for c in CLUTTER],
        "background_colours": list(COLOURS),
    }
    (out / "emoji_check.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--font", required=True, help="a colour emoji font (Noto Color Emoji's NotoColorEmoji.ttf)")
    p.add_argument("--out", required=True, help="the folder to write the set to")
    p.add_argument("--train", type=int, default=2200, help="pictures in the train split")
    p.add_argument("--val", type=int, default=500, help="pictures in the val split")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--size", type=int, default=64, help="picture side in pixels")
    a = p.parse_args(argv)
    try:
        info = build(a.out, font_glyphs(a.font), a.train, a.val, a.seed, a.size, Path(a.font))
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {info['pictures']['train']} train and {info['pictures']['val']} val pictures to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
