"""The demo's example pictures: where they live (data/samples and the built Shapes set, data/shapes, in the
repository) and `examples()`, the [picture path, question] pairs listed under the picture input. The server
lets the page read these two folders (and no other of this machine's)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository (app.py's folder)
SAMPLES = ROOT / "data" / "samples"
SHAPES = ROOT / "data" / "shapes"


def examples() -> list[list[str]]:
    """[image path, question] pairs: the sample pictures, then a few Shapes val images if the set is built."""
    out = []
    meta = SAMPLES / "samples.json"
    if meta.is_file():
        for e in json.loads(meta.read_text()):
            if (SAMPLES / e["file"]).is_file():
                out.append([str(SAMPLES / e["file"]), e["question"]])
    qfile = SHAPES / "v2_OpenEnded_mscoco_val_questions.json"
    if qfile.is_file():
        try:
            seen = set()
            for q in json.loads(qfile.read_text())["questions"]:
                path = SHAPES / "val" / f"COCO_val_{q['image_id']:012d}.png"
                if q["image_id"] not in seen and path.is_file():
                    seen.add(q["image_id"])
                    out.append([str(path), q["question"]])
                if len(seen) >= 6:
                    break
        except (OSError, ValueError, KeyError, TypeError):
            pass  # a half-built set: no Shapes examples
    return out
