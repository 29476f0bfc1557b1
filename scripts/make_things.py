"""Make a things folder (vqa/data/synthetic/things.py) for `vqa pretrain --things DIR` from Debian's emoji
packages: EmojiOne's pictures in `ruby-gemojione` (CC-BY-SA-4.0) and, with --emojify, the emojify.js pictures
in `libjs-emojify` (MIT), a second artist's drawing of many of the same things. Neither is the emoji check's
Noto font, and neither holds openclipart.

    apt-get download ruby-gemojione libjs-emojify && dpkg -x ruby-gemojione_*.deb pk && dpkg -x libjs-emojify_*.deb pk
    python scripts/make_things.py --out data/things \
        --gemojione pk/usr/share/rubygems-integration/all/gems/gemojione-3.3.0 \
        --emojify pk/usr/share/javascript/emojify.js/images/emoji

It keeps the emoji of things (animals, plants, food, vehicles, buildings, objects, sports; not faces of feelings,
symbols or flags) whose name is one word, copies their PNGs and writes things.json. The same inputs give the
same folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

CATEGORIES = ("nature", "food", "travel", "objects", "activity", "people")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gemojione", type=Path, required=True, help="the gemojione gem's folder (config/index.json)")
    p.add_argument("--emojify", type=Path, default=None, help="emojify.js's images/emoji folder (optional)")
    p.add_argument("--out", type=Path, required=True, help="the things folder to write")
    args = p.parse_args(argv)
    index = args.gemojione / "config" / "index.json"
    if not index.is_file():
        sys.exit(f"make_things: {index} is missing: --gemojione takes the gem's folder (config/, assets/)")
    if args.emojify is not None and not args.emojify.is_dir():
        sys.exit(f"make_things: --emojify {args.emojify} is not a folder")
    emoji = json.loads(index.read_text(encoding="utf-8"))
    things, sources = [], {"gemojione": 0, "emojify": 0}
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
    if not things:
        sys.exit(f"make_things: no pictures of things found under {args.gemojione}")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for source, src, name in things:
        (args.out / source).mkdir(exist_ok=True)
        file = f"{source}/{src.name}"
        shutil.copyfile(src, args.out / file)
        rows.append(dict(file=file, name=name))
        sources[source] += 1
    known = [dict(name="gemojione (EmojiOne 2)", package="ruby-gemojione", licence="CC-BY-SA-4.0"),
             dict(name="emojify.js", package="libjs-emojify", licence="MIT")]
    doc = dict(sources=known[: 1 + bool(sources["emojify"])], things=rows)
    (args.out / "things.json").write_text(json.dumps(doc, indent=0) + "\n", encoding="utf-8")
    names = {r["name"] for r in rows}
    print(f"{len(rows)} pictures of {len(names)} things ({sources['gemojione']} gemojione, {sources['emojify']} "
          f"emojify) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
