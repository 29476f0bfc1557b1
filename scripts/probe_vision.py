"""Does a vision encoder see object shapes? A diagnostic on the built-in Shapes set.

A linear head reads each object's shape from the encoder token of the patch that holds the object's centre
(the token a well-routed cross-attention would read). Two modes:

  python scripts/probe_vision.py --data data/shapes                      # train encoder + head (how fast can
                                                                         # this encoder learn shapes at all?)
  python scripts/probe_vision.py --data data/shapes --checkpoint runs/tiny   # frozen encoder of a run: did
                                                                         # VQA training teach it shapes?
  python scripts/probe_vision.py --data data/shapes --freeze             # frozen random encoder: the floor

Prints held-out shape accuracy (chance 25%) every --every steps. Override encoder fields with --set, e.g.
`--set vit_conv_stem=true`. Used to find out why the tiny preset did not learn the shape family in ten CPU
minutes (docs/shapes-10min.md, section 1).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from vqa.config import preset
from vqa.data.shapes_scene import SHAPES
from vqa.data.transforms import build_transform
from vqa.model.vision import VisionEncoder
from vqa.options import parse_set


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/shapes")
    p.add_argument("--checkpoint", help="probe this run's encoder, frozen (default: train a fresh one)")
    p.add_argument("--freeze", action="store_true", help="keep a fresh encoder at its random initialization")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    p.add_argument("--images", type=int, default=6000, help="train scenes used (the last 1000 are held out)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    if a.checkpoint:
        from vqa.model import checkpoint

        enc = checkpoint.load(checkpoint.resolve(a.checkpoint))[0].vision.eval().requires_grad_(False)
        cfg = enc.cfg
    else:
        cfg = preset(a.preset, **parse_set(a.set))
        enc = VisionEncoder(cfg)
        if a.freeze:
            enc.eval().requires_grad_(False)
    data = Path(a.data)
    scenes = json.loads((data / "shapes_train_scenes.json").read_text())["scenes"][: a.images]
    if len(scenes) < 2000:
        raise SystemExit(f"{data}: need at least 2000 train scenes, found {len(scenes)}")
    tf = build_transform(cfg, train=False)
    images = torch.stack([tf(data / "train" / s["file_name"]) for s in scenes])  # [N, 3, S, S]
    g, p_ = cfg.vit_image_size // cfg.vit_patch_size, cfg.vit_patch_size
    scale = cfg.vit_image_size / json.loads((data / "shapes_info.json").read_text())["size"]
    objs = torch.tensor([(i, int(o["y"] * scale // p_) * g + int(o["x"] * scale // p_), SHAPES.index(o["shape"]))
                         for i, s in enumerate(scenes) for o in s["objects"]])  # (image, patch, shape)
    head = torch.nn.Linear(cfg.dec_width, len(SHAPES))
    params = list(head.parameters()) + ([] if a.checkpoint or a.freeze else list(enc.parameters()))
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.05)
    n_train = len(scenes) - 1000

    def run(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = enc(images[idx])[:, -g * g :]  # [B, G*G, D]: patch tokens, prefix dropped
        row = torch.full((len(scenes),), -1, dtype=torch.long)
        row[idx] = torch.arange(len(idx))
        sel = objs[row[objs[:, 0]] >= 0]
        logits = head(tokens[row[sel[:, 0]], sel[:, 1]])
        return F.cross_entropy(logits, sel[:, 2]), (logits.argmax(-1) == sel[:, 2]).float().mean()

    t0 = time.time()
    for step in range(1, a.steps + 1):
        for group in opt.param_groups:
            group["lr"] = a.lr * min(1.0, step / 50)
        loss, _ = run(torch.randint(0, n_train, (a.batch_size,)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % a.every == 0 or step == a.steps:
            with torch.no_grad():
                acc = torch.stack([run(torch.arange(i, min(i + 100, len(scenes))))[1]
                                   for i in range(n_train, len(scenes), 100)]).mean()
            print(f"step {step:4d}  loss {loss.item():.3f}  held-out shape accuracy {100 * acc:.1f}%  ({time.time() - t0:.0f} s)",
                  flush=True)


if __name__ == "__main__":
    main()
