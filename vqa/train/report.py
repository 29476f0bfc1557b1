"""Where a run's numbers go: `metrics.jsonl` always (read back robust to a torn last line: `curves.png`'s loss and
accuracy curves, a resume's trim and the tests read it), and with
`--report-to tensorboard` also TensorBoard event files in RUN/tensorboard; with `--report-to wandb` or `trackio`
a run of that tracker (project `vqa`, or $WANDB_PROJECT / $TRACKIO_PROJECT). Each gets the loss, each parameter
group's learning rate, the evaluation scores, and a few validation pictures with the captions the model gave."""

from __future__ import annotations

import importlib
import json
import os
import secrets
from pathlib import Path

from ..errors import ExtraMissing, VQAError
from ..logs import get_logger

log = get_logger("train")
PICTURES = 4  # captioned validation pictures per evaluation
PICTURE_SIZE = 224  # pixels on the longer side
TRACKERS = ("wandb", "trackio")  # modules with the same calls: init(project, name, config, resume), log, Image, finish


class Tracker:
    """A wandb or trackio run for a run folder. Its id (RUN/tracker.json) is made once, so `--resume` continues
    the same tracker run; the run's train_config.json is its config."""

    def __init__(self, kind: str, run: Path):
        try:
            self.module = importlib.import_module(kind)
        except ImportError:
            raise ExtraMissing(f"--report-to {kind}", kind, kind) from None
        kept = run / "tracker.json"
        ids = json.loads(kept.read_text()) if kept.is_file() else {}
        if kind not in ids:
            ids[kind] = f"{run.resolve().name}-{secrets.token_hex(4)}"  # folder names repeat across machines
            kept.write_text(json.dumps(ids, indent=1) + "\n")
        config_file = run / "train_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        project = os.environ.get(f"{kind.upper()}_PROJECT", "vqa")
        # wandb resumes a run by its id and shows its name; trackio resumes a run by its name
        who = dict(id=ids[kind], name=run.resolve().name, dir=str(run)) if kind == "wandb" else dict(name=ids[kind])
        self.module.init(project=project, config=config, resume="allow", **who)

    def log(self, values: dict, step: int) -> None:
        self.module.log(values, step=step)

    def picture(self, tag: str, array, caption: str, step: int) -> None:
        self.module.log({tag: self.module.Image(array, caption=caption)}, step=step)

    def close(self) -> None:
        self.module.finish()


class Reporter:
    def __init__(self, metrics: Path, report_to: str = "none", main: bool = True):
        """`main`: this process writes (rank 0); the others keep a Reporter that writes nothing."""
        self.metrics, self.main, self.writer, self.tracker = metrics, main, None, None
        self.warned = False  # a report that fails warns once, then is quiet; it never ends the run
        if main and report_to == "tensorboard":
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ExtraMissing("--report-to tensorboard", "tensorboard", "tensorboard") from None
            self.writer = SummaryWriter(str(metrics.parent / "tensorboard"))
        elif main and report_to in TRACKERS:
            self.tracker = Tracker(report_to, metrics.parent)

    def log(self, rec: dict, param_groups: list[dict] | None = None) -> None:
        """One metrics.jsonl line; in the report its numbers at rec["step"] (train/..., val/...) and, given the
        optimizer's groups, each group's learning rate (lr/<part>, lr/<part>_muon)."""
        if not self.main:
            return
        with open(self.metrics, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.writer is None and self.tracker is None:
            return
        step, values = rec["step"], {}
        for key, value in rec.items():
            if key not in ("step", "epoch") and isinstance(value, (int, float)) and not isinstance(value, bool):
                values[f"val/{key[4:]}" if key.startswith("val_") else f"train/{key}"] = value
        for g in param_groups or ():
            values.setdefault(f"lr/{g.get('part', 'all')}" + ("_muon" if g.get("muon") else ""), g["lr"])
        try:
            if self.tracker is not None:
                self.tracker.log(values, step)
            if self.writer is not None:
                for tag, value in values.items():
                    self.writer.add_scalar(tag, value, step)
                self.writer.flush()
        except Exception as e:  # noqa: BLE001 -- a tracker's errors (network, disk) are of any type
            self._failed(f"log step {step}", e)

    def pictures(self, step: int, caption_results: list[dict], val_data) -> None:
        """The first PICTURES captioned validation pictures, each with its caption (a folder split's; a shard
        split's pictures are not kept after decoding: TensorBoard then gets only its captions, a tracker none)."""
        if (self.writer is None and self.tracker is None) or not caption_results:
            return
        shown = caption_results[:PICTURES]
        paths = _picture_paths(val_data, {r["image_id"] for r in shown})
        for r in shown:
            tag, path = f"val_pictures/{r['image_id']}", paths.get(r["image_id"])
            try:
                if self.writer is not None:
                    self.writer.add_text(tag, r["caption"], step)
                if path is None:
                    continue
                try:
                    array = _picture(path)
                except (OSError, VQAError) as e:  # removed or damaged since the run began: load_image's InputError
                    self._failed(f"show {path}", e)
                    continue
                if self.writer is not None:
                    self.writer.add_image(tag, array, step, dataformats="HWC")
                if self.tracker is not None:
                    self.tracker.picture(tag, array, r["caption"], step)
            except Exception as e:  # noqa: BLE001 -- a tracker's errors (network, disk) are of any type
                self._failed(f"show {tag}", e)
        try:
            if self.writer is not None:
                self.writer.flush()
        except Exception as e:  # noqa: BLE001 -- as above
            self._failed("write its pictures", e)

    def _failed(self, what: str, e: Exception) -> None:
        """One warning line, the first time the report cannot do something; the run goes on."""
        if not self.warned:
            self.warned = True
            reason = " ".join(str(e).split())[:200] or type(e).__name__
            log.warning(f"vqa train: the report could not {what} ({reason}); the run goes on, and further "
                        "report failures are not shown")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.tracker is not None:
            self.tracker.close()
            self.tracker = None


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
