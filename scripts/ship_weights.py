"""Copy a `vqa pretrain` run's best checkpoint into the package (vqa/weights/<name>/) with its card: the
command, the corpus, the steps, the time and the weights' sha256. The tiny preset then starts from it.

    python scripts/ship_weights.py /path/to/pretrain-run [--name tiny]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

from vqa.identity import checkpoint_identity
from vqa.weights import checkpoint, shipped


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="the folder `vqa pretrain --out` made")
    p.add_argument("--name", default="tiny", help="the shipped name (default tiny, the tiny preset's)")
    args = p.parse_args()
    run = Path(args.run)
    made = json.loads((run / "pretrain.json").read_text())
    src = checkpoint.resolve(run / "best")
    trained = json.loads((src / "card.json").read_text())
    dst = shipped.WEIGHTS / args.name
    dst.mkdir(parents=True, exist_ok=True)
    for name in checkpoint.FILES:
        shutil.copyfile(src / name, dst / name)
    card = dict(
        name=args.name, preset=trained["preset"], tasks=trained["tasks"],
        command=re.sub(r"--out \S+", "--out DIR", made["command"]),
        corpus=dict(made["corpus"], maker="vqa data corpus (procedural pictures; no Shapes or Scenes scene)"),
        steps=made["steps"], schedule=made["schedule"], pretrain_seconds=made["total_seconds"],
        pretrain_machine="2-core CPU shared with other jobs",
        corpus_val_scores={k: trained["val_scores"][k] for k in ("vqa_accuracy", "BLEU-4", "CIDEr-D")},
        parameters=trained.get("parameters"), sha256=shipped.sha256(dst / "model.safetensors"),
        identity=checkpoint_identity(dst),
        init_from="random weights",
    )
    (dst / "card.json").write_text(json.dumps(card, indent=1) + "\n")
    size_mb = (dst / "model.safetensors").stat().st_size / 1e6
    print(f"shipped {src} as {dst} ({size_mb:.1f} MB, sha256 {card['sha256'][:12]})")


if __name__ == "__main__":
    main()
