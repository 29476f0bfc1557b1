"""`vqa export --onnx` and `vqa.export.runtime`: onnxruntime's logits equal PyTorch's at every step, its greedy
answers and captions equal the Predictor's, and bad folders get clear errors. Logits are compared within 1e-4
(onnxruntime's kernels are not PyTorch's); answers and captions exactly, on the trained test checkpoint, whose
greedy margins on these pictures and questions are far above that tolerance, so they agree on every CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from predict_fixtures import COLOR_Q, SHAPE_Q, draw, shared_checkpoint

from vqa.cli import main
from vqa.errors import CheckpointError, ConfigError
from vqa.export import onnx as export
from vqa.export.onnx import MARKER
from vqa.identity import checkpoint_identity
from vqa.weights import checkpoint

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
    assert {"encoder.onnx", "decoder_step.onnx", "tokenizer.json", "config.json", "card.json", MARKER} <= names
    cfg = json.loads((exported / "config.json").read_text())
    assert cfg["onnx"]["step_inputs"][:3] == ["input_ids", "position_ids", "key_mask"]
    assert cfg["dec_depth"] == checkpoint.load(shared_checkpoint())[0].cfg.dec_depth
    assert json.loads((exported / MARKER).read_text())["model"] == checkpoint_identity(shared_checkpoint())


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
                ref = model.teacher_forced(x[b : b + 1], ids).logits[0, -1]
                np.testing.assert_allclose(logits[b], ref.numpy(), atol=1e-4, rtol=0, err_msg=f"step {t} row {b}")


def _padded_prompts(pred) -> tuple[list[list[int]], list]:
    """Three prompts of different lengths (a left-padded batch) and their pictures."""
    tok, limit = pred.tokenizer, pred.model.cfg.dec_max_len
    prompts = [tok.vqa_prompt(COLOR_Q, max_len=limit), tok.caption_prompt(), tok.vqa_prompt(SHAPE_Q, max_len=limit)]
    assert len({len(p) for p in prompts}) == 3
    return prompts, [draw("red_circle"), draw("blue_square"), draw("blue_square")]


def test_the_onnx_steps_mask_is_pytorchs_on_a_padded_batch(onnx_pred, pred, monkeypatch):
    """The exported step builds its mask as the eager prefill does (`vqa.model.masks.causal_mask`): on a left-padded
    batch both give the decoder the same mask, in which a padding query sees its own key only (no row is all
    False: no softmax over nothing, no NaN); and onnxruntime then writes the caches PyTorch writes, at every slot
    of every layer -- padding slots too, whose keys above the first layer come from the padding queries' rows."""
    from vqa.decoding.batch import CacheBuffers, left_pad, prefill
    from vqa.export.onnx import DecoderStepGraph
    from vqa.model.decoder import TextDecoder

    model, cfg = pred.model, pred.model.cfg
    prompts, images = _padded_prompts(pred)
    ids, valid = left_pad(prompts, cfg.pad_id, "cpu")
    pos = (valid.cumsum(1) - 1).clamp(min=0)
    mk, mv = onnx_pred.encode(images)  # [L, B, H, N, Dh]: the same image keys/values on both sides
    kv = [(torch.from_numpy(k), torch.from_numpy(v)) for k, v in zip(mk, mv, strict=True)]
    masks = []
    forward = TextDecoder.forward
    monkeypatch.setattr(TextDecoder, "forward",
                        lambda self, *a, **kw: masks.append(kw["mask"]) or forward(self, *a, **kw))
    b, p = ids.shape
    state = CacheBuffers.allocate(cfg, b, p, torch.float32, "cpu")
    empty = torch.zeros(cfg.dec_depth, b, cfg.dec_heads, 0, cfg.dec_width // cfg.dec_heads)
    with torch.no_grad():
        prefill(model.decoder, state, ids, valid, kv, padded=True)
        DecoderStepGraph(model)(ids, pos, valid, empty, empty, torch.from_numpy(mk), torch.from_numpy(mv))
    eager, graph = masks
    assert eager.shape == (b, 1, p, p) and torch.equal(eager, graph)
    assert eager.any(-1).all()  # every query sees a key
    padding = ~valid
    assert torch.equal(eager[:, 0].sum(-1)[padding], torch.ones(int(padding.sum()), dtype=torch.long))
    _, present_k, present_v = onnx_pred.step(ids.numpy(), pos.numpy(), valid.numpy(), empty.numpy(), empty.numpy(),
                                             mk, mv)
    assert not np.isnan(present_k).any() and not np.isnan(present_v).any()
    np.testing.assert_allclose(present_k, torch.stack(state.k).numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(present_v, torch.stack(state.v).numpy(), atol=1e-5, rtol=0)


def test_a_padded_batch_decodes_as_its_prompts_one_by_one_in_onnx_and_pytorch(onnx_pred, pred):
    """Greedy over a left-padded batch gives each prompt what it gives alone, with onnxruntime (the logits of every
    step too) and with PyTorch's `generate`; and both give the same tokens."""
    from vqa.decoding.generate import generate

    prompts, images = _padded_prompts(pred)
    mk, mv = onnx_pred.encode(images)
    batch_logits: list[np.ndarray] = []
    batch = onnx_pred.greedy(prompts, mk, mv, max_new_tokens=6, on_logits=lambda t, logits: batch_logits.append(logits))
    x = torch.stack([pred.transform(i) for i in images])
    torch_batch = generate(pred.model, prompts, x, max_new_tokens=6).sequences
    assert torch_batch == batch
    for b, prompt in enumerate(prompts):
        alone_logits: list[np.ndarray] = []
        alone = onnx_pred.greedy([prompt], mk[:, b : b + 1], mv[:, b : b + 1], max_new_tokens=6,
                                 on_logits=lambda t, logits, seen=alone_logits: seen.append(logits))
        assert alone == [batch[b]]
        assert generate(pred.model, [prompt], x[b : b + 1], max_new_tokens=6).sequences == [batch[b]]
        for t, logits in enumerate(alone_logits):
            np.testing.assert_allclose(batch_logits[t][b], logits[0], atol=1e-4, rtol=0, err_msg=f"step {t} row {b}")


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
    assert main(["export", "--checkpoint", str(incomplete), "--onnx", str(tmp_path / "o")]) == 1
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


def _files(folder) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def test_an_export_never_replaces_enters_or_holds_its_checkpoint(tmp_path, capsys, monkeypatch):
    """`--onnx` that is the run folder, holds it, or lies inside it is refused, --force or not, before the
    checkpoint is read: the run stays whole (the folder used to be removed first)."""
    run = tmp_path / "runs" / "tiny"
    (run / "best").mkdir(parents=True)
    (run / "best" / "model.safetensors").write_bytes(b"weights")
    (run / "metrics.jsonl").write_text("{}\n")
    before = _files(run)
    for out, where in ((run, "is"), (run / "best", "lies inside"), (run / "onnx", "lies inside"),
                       (tmp_path / "runs", "holds"), (run / "best", "is")):
        ckpt = run / "best" if (out, where) == (run / "best", "is") else run
        assert main(["export", "--checkpoint", str(ckpt), "--onnx", str(out), "--force"]) == 2
        assert f"{where} the checkpoint folder" in capsys.readouterr().err
        assert _files(run) == before
    monkeypatch.chdir(run)
    assert main(["export", "--checkpoint", str(run), "--onnx", ".", "--force"]) == 2
    assert "--onnx . is the checkpoint folder" in capsys.readouterr().err and _files(run) == before


def test_force_replaces_only_an_earlier_export_and_only_once_the_new_one_is_written(tmp_path, monkeypatch):
    """--force never removes a folder vqa export did not write (no marker file); an earlier export is swapped
    for the new one only after the new one was written in full beside it, so a failed export leaves it as
    it was, and nothing temporary stays behind."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    with pytest.raises(ConfigError, match=f"not written by vqa export \\(no {MARKER}\\)"):
        export.check_output(ckpt, notes, force=True)
    with pytest.raises(ConfigError, match="not empty; pass --force"):
        export.check_output(ckpt, notes)
    assert (notes / "todo.txt").read_text() == "mine"

    earlier = tmp_path / "onnx"
    earlier.mkdir()
    (earlier / MARKER).write_text("{}")
    (earlier / "encoder.onnx").write_text("old")
    assert export.check_output(ckpt, earlier, force=True) is True
    assert export.check_output(ckpt, tmp_path / "new") is False

    def failing(checkpoint_path, out):
        Path(out).mkdir()
        (Path(out) / "encoder.onnx").write_text("half")
        raise ConfigError("the export failed")

    monkeypatch.setattr(export, "export_onnx", failing)
    with pytest.raises(ConfigError, match="the export failed"):
        export.export_replacing(ckpt, earlier, force=True)
    assert (earlier / "encoder.onnx").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "notes", "onnx"]

    def writing(checkpoint_path, out):
        Path(out).mkdir()
        (Path(out) / "encoder.onnx").write_text("new")
        (Path(out) / MARKER).write_text("{}")

    monkeypatch.setattr(export, "export_onnx", writing)
    assert export.export_replacing(ckpt, earlier, force=True) == earlier.resolve()
    assert (earlier / "encoder.onnx").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "notes", "onnx"]
