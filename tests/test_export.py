"""`vqa export --onnx` and `vqa.export.runtime`: onnxruntime's logits equal PyTorch's at every step, its greedy
answers and captions equal the Predictor's, and bad folders get clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from predict_fixtures import COLOR_Q, SHAPE_Q, draw, shared_checkpoint

from vqa.cli import main
from vqa.errors import CheckpointError
from vqa.model import checkpoint

pytest.importorskip("onnxruntime")  # the `onnx` extra; `dev` installs it, so CI runs these
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx") / "model"
    assert main(["export", "--checkpoint", str(shared_checkpoint()), "--onnx", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def onnx_pred(exported):
    from vqa.export.runtime import OnnxPredictor

    return OnnxPredictor(exported)


@pytest.fixture(scope="module")
def pred():
    from vqa.inference.predict import Predictor

    return Predictor.from_pretrained(shared_checkpoint(), device="cpu")


def test_the_export_folder_holds_both_graphs_and_what_runs_them(exported):
    names = {p.name for p in exported.iterdir()}
    assert {"encoder.onnx", "decoder_step.onnx", "tokenizer.json", "config.json", "card.json"} <= names
    cfg = json.loads((exported / "config.json").read_text())
    assert cfg["onnx"]["step_inputs"][:3] == ["input_ids", "position_ids", "key_mask"]
    assert cfg["dec_depth"] == checkpoint.load(shared_checkpoint())[0].cfg.dec_depth


def test_onnx_logits_equal_pytorchs_at_every_step(onnx_pred, pred):
    """Several prompts of different lengths in one left-padded batch: at each step, the logits onnxruntime
    gives for the next token equal PyTorch's teacher-forced logits of the same sequence within 1e-4."""
    model, tok = pred.model, pred.tokenizer
    questions = [COLOR_Q, SHAPE_Q, "is there a " + "red " * 5 + "circle in the picture?"]
    images = [draw("red_circle"), draw("blue_square"), draw("blue_square")]
    prompts = [tok.vqa_prompt(q, max_len=model.cfg.dec_max_len) for q in questions]
    prompts.append(tok.caption_prompt())
    images.append(draw("red_circle"))
    mk, mv = onnx_pred.encode(images)
    seen: list[np.ndarray] = []
    outs = onnx_pred.greedy(prompts, mk, mv, max_new_tokens=6, on_logits=lambda t, logits: seen.append(logits))
    assert len(seen) >= 2
    x = torch.stack([pred.transform.finish(pred.transform.prepare(i)) for i in images])
    with torch.no_grad():
        for t, logits in enumerate(seen):
            for b, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
                if t > len(out):  # this row had ended
                    continue
                ids = torch.tensor([prompt + out[:t]])
                ref = model(x[b : b + 1], ids).logits[0, -1]
                np.testing.assert_allclose(logits[b], ref.numpy(), atol=1e-4, rtol=0, err_msg=f"step {t} row {b}")


def test_onnx_greedy_answers_equal_the_predictors(onnx_pred, pred, shapes_dir):
    from vqa.config import GenerationConfig

    greedy = GenerationConfig.for_task("vqa")  # what onnx_predict does: greedy, 10 tokens
    pictures = [draw("red_circle"), draw("blue_square")] + sorted((shapes_dir / "val").glob("*.png"))[:4]
    questions = [COLOR_Q, SHAPE_Q, "how many circles are there?", "is the red square left of the circle?"]
    for img in pictures:
        expected = [r.answer for r in pred.answer_batch(img, questions, generation=greedy)]
        assert onnx_pred.answer_batch([img] * len(questions), questions) == expected
        assert onnx_pred.caption(img) == pred.caption(img).caption


def test_bad_folders_and_checkpoints_are_named(tmp_path, capsys, exported):
    from vqa.export.runtime import OnnxPredictor

    with pytest.raises(CheckpointError, match="no config.json"):
        OnnxPredictor(tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((exported / "config.json").read_text())
    with pytest.raises(CheckpointError, match="missing encoder.onnx"):
        OnnxPredictor(broken)
    incomplete = tmp_path / "ckpt"
    incomplete.mkdir()
    (incomplete / "model.safetensors").write_bytes(b"")
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(incomplete), "--onnx", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "missing" in err and "Traceback" not in err
    assert main(["export", "--checkpoint", str(shared_checkpoint()), "--onnx", str(exported)]) == 2
    assert "not empty; pass --force" in capsys.readouterr().err


def test_the_runtime_path_imports_no_torch(exported, tmp_path):
    img = tmp_path / "p.png"
    draw("blue_square").save(img)
    code = ("import sys; from vqa.export.runtime import main; rc = main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code, str(exported), str(img), SHAPE_Q], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "square"
