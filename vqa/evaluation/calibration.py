"""Calibration of answer confidence: whether a model's probability for its answer means what it says.

Definitions (the ones `vqa eval` writes to summary.json and docs/evaluation.md states):

- confidence of an answer: the model's probability of the whole answer it generated, <eos> included
  (exp of the decoder's summed log-probability, `Generation.scores`);
- accuracy of an answer: its official VQA accuracy in 0..1 (soft: 0.3 for one matching annotator of ten);
- expected calibration error (Guo et al. 2017, "On Calibration of Modern Neural Networks"): M = 15 bins of
  equal width on [0, 1], bin m holding the confidences in ((m-1)/M, m/M] (a confidence of 0 goes to the first),
  ECE = sum over bins of |bin accuracy - bin confidence| x (answers in the bin / all answers);
- accuracy against coverage (selective answering): the answers sorted by confidence, the most confident
  `ceil(N x coverage)` kept (ties in the split's order) and their mean accuracy, for coverage 100%, 90%, ... 10%.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

BINS = 15  # Guo et al. 2017's M
COVERAGES = (100, 90, 80, 70, 60, 50, 40, 30, 20, 10)  # percent of the answers kept


def _arrays(confidence: Sequence[float], accuracy: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    conf, acc = np.asarray(confidence, dtype=np.float64), np.asarray(accuracy, dtype=np.float64)
    if conf.shape != acc.shape or conf.ndim != 1 or not len(conf):
        raise ValueError(f"calibration needs one accuracy per confidence, at least one (got {conf.shape} and "
                         f"{acc.shape})")
    if conf.min() < 0 or conf.max() > 1:
        raise ValueError("confidences must lie in [0, 1]")
    return conf, acc


def bin_index(confidence: np.ndarray, bins: int = BINS) -> np.ndarray:
    """The bin of each confidence: m - 1 for (m-1)/M < c <= m/M, and 0 for c = 0."""
    edges = np.arange(bins + 1) / bins  # k / M, so 0.2 is exactly the edge 3/15
    return np.clip(np.searchsorted(edges, confidence, side="left") - 1, 0, bins - 1)


def reliability(confidence: Sequence[float], accuracy: Sequence[float], bins: int = BINS) -> list[dict]:
    """Per bin: its edges, how many answers fall in it and their mean confidence and accuracy (None when empty)."""
    conf, acc = _arrays(confidence, accuracy)
    idx = bin_index(conf, bins)
    out = []
    for m in range(bins):
        mask = idx == m
        n = int(mask.sum())
        out.append(dict(lo=m / bins, hi=(m + 1) / bins, count=n,
                        confidence=float(conf[mask].mean()) if n else None,
                        accuracy=float(acc[mask].mean()) if n else None))
    return out


def expected_calibration_error(confidence: Sequence[float], accuracy: Sequence[float], bins: int = BINS) -> float:
    """ECE in 0..1 over `bins` equal-width bins (see the module docstring)."""
    total = len(confidence)
    return sum(b["count"] / total * abs(b["accuracy"] - b["confidence"])
               for b in reliability(confidence, accuracy, bins) if b["count"])


def accuracy_at_coverage(confidence: Sequence[float], accuracy: Sequence[float],
                         coverages: Sequence[int] = COVERAGES) -> dict[str, float]:
    """{"90%": mean accuracy of the most confident 90% of the answers, ...} in 0..1."""
    conf, acc = _arrays(confidence, accuracy)
    order = np.argsort(-conf, kind="stable")  # most confident first; ties keep the split's order
    return {f"{c}%": float(acc[order[: max(1, math.ceil(len(conf) * c / 100))]].mean()) for c in coverages}


def calibration_summary(confidence: Sequence[float], accuracy: Sequence[float], ndigits: int = 2) -> dict:
    """What summary.json holds: ECE and accuracies in percent, the bins, the coverage table."""
    bins = reliability(confidence, accuracy)
    for b in bins:
        for k in ("confidence", "accuracy"):
            b[k] = None if b[k] is None else round(100 * b[k], ndigits)
    return {"ece": round(100 * expected_calibration_error(confidence, accuracy), ndigits), "bins": BINS,
            "mean_confidence": round(100 * float(np.mean(confidence)), ndigits),
            "reliability": bins,
            "accuracy_at_coverage": {k: round(100 * v, ndigits)
                                     for k, v in accuracy_at_coverage(confidence, accuracy).items()}}


def plot_reliability(summary: dict, path: str | Path) -> Path:
    """The reliability diagram of `calibration_summary`'s output (accuracy per confidence bin against the
    diagonal of perfect calibration, the answers per bin beneath) as a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt
    bins = summary["reliability"]
    width = 100 / len(bins)
    centers = [100 * (b["lo"] + b["hi"]) / 2 for b in bins]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(4.5, 5.5), sharex=True, gridspec_kw=dict(height_ratios=[3, 1]))
    top.bar(centers, [b["accuracy"] or 0 for b in bins], width=width, edgecolor="black", label="accuracy")
    top.bar(centers, [(b["confidence"] or 0) - (b["accuracy"] or 0) if b["count"] else 0 for b in bins],
            bottom=[b["accuracy"] or 0 for b in bins], width=width, color="tab:red", alpha=0.3, label="gap")
    top.plot([0, 100], [0, 100], "k--", linewidth=1, label="perfect calibration")
    top.set(ylabel="VQA accuracy (%)", xlim=(0, 100), ylim=(0, 100),
            title=f"ECE {summary['ece']:.2f}% ({summary['bins']} bins)")
    top.legend(loc="upper left", fontsize=8)
    bottom.bar(centers, [b["count"] for b in bins], width=width, color="gray", edgecolor="black")
    bottom.set(xlabel="confidence (%)", ylabel="answers")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


__all__ = ["BINS", "COVERAGES", "bin_index", "reliability", "expected_calibration_error", "accuracy_at_coverage",
           "calibration_summary", "plot_reliability"]
