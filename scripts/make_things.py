"""Make a things folder (vqa/data/synthetic/things.py) for `vqa pretrain --things DIR` from Debian's emoji
packages: EmojiOne's pictures in `ruby-gemojione` (CC-BY-SA-4.0) and, each optional, other artists' drawings of
many of the same things: the emojify.js pictures in `libjs-emojify` (MIT, --emojify), the line drawings of the
Symbola font in `fonts-symbola` (free for any use, --symbola) and the silhouettes of Material Design Icons in
`fonts-materialdesignicons-webfont` (SIL OFL 1.1, --mdi), the fonts' glyphs drawn black with a white rim. None is
the emoji check's Noto font, and none holds openclipart.

    apt-get download ruby-gemojione libjs-emojify fonts-symbola fonts-materialdesignicons-webfont
    for f in *.deb; do dpkg -x $f pk; done
    python scripts/make_things.py --out data/things \
        --gemojione pk/usr/share/rubygems-integration/all/gems/gemojione-3.3.0 \
        --emojify pk/usr/share/javascript/emojify.js/images/emoji \
        --symbola pk/usr/share/fonts/truetype/ancient-scripts/Symbola_hint.ttf \
        --mdi pk/usr/share/fonts-materialdesignicons-webfont

It keeps the emoji of things (animals, plants, food, vehicles, buildings, objects, sports; not faces of feelings,
symbols or flags) whose name is one word, copies their PNGs and writes things.json (with the plurals English
does not make regularly). The same inputs give the same folder.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

CATEGORIES = ("nature", "food", "travel", "objects", "activity", "people")
# plurals English does not make with -s / -es / -ies; a name that is already plural or a mass noun is its own
PLURALS = {"man": "men", "woman": "women", "mouse": "mice", "ox": "oxen", "deer": "deer", "fish": "fish",
           "sheep": "sheep", "potato": "potatoes", "tomato": "tomatoes", "volcano": "volcanoes",
           "blowfish": "blowfish", "bacon": "bacon", "billiards": "billiards", "books": "books",
           "chains": "chains", "cherries": "cherries", "eyeglasses": "eyeglasses", "eyes": "eyes",
           "fireworks": "fireworks", "footprints": "footprints", "grapes": "grapes", "jeans": "jeans",
           "pancakes": "pancakes", "peanuts": "peanuts", "popcorn": "popcorn", "scales": "scales",
           "spaghetti": "spaghetti", "sparkles": "sparkles", "sushi": "sushi", "wrestlers": "wrestlers",
           "fog": "fog", "bread": "bread", "candy": "candy"}
MDI_ELSE = {"mouse", "hotel", "school", "ribbon"}  # Material Design's icon of that name is another thing
GLYPH = 160  # pixels per em a font's glyph is drawn at
RIM = 4  # the white rim's width, pixels: a black drawing stays visible on a dark background
MISSING = "\U0010fffd"  # a private-use character no font draws: a glyph drawn like it is missing


def glyph(font: ImageFont.FreeTypeFont, char: str) -> Image.Image | None:
    """The font's drawing of `char`, black with a white rim on transparent, cropped; None where it has none."""
    def draw(c: str) -> Image.Image:
        im = Image.new("RGBA", (3 * GLYPH, 3 * GLYPH), (0, 0, 0, 0))
        ImageDraw.Draw(im).text((GLYPH, GLYPH), c, font=font, fill=(0, 0, 0, 255), stroke_width=RIM,
                                stroke_fill=(255, 255, 255, 255))
        return im
    im = draw(char)
    box = im.getchannel("A").getbbox()
    if box is None or im.tobytes() == draw(MISSING).tobytes():
        return None
    return im.crop(box)


def mdi_icons(folder: Path) -> tuple[ImageFont.FreeTypeFont, dict[str, str]]:
    """Material Design Icons' font and {icon name: its character}, from the package's css."""
    css, ttf = folder / "css" / "materialdesignicons.css", folder / "fonts" / "materialdesignicons-webfont.ttf"
    if not css.is_file() or not ttf.is_file():
        sys.exit(f"make_things: --mdi {folder} needs {css.relative_to(folder)} and {ttf.relative_to(folder)}")
    pairs = re.findall(r'\.mdi-([a-z0-9-]+):before\s*\{\s*content:\s*"\\([0-9A-Fa-f]+)"', css.read_text("utf-8"))
    return ImageFont.truetype(str(ttf), GLYPH), {name: chr(int(code, 16)) for name, code in pairs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gemojione", type=Path, required=True, help="the gemojione gem's folder (config/index.json)")
    p.add_argument("--emojify", type=Path, default=None, help="emojify.js's images/emoji folder (optional)")
    p.add_argument("--symbola", type=Path, default=None, help="the Symbola font's .ttf file (optional)")
    p.add_argument("--mdi", type=Path, default=None, help="Material Design Icons' folder: css/, fonts/ (optional)")
    p.add_argument("--out", type=Path, required=True, help="the things folder to write")
    args = p.parse_args(argv)
    index = args.gemojione / "config" / "index.json"
    if not index.is_file():
        sys.exit(f"make_things: {index} is missing: --gemojione takes the gem's folder (config/, assets/)")
    if args.emojify is not None and not args.emojify.is_dir():
        sys.exit(f"make_things: --emojify {args.emojify} is not a folder")
    if args.symbola is not None and not args.symbola.is_file():
        sys.exit(f"make_things: --symbola {args.symbola} is not a font file")
    symbola = None if args.symbola is None else ImageFont.truetype(str(args.symbola), GLYPH)
    mdi_font, mdi = mdi_icons(args.mdi) if args.mdi is not None else (None, {})
    emoji = json.loads(index.read_text(encoding="utf-8"))
    things, sources = [], {"gemojione": 0, "emojify": 0, "symbola": 0, "mdi": 0}
    for _key, e in sorted(emoji.items()):
        name = e.get("name", "")
        if e.get("category") not in CATEGORIES or len(name.split()) != 1 or not name.replace("-", "").isalpha():
            continue
        name = name.lower()
        src = args.gemojione / "assets" / "png" / f"{e['unicode'].upper()}.png"
        if src.is_file():
            things.append(("gemojione", src, name))
        other = None if args.emojify is None else args.emojify / f"{e['shortname'].strip(':')}.png"
        if other is not None and other.is_file():
            things.append(("emojify", other, name))
        code = e["unicode"].upper()
        drawn = None if symbola is None or "-" in code else glyph(symbola, chr(int(code, 16)))
        if drawn is not None:
            things.append(("symbola", (f"{code}.png", drawn), name))
    for name in sorted({n for _s, _f, n in things} & set(mdi) - MDI_ELSE):
        if (drawn := glyph(mdi_font, mdi[name])) is not None:
            things.append(("mdi", (f"{name}.png", drawn), name))
    if not things:
        sys.exit(f"make_things: no pictures of things found under {args.gemojione}")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for source, src, name in things:
        (args.out / source).mkdir(exist_ok=True)
        if isinstance(src, Path):
            file = f"{source}/{src.name}"
            shutil.copyfile(src, args.out / file)
        else:  # a font's glyph: (file name, picture)
            file = f"{source}/{src[0]}"
            src[1].save(args.out / file)
        rows.append(dict(file=file, name=name, **({"plural": PLURALS[name]} if name in PLURALS else {})))
        sources[source] += 1
    known = {"gemojione": dict(name="gemojione (EmojiOne 2)", package="ruby-gemojione", licence="CC-BY-SA-4.0"),
             "emojify": dict(name="emojify.js", package="libjs-emojify", licence="MIT"),
             "symbola": dict(name="Symbola", package="fonts-symbola", licence="free for any use"),
             "mdi": dict(name="Material Design Icons", package="fonts-materialdesignicons-webfont",
                         licence="SIL OFL 1.1")}
    doc = dict(sources=[known[k] for k, n in sources.items() if n], things=rows)
    (args.out / "things.json").write_text(json.dumps(doc, indent=0) + "\n", encoding="utf-8")
    names = {r["name"] for r in rows}
    print(f"{len(rows)} pictures of {len(names)} things ("
          + ", ".join(f"{n} {k}" for k, n in sources.items() if n) + f") -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
