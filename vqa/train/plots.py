"""A run's metrics.jsonl: read it (robust to a torn last line) and draw its loss and accuracy curves."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl; a torn line (a kill in mid-write) or other junk is skipped."""
    out = []
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def plot_curves(metrics: str | Path, out: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train, val = [], []
    for rec in read_metrics(Path(metrics)):
        (train if "loss" in rec else val).append(rec)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax1.plot([r["step"] for r in train], [r["loss"] for r in train], lw=1)
    ax1.set(xlabel="step", ylabel="training loss", yscale="log", title="loss")
    for key, label in (("val_vqa_accuracy", "VQA accuracy (%)"), ("val_CIDEr-D", "CIDEr-D x 100")):
        pts = [(r["step"], r[key] * (100 if key == "val_CIDEr-D" else 1)) for r in val if key in r]
        if pts:
            ax2.plot(*zip(*pts, strict=True), marker="o", label=label)
    ax2.set(xlabel="step", title="validation")
    if ax2.lines:
        ax2.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
