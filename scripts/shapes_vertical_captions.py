"""A copy of a Shapes set whose training captions also list the objects top to bottom (docs/shapes-10min.md,
section 7): each training image's second caption (the shape tally) becomes "from top to bottom: <the objects
in vertical order>". Images, questions and the val split are shared with the source by symlinks.

    python scripts/shapes_vertical_captions.py data/shapes data/shapes-vcap
    vqa train --data data/shapes-vcap --out runs/vcap --preset tiny --max-steps 3800
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from vqa.data.shapes import _group


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path, help="a set made by `vqa data shapes`")
    p.add_argument("dst", type=Path, help="the new folder")
    a = p.parse_args()
    a.dst.mkdir(parents=True, exist_ok=True)
    for f in a.src.iterdir():
        link = a.dst / f.name
        if f.name != "captions_train.json" and not link.exists():
            link.symlink_to(f.resolve())
    scenes = {s["image_id"]: s for s in json.loads((a.src / "shapes_train_scenes.json").read_text())["scenes"]}
    caps = json.loads((a.src / "captions_train.json").read_text())
    by_image = defaultdict(list)
    for ann in caps["annotations"]:
        by_image[ann["image_id"]].append(ann)
    changed = 0
    for image_id, anns in by_image.items():
        objs = sorted(scenes[image_id]["objects"], key=lambda o: o["y"])
        if len(objs) >= 2 and len(anns) >= 2:
            anns[1]["caption"] = "from top to bottom: " + _group([f"{o['size']} {o['color']} {o['shape']}" for o in objs])
            changed += 1
    (a.dst / "captions_train.json").write_text(json.dumps(caps))
    print(f"{changed} of {len(by_image)} training images got a top-to-bottom caption; {a.dst}")


if __name__ == "__main__":
    main()
