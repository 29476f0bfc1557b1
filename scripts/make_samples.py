"""Draw the demo's sample pictures (no downloads): three photo-like scenes that are not Shapes images, and
three Shapes scenes rendered at 256 px by `vqa.data.synthetic.shapes_render`. Writes the PNGs and `samples.json`, the
list the app shows as examples (file, a question, and for Shapes scenes the true answer).

    python scripts/make_samples.py          # rewrites vqa/samples/*.png and samples.json (package data)

Deterministic: the same files every run.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

HERE = Path(__file__).resolve().parents[1] / "vqa" / "samples"


def _gradient(w: int, h: int, top: tuple, bottom: tuple) -> np.ndarray:
    t = np.linspace(0, 1, h, dtype=np.float32)[:, None, None]
    return (1 - t) * np.array(top, np.float32) + t * np.array(bottom, np.float32) + np.zeros((h, w, 3), np.float32)


def _finish(img: Image.Image, rng: np.random.Generator, blur: float = 1.2, noise: float = 4.0) -> Image.Image:
    """Soften edges and add sensor-like grain, so it reads as a photo rather than a drawing."""
    img = img.filter(ImageFilter.GaussianBlur(blur))
    arr = np.asarray(img).astype(np.float32) + rng.normal(0, noise, (img.height, img.width, 1))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")


def _shaded_disc(img: Image.Image, cx: float, cy: float, r: float, color: tuple) -> None:
    """A ball: a disc lit from the top left."""
    w, h = img.size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    d = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2)
    inside = d <= r
    light = np.clip(1.25 - np.sqrt((xx - cx + 0.4 * r) ** 2 + (yy - cy + 0.4 * r) ** 2) / (1.6 * r), 0.35, 1.15)
    arr = np.asarray(img).astype(np.float32)
    arr[inside] = np.clip(np.array(color, np.float32) * light[inside, None], 0, 255)
    img.paste(Image.fromarray(arr.astype(np.uint8), "RGB"))


def sunset(rng: np.random.Generator) -> Image.Image:
    w, h = 320, 220
    sky = _gradient(w, h, (70, 40, 120), (250, 150, 60))
    img = Image.fromarray(sky.astype(np.uint8), "RGB")
    d = ImageDraw.Draw(img)
    d.ellipse((190, 95, 250, 155), fill=(255, 210, 90))  # the sun
    d.polygon([(0, 170), (70, 95), (150, 170)], fill=(60, 45, 70))  # mountains
    d.polygon([(90, 170), (185, 80), (290, 170)], fill=(45, 35, 60))
    d.polygon([(230, 170), (300, 120), (320, 135), (320, 170)], fill=(55, 40, 65))
    water = _gradient(w, h - 170, (200, 110, 70), (60, 40, 90)).astype(np.uint8)
    img.paste(Image.fromarray(water, "RGB"), (0, 170))
    d.rectangle((205, 178, 235, 182), fill=(250, 200, 110))  # the sun's reflection
    d.rectangle((212, 190, 228, 193), fill=(240, 180, 100))
    return _finish(img, rng, blur=1.0)


def still_life(rng: np.random.Generator) -> Image.Image:
    w, h = 300, 300
    wall = _gradient(w, h, (225, 220, 205), (180, 175, 160))
    img = Image.fromarray(wall.astype(np.uint8), "RGB")
    d = ImageDraw.Draw(img)
    d.rectangle((0, 190, w, h), fill=(140, 95, 60))  # the table
    for y in range(196, h, 14):
        d.line((0, y, w, y + 3), fill=(125, 85, 52), width=2)  # wood grain
    d.ellipse((40, 232, 130, 250), fill=(105, 72, 45))  # shadows
    d.ellipse((160, 228, 270, 248), fill=(105, 72, 45))
    d.rectangle((170, 140, 255, 238), fill=(40, 80, 200))  # a blue box
    d.polygon([(170, 140), (190, 122), (275, 122), (255, 140)], fill=(80, 120, 230))
    d.polygon([(255, 140), (275, 122), (275, 220), (255, 238)], fill=(30, 60, 160))
    _shaded_disc(img, 85, 205, 38, (220, 40, 40))  # a red ball
    return _finish(img, rng)


def kites(rng: np.random.Generator) -> Image.Image:
    w, h = 360, 240
    sky = _gradient(w, h, (60, 120, 210), (170, 210, 245))
    img = Image.fromarray(sky.astype(np.uint8), "RGB")
    d = ImageDraw.Draw(img)
    for cx, cy, s in ((60, 60, 30), (250, 45, 40), (300, 150, 25)):  # clouds
        for dx in (-s, 0, s):
            d.ellipse((cx + dx - s, cy - s * 0.6, cx + dx + s, cy + s * 0.6), fill=(245, 245, 250))
    for cx, cy, s, col in ((120, 110, 28, (240, 200, 30)), (215, 140, 22, (230, 50, 50)), (170, 60, 18, (60, 170, 80))):
        d.polygon([(cx, cy - s), (cx + s * 0.7, cy), (cx, cy + s * 1.2), (cx - s * 0.7, cy)], fill=col)  # a kite
        d.line((cx, cy + s * 1.2, cx - 30, h), fill=(90, 90, 90), width=1)  # its string
    d.rectangle((0, 215, w, h), fill=(70, 140, 60))  # grass
    return _finish(img, rng, blur=0.8, noise=3.0)


def shapes_samples(n: int = 3, side: int = 256, seed: int = 7) -> list[tuple[Image.Image, str, str]]:
    """Shapes scenes with 2+ objects at `side` px, each with a colour question and its answer."""
    from vqa.data.synthetic.shapes_layout import make_scene
    from vqa.data.synthetic.shapes_render import render
    from vqa.data.synthetic.shapes_text import candidates

    out = []
    i = 0
    while len(out) < n:
        rng = np.random.default_rng([seed, i])
        i += 1
        scene = make_scene(rng, side)
        if len(scene["objects"]) < 2:
            continue
        cands = candidates(scene, side, rng)
        family = ("attribute_color", "count", "attribute_shape")[len(out) % 3]
        if not cands[family]:
            continue
        q, a = cands[family][0] if family != "count" else next(
            ((q, a) for q, a in cands["count"] if a not in ("0",)), cands["count"][0])
        out.append((render(scene, side), q, a))
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    entries = []
    for name, fn, question in (
        ("sunset.png", sunset, "what color is the circle?"),
        ("still_life.png", still_life, "what shape is the red object?"),
        ("kites.png", kites, "how many diamonds are there?"),
    ):
        fn(rng).save(HERE / name, optimize=True)
        entries.append(dict(file=name, question=question, kind="picture"))
    for k, (img, q, a) in enumerate(shapes_samples(), 1):
        name = f"shapes_{k}.png"
        img.save(HERE / name, optimize=True)
        entries.append(dict(file=name, question=q, answer=a, kind="shapes"))
    (HERE / "samples.json").write_text(json.dumps(entries, indent=2) + "\n")
    print(f"wrote {len(entries)} samples to {HERE}")


if __name__ == "__main__":
    main()
