"""Do the image tokens the decoder reads say where an object is? A diagnostic on the built-in Shapes set.

For every object of the val scenes, take the token of the patch that holds its centre at three points of a
trained run's encoder: the ViT's input (patch embedding + position embedding), the ViT's output, and the
memory the decoder attends to (projected; plus the fixed positions when `vit_memory_pos` is on). A
least-squares linear read-out is fitted on the objects of the first images and scored (R^2) on the rest, for
the object's x and y centre and, as a control, whether it is red.

  python scripts/probe_positions.py --checkpoint runs/tiny --data data/shapes

Found that a tiny model trained without memory positions keeps no position in its ViT output (R^2 < 0 for x,
0.94 at the ViT's input): docs/shapes-10min.md, section 5.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vqa.data.transforms import build_transform
from vqa.model import checkpoint


def r2(train_x, train_y, test_x, test_y) -> float:
    """R^2 on the test rows of a least-squares linear fit (with a bias) on the train rows."""
    fit = np.linalg.lstsq(np.c_[train_x, np.ones(len(train_x))], train_y, rcond=None)[0]
    pred = np.c_[test_x, np.ones(len(test_x))] @ fit
    return float(1 - ((pred - test_y) ** 2).sum() / ((test_y - test_y.mean()) ** 2).sum())


@torch.no_grad()
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", default="data/shapes")
    p.add_argument("--images", type=int, default=1000, help="val scenes to use")
    p.add_argument("--fit-share", type=float, default=0.6, help="share of the images the read-out is fitted on")
    a = p.parse_args()
    model, _, _ = checkpoint.load(a.checkpoint)
    model.eval()
    vision, cfg = model.vision, model.cfg
    transform = build_transform(cfg, train=False)
    scenes = json.loads((Path(a.data) / "shapes_val_scenes.json").read_text())["scenes"][: a.images]
    cell = cfg.vit_image_size / vision.grid
    feats: dict[str, list] = {"ViT input": [], "ViT output": [], "memory": []}
    targets, image_of = [], []
    for k in range(0, len(scenes), 64):
        chunk = scenes[k : k + 64]
        images = torch.stack([transform(Image.open(Path(a.data) / "val" / s["file_name"]).convert("RGB")) for s in chunk])
        vit_in = vision.vit._pos_embed(vision.vit.patch_embed(images))  # [B, prefix + grid^2, Dv]
        vit_out = vision.vit.forward_features(images)  # [B, prefix + grid^2, Dv]
        memory = vision(images)  # [B, N, D]: N drops the prefix when vit_keep_prefix is off
        prefix = vision.num_prefix
        mem_prefix = prefix if cfg.vit_keep_prefix else 0
        for j, scene in enumerate(chunk):
            for o in scene["objects"]:
                patch = int(o["y"] // cell) * vision.grid + int(o["x"] // cell)
                feats["ViT input"].append(vit_in[j, prefix + patch].numpy())
                feats["ViT output"].append(vit_out[j, prefix + patch].numpy())
                feats["memory"].append(memory[j, mem_prefix + patch].numpy())
                targets.append((o["x"], o["y"], float(o["color"] == "red")))
                image_of.append(k + j)
    y = np.array(targets)
    fit = np.array(image_of) < int(a.fit_share * len(scenes))  # split by image, not by object
    print(f"{len(y)} objects in {len(scenes)} val images; R^2 of a linear read-out on held-out images")
    print(f"{'tokens':<12} {'x':>7} {'y':>7} {'red':>7}")
    for name, rows in feats.items():
        x = np.array(rows)
        scores = [r2(x[fit], y[fit, c], x[~fit], y[~fit, c]) for c in range(3)]
        print(f"{name:<12} " + " ".join(f"{s:7.3f}" for s in scores))


if __name__ == "__main__":
    main()
