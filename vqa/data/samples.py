"""The sample pictures shipped inside the package (vqa/samples: three photo-like scenes and three Shapes scenes,
drawn by scripts/make_samples.py), found with importlib.resources so they are there after a plain `pip install`:
the demo's examples and `vqa data samples --out DIR`, which copies them out for `vqa ask` / `vqa caption`."""

from __future__ import annotations

import json
import shutil
from importlib.resources import files
from pathlib import Path

SAMPLES = Path(str(files("vqa") / "samples"))  # the package is installed as files (setuptools' default)


def sample_entries() -> list[dict]:
    """samples.json's entries whose picture is there: file, question, kind, and for Shapes scenes the answer."""
    meta = SAMPLES / "samples.json"
    if not meta.is_file():
        return []
    return [e for e in json.loads(meta.read_text()) if (SAMPLES / e["file"]).is_file()]


def copy_samples(out: Path) -> list[Path]:
    """Copy the sample pictures and samples.json into `out` (made if missing); the copied pictures."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(SAMPLES / "samples.json", out / "samples.json")
    return [Path(shutil.copy2(SAMPLES / e["file"], out / e["file"])) for e in sample_entries()]
