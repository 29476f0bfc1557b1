"""Where `vqa eval` puts its results, and that every question is scored by its own answer."""

import json

import numpy as np
import pytest
from conftest import tiny_set_flags
from data_fixtures import write_image, write_jsonl

from vqa.cli import main
from vqa.data.readers.formats import load_split
from vqa.errors import DataError
from vqa.evaluation.evaluate import evaluate
from vqa.identity import checkpoint_identity
from vqa.weights import checkpoint


def test_eval_results_live_beside_the_checkpoint_and_survive_the_next_save(shapes_dir, tmp_path, capsys):
    run = tmp_path / "run"
    base = ["--data", str(shapes_dir), "--out", str(run), "--batch-size", "4", "--eval-images", "4", *tiny_set_flags()]
    assert main(["train", *base, "--max-steps", "1"]) == 0
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(run / "last"), "--data", str(shapes_dir), "--max-images", "4"]) == 0
    out = run / "last-eval-val"  # not inside last/: a save replaces that folder whole
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == 1 and summary["checkpoint"] == str((run / "last").resolve())
    assert summary["model"] == checkpoint_identity(run / "last")  # which model, whatever the folder holds later
    # the paper's table, the answers' calibration and its reliability diagram
    printed = capsys.readouterr().out
    assert "BLEU-4  METEOR  ROUGE-L  CIDEr" in printed and "ECE" in printed and "ROUGE-L" in summary
    # a built-in set's questions: the accuracy per template under the question types (test_eval_wordings.py)
    assert "  per template (Shapes wordings; accuracy, questions):\n" in printed
    rows = [row for family in summary["per_template"]["per_family"].values() for row in family.values()]
    assert sum(row["questions"] for row in rows) == summary["questions"]
    cal = summary["calibration"]
    assert cal["bins"] == 15 and sum(b["count"] for b in cal["reliability"]) == summary["questions"]
    assert cal["accuracy_at_coverage"]["100%"] == pytest.approx(summary["vqa_accuracy"], abs=0.01)
    assert (out / "reliability.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["train", *base, "--max-steps", "2", "--resume"]) == 0  # last/ is saved again
    assert checkpoint.load_train_state(run / "last")["step"] == 2
    assert json.loads((out / "summary.json").read_text()) == summary and (out / "vqa_results.json").is_file()


def test_evaluation_refuses_a_split_whose_question_ids_repeat(tmp_path):
    from predict_fixtures import shared_checkpoint

    write_image(tmp_path / "a.png")
    write_jsonl(tmp_path / "val.jsonl", [{"image": "a.png", "question": f"q{i}?", "answers": ["x"],
                                          "question_id": i} for i in range(3)])
    sd = load_split(tmp_path, "val")
    model, tok, _ = checkpoint.load(shared_checkpoint())
    assert evaluate(model, tok, sd, tasks=("vqa",), progress=False)["summary"]["questions"] == 3
    # a source that does not check (shards written by another tool): two questions with one id
    sd.vqa.question_id = np.array([0, 1, 1])
    with pytest.raises(DataError, match="question_id 1 is on 2 questions"):
        evaluate(model, tok, sd, tasks=("vqa",), progress=False)
