"""Fine-tuning an imported captioner for VQA: `vqa train --init-from RUN` gives its GPT-2 tokenizer vqa's
<question> and <answer> (special tokens after its vocabulary), grows the tied embedding by their two rows at
the mean embedding, and a short run on Shapes lowers the loss of both tasks."""

from __future__ import annotations

import json

import pytest
import torch
from hf_fixtures import save_tiny_ved

from vqa.cli import main
from vqa.data.dataset import ImageTextDataset
from vqa.data.sources import open_split
from vqa.data.transforms import build_transform
from vqa.export.hf_import import import_transformers
from vqa.tokenizer import ANSWER, QUESTION
from vqa.weights import checkpoint
from vqa.weights.grow_vocab import grow_embedding

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("imp")
    return import_transformers(save_tiny_ved(tmp / "src", n_positions=64), tmp / "run")


def test_prompt_tokens_and_grown_embedding(imported):
    model, tok, _ = checkpoint.load(imported)
    assert tok.question_id is None and tok.caption_prompt() == [tok.bos_id]
    grown_tok = tok.with_prompt_tokens()
    n = tok.vocab_size
    assert (grown_tok.question_id, grown_tok.answer_id) == (n, n + 1)
    assert grown_tok.encode("a red circle") == tok.encode("a red circle")  # the old tokens keep their ids
    assert grown_tok.encode(f"{QUESTION} {ANSWER}") == tok.encode(f"{QUESTION} {ANSWER}")  # typed: text
    grown = grow_embedding(model, grown_tok.vocab_size)
    old, new = model.state_dict(), grown.state_dict()
    for k, v in old.items():
        if k != "decoder.embed.weight":
            assert torch.equal(v, new[k]), k
    emb = new["decoder.embed.weight"]
    assert torch.equal(emb[:n], old["decoder.embed.weight"])
    mean, spread = old["decoder.embed.weight"].mean(0), old["decoder.embed.weight"].std(0)
    assert ((emb[n:] - mean).abs() <= 0.5 * spread).all()  # at the mean, a small offset
    assert not torch.equal(emb[n], emb[n + 1])


def test_init_from_a_shorter_context_keeps_the_first_positions(imported):
    from types import SimpleNamespace

    from vqa.train.build import init_from

    src, _, _ = checkpoint.load(imported)
    model, tok, _ = init_from(SimpleNamespace(model={"dec_max_len": 24}), str(imported))
    assert model.cfg.dec_max_len == 24 and tok.question_id is not None
    assert torch.equal(model.decoder.pos.weight, src.decoder.pos.weight[:24])
    assert torch.equal(model.decoder.blocks[0].cross_attn.kv.weight, src.decoder.blocks[0].cross_attn.kv.weight)


def _task_losses(run, data) -> dict[str, float]:
    """Teacher-forced loss per task on the training images (every question, one caption each)."""
    model, tok, _ = checkpoint.load(run)
    if tok.question_id is None:
        tok = tok.with_prompt_tokens()
        model = grow_embedding(model, tok.vocab_size).eval()
    tf = build_transform(model.cfg, train=False)
    ds = ImageTextDataset(open_split(data, "train"), tok, tf, model.cfg.dec_max_len, train=False)
    sums: dict[str, list[float]] = {"vqa": [], "caption": []}
    with torch.no_grad():
        for i in range(8):
            item = ds[i]
            x = tf.finish(item["image"])[None]
            for row in item["rows"]:
                ids = torch.tensor([row["input_ids"]])
                out = model.teacher_forced(x, ids, loss_mask=torch.tensor([row["loss_mask"]]))
                sums[row["task"]].append(float(out.loss))
    return {k: sum(v) / len(v) for k, v in sums.items()}


@pytest.mark.slow  # ~25 s on a loaded 2-core machine
def test_short_fine_tune_on_shapes_trains_both_tasks(imported, shapes_dir, tmp_path, capsys):
    out = tmp_path / "vqa"
    args = ["train", "--init-from", str(imported), "--data", str(shapes_dir), "--out", str(out),
            "--max-steps", "30", "--batch-size", "4", "--warmup", "2", "--log-every", "1", "--eval-images", "4",
            "--lr", "3e-3", "--optimizer", "adamw", "--preset", "small"]
    assert main(args) == 0, capsys.readouterr().err[-2000:]
    assert "gains <question> and <answer>" in capsys.readouterr().err
    logged = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]
    assert len(logged) == 30 and sum(logged[-5:]) < 0.7 * sum(logged[:5])
    before, after = _task_losses(imported, shapes_dir), _task_losses(out / "last", shapes_dir)
    for task in ("vqa", "caption"):
        assert after[task] < 0.7 * before[task], (task, before, after)
    model, tok, card = checkpoint.load(out / "last")
    assert tok.caption_prompt() == [tok.bos_id] and tok.vqa_prompt("how many?")[:2] == [tok.bos_id, tok.question_id]
    img = next((shapes_dir / "val").rglob("*.png"))
    capsys.readouterr()
    assert main(["ask", "--checkpoint", str(out), str(img), "how many shapes are there?"]) == 0
    assert main(["ask", "--checkpoint", str(imported), str(img), "how many shapes are there?"]) == 1
    err = capsys.readouterr().err.strip()
    assert "captioner" in err and "--init-from" in err and "\n" not in err
    # the model trained here, exported: transformers' generate() gives `vqa caption`'s caption
    from hf_fixtures import load_ved

    from vqa.inference.predict import Predictor

    assert main(["export", "--checkpoint", str(out), "--transformers", str(tmp_path / "hf")]) == 0
    hf = load_ved(tmp_path / "hf")
    pred = Predictor.from_pretrained(out, device="cpu")
    for img in sorted((shapes_dir / "val").rglob("*.png"))[:3]:
        with torch.no_grad():
            row = hf.generate(pixel_values=pred.transform(img)[None])[0].tolist()[1:]  # after the start token
        theirs = row[: row.index(tok.eos_id)] if tok.eos_id in row else row
        assert theirs == pred.caption(img).ids
