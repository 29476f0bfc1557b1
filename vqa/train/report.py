"""Where a run's numbers go: `metrics.jsonl` always (the curves, a resume's trim and the tests read it), and with
`--report-to tensorboard` also TensorBoard event files in RUN/tensorboard: the loss, each parameter group's
learning rate, the evaluation scores, and a few validation pictures with the captions the model gave them."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ExtraMissing
from ..logs import get_logger
from .plots import read_metrics

log = get_logger("train")
PICTURES = 4  # captioned validation pictures per evaluation
PICTURE_SIZE = 224  # pixels on the longer side


class Reporter:
    def __init__(self, metrics: Path, report_to: str = "none", main: bool = True):
        """`main`: this process writes (rank 0); the others keep a Reporter that writes nothing."""
        self.metrics, self.main, self.writer = metrics, main, None
        if main and report_to == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ExtraMissing("--report-to tensorboard", "tensorboard", "tensorboard") from None
            self.writer = SummaryWriter(str(metrics.parent / "tensorboard"))

    def log(self, rec: dict, param_groups: list[dict] | None = None) -> None:
        """One metrics.jsonl line; in TensorBoard its numbers at rec["step"] (train/..., val/...) and, given the
        optimizer's groups, each group's learning rate (lr/<part>, lr/<part>_muon)."""
        if not self.main:
            return
        with open(self.metrics, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.writer is None:
            return
        step = rec["step"]
        for key, value in rec.items():
            if key not in ("step", "epoch") and isinstance(value, (int, float)) and not isinstance(value, bool):
                tag = f"val/{key[4:]}" if key.startswith("val_") else f"train/{key}"
                self.writer.add_scalar(tag, value, step)
        seen = set()
        for g in param_groups or ():
            tag = f"lr/{g.get('part', 'all')}" + ("_muon" if g.get("muon") else "")
            if tag not in seen:
                seen.add(tag)
                self.writer.add_scalar(tag, g["lr"], step)
        self.writer.flush()

    def pictures(self, step: int, caption_results: list[dict], val_data) -> None:
        """The first PICTURES captioned validation pictures, each with its caption (a folder split's; a shard
        split's pictures are not kept after decoding, so only its captions are written)."""
        if self.writer is None or not caption_results:
            return
        shown = caption_results[:PICTURES]
        paths = _picture_paths(val_data, {r["image_id"] for r in shown})
        for r in shown:
            tag = f"val_pictures/{r['image_id']}"
            self.writer.add_text(tag, r["caption"], step)
            path = paths.get(r["image_id"])
            if path is not None:
                try:
                    self.writer.add_image(tag, _picture(path), step, dataformats="HWC")
                except OSError as e:  # a picture is never worth a run
                    log.warning(f"vqa train: could not show {path} in TensorBoard ({e})")
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def trim_metrics(metrics: Path, step: int) -> None:
    """On resume, drop what a killed run logged after its last checkpoint (at `step`) and any torn last line."""
    if metrics.exists():
        keep = [r for r in read_metrics(metrics) if r.get("step", 0) <= step]
        metrics.write_text("".join(json.dumps(r) + "\n" for r in keep))


def _picture_paths(val_data, ids: set) -> dict:
    """image id -> picture file for `ids`, from a folder split's caption records (none for shards)."""
    caps, out = getattr(val_data, "captions", None), {}
    for i in range(len(caps) if caps is not None else 0):
        if len(out) == len(ids):
            break
        rec = caps[i]
        if rec.image_id in ids:
            out.setdefault(rec.image_id, rec.image)
    return out


def _picture(path):
    """[H, W, 3] uint8, the longer side PICTURE_SIZE pixels at most."""
    import numpy as np

    from ..data.images import load_image

    img = load_image(path).convert("RGB")
    img.thumbnail((PICTURE_SIZE, PICTURE_SIZE))
    return np.asarray(img)
