"""The model card of a checkpoint published on the Hugging Face Hub: README.md with the Hub's YAML front matter
(license, `library_name: vqa`, `pipeline_tag`, tags, the data set, and the `vqa eval` scores in the Hub's
model-index form, written by huggingface_hub's ModelCardData) above what the model is, its scores, the
command that trained it and how to load it. `vqa push` uploads it; `vqa push --out DIR` writes it beside the
files. The card reads the checkpoint's card.json, the run's train_config.json and the `vqa eval` summaries
(`<checkpoint>-eval-<split>/summary.json`) of the same step.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..logs import get_logger

# summary.json's scores -> (the Hub's metric type, the name shown), per task
VQA_METRICS = {"vqa_accuracy": ("accuracy", "VQA accuracy")}
CAPTION_METRICS = {"BLEU-4": ("bleu", "BLEU-4"), "METEOR": ("meteor", "METEOR"), "ROUGE-L": ("rouge", "ROUGE-L"),
                   "CIDEr-D": ("cider", "CIDEr-D")}
TASKS = {"vqa": ("visual-question-answering", "Visual question answering", VQA_METRICS),
         "caption": ("image-to-text", "Image captioning", CAPTION_METRICS)}


def eval_summaries(folder: Path, card: dict) -> list[dict]:
    """The `vqa eval` summaries beside checkpoint `folder` (`<name>-eval-*/summary.json`) of its step; one of
    another step (an earlier best) is left out with a warning."""
    found = []
    for path in sorted(folder.parent.glob(f"{folder.name}-eval-*/summary.json")):
        try:
            s = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            get_logger("push").warning(f"vqa push: {path} left out of the card (unreadable: {e})")
            continue
        if not isinstance(s, dict):
            continue
        if card.get("step") is not None and s.get("step") != card.get("step"):
            get_logger("push").warning(f"vqa push: {path} left out of the card: it scored step {s.get('step')}, "
                                       f"the checkpoint is step {card.get('step')}")
            continue
        found.append(s)
    return found


def dataset_name(data: str | None) -> str | None:
    """A data set's name from the path or pattern it was read from: its last folder's name."""
    if not data:
        return None
    parts = [p for p in str(data).replace("\\", "/").split("/") if p and "{" not in p and "*" not in p]
    return parts[-1] if parts and re.fullmatch(r"[\w.-]+", parts[-1]) else None  # a name, not a description


def front_matter(repo_id: str, card: dict, summaries: list[dict], license: str) -> str:
    """The YAML between the `---` lines: what the Hub indexes."""
    from huggingface_hub import EvalResult, ModelCardData

    tasks = card.get("tasks") or ["vqa", "caption"]
    results = []
    for s in summaries:
        data = dataset_name(s.get("data")) or "unknown"
        for task in tasks:
            kind, title, metrics = TASKS[task]
            for key, (metric, name) in metrics.items():
                if isinstance(s.get(key), (int, float)):
                    results.append(EvalResult(task_type=kind, task_name=title, dataset_type=data, dataset_name=data,
                                              dataset_split=s.get("split"), metric_type=metric, metric_name=name,
                                              metric_value=round(float(s[key]), 4)))
    data = dataset_name(card.get("data"))
    tags = ["vqa", "pytorch", "safetensors", *(TASKS[t][0] for t in tasks), "image-captioning" * ("caption" in tasks)]
    meta = ModelCardData(license=license, library_name="vqa", pipeline_tag=TASKS[tasks[0]][0],
                         tags=[t for t in dict.fromkeys(tags) if t] + ([card["preset"]] if card.get("preset") else []),
                         datasets=[data] if data else None, model_name=repo_id.split("/")[-1],
                         eval_results=results or None)
    return meta.to_yaml()


def model_card(repo_id: str, card: dict, summaries: list[dict], command: str | None, files: list[str],
               license: str = "mit") -> str:
    """README.md's text for checkpoint `card` published as `repo_id`."""
    tasks = card.get("tasks") or ["vqa", "caption"]
    does = " and ".join({"vqa": "answers questions about pictures", "caption": "captions pictures"}[t] for t in tasks)
    lines = ["---", front_matter(repo_id, card, summaries, license).rstrip(), "---", "", f"# {repo_id.split('/')[-1]}",
             "", f"A `vqa` model that {does}: a timm ViT encoder and a Transformer decoder joined by "
             "cross-attention."]
    facts = [("preset", card.get("preset")),
             ("parameters", f"{card['parameters']:,}" if card.get("parameters") else None),
             ("trained on", dataset_name(card.get("data"))), ("split", card.get("train_split")),
             ("steps", card.get("step"))]
    lines += ["", *(f"- {k}: {v}" for k, v in facts if v is not None)]
    if summaries:
        lines += ["", "## Results", "", "| data | split | score | value |", "|---|---|---|---|"]
        for s in summaries:
            for key, (_, name) in {**VQA_METRICS, **CAPTION_METRICS}.items():
                if isinstance(s.get(key), (int, float)):
                    lines.append(f"| {dataset_name(s.get('data'))} | {s.get('split')} | {name} | {s[key]:.2f} |")
        lines += ["", "Each from `vqa eval --checkpoint CHECKPOINT --data DATA --split SPLIT` (its summary.json)."]
    if card.get("val_scores"):
        scores = ", ".join(f"{k} {v:.4g}" for k, v in card["val_scores"].items() if isinstance(v, (int, float)))
        lines += ["", f"Validation during training ({card.get('val_split')}, at the saved step): {scores}."]
    if command:
        lines += ["", "## Training", "", "```bash", command, "```"]
    lines += ["", "## How to load it", "", "```bash",
              f'vqa ask --checkpoint {repo_id} picture.png "what color is the circle?"',
              f"vqa caption --checkpoint {repo_id} picture.png",
              f"vqa demo --checkpoint {repo_id}",
              "```", "", "```python", "from vqa import Predictor", "",
              f'p = Predictor.from_pretrained("{repo_id}")   # or "{repo_id}@REVISION"',
              'p.answer("picture.png", "what color is the circle?").answer',
              'p.caption("picture.png").caption', "```", "",
              "`vqa` downloads the safetensors and JSON files only (huggingface_hub's cache; HF_HUB_OFFLINE=1 "
              "reads the cache alone).", "", "## Files", "", *(f"- `{f}`" for f in files), ""]
    return "\n".join(lines)


__all__ = ["eval_summaries", "dataset_name", "front_matter", "model_card"]
