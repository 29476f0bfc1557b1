"""The demo's example pictures: the sample pictures shipped inside the package (vqa.data.samples), the Shapes
set built in the current folder (`vqa data shapes --out data/shapes`) when there is one, and `examples()`, the
[picture path, question] pairs listed under the picture input. The server lets the page read these two folders
(and no other of this machine's)."""

from __future__ import annotations

import json
from pathlib import Path

from ..data.samples import SAMPLES, sample_entries

__all__ = ["SAMPLES", "SHAPES", "examples"]

SHAPES = Path("data") / "shapes"  # relative: the folder the demo is started from, as for runs/tiny


def examples() -> list[list[str]]:
    """[image path, question] pairs: the sample pictures, then a few Shapes val images if the set is built."""
    out = [[str(SAMPLES / e["file"]), e["question"]] for e in sample_entries()]
    shapes = SHAPES.resolve()
    qfile = shapes / "v2_OpenEnded_mscoco_val_questions.json"
    if qfile.is_file():
        try:
            seen = set()
            for q in json.loads(qfile.read_text())["questions"]:
                path = shapes / "val" / f"COCO_val_{q['image_id']:012d}.png"
                if q["image_id"] not in seen and path.is_file():
                    seen.add(q["image_id"])
                    out.append([str(path), q["question"]])
                if len(seen) >= 6:
                    break
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a half-built set: no Shapes examples
    return out
