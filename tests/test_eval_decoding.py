"""`vqa eval` scores the decoding that is served: what `vqa ask` / `vqa caption` and the Predictor use by
default (beam search over 3 beams for answers, greedy captions), or what its decoding options say, as on
`vqa ask`; the table and summary.json name it. Training's evaluations decode greedily, for speed, and say so."""

import json

import pytest
from data_fixtures import write_jsonl
from predict_fixtures import COLOR_Q, ITEMS, SHAPE_Q, shared_checkpoint, write_pictures

import vqa.evaluation.evaluate as evaluate_module
from vqa.cli import main
from vqa.config import GenerationConfig
from vqa.inference.predict import Predictor


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("pictures")
    pictures = write_pictures(root)
    rows = [{"image": p.name, "question": q, "answers": [ITEMS[n][k]], "question_id": f"{n}:{k}"}
            for n, p in pictures.items() for k, q in enumerate((COLOR_Q, SHAPE_Q))]
    rows += [{"image": p.name, "caption": ITEMS[n][2]} for n, p in pictures.items()]
    write_jsonl(root / "val.jsonl", rows)
    return root, pictures


def _eval(folder, out, monkeypatch, *options):
    """`vqa eval` on the folder; the GenerationConfig each task was decoded with; summary.json; the answers."""
    configs, real = [], evaluate_module.generate

    def spy(model, prompts, **kw):
        configs.append(kw["config"])
        return real(model, prompts, **kw)

    monkeypatch.setattr(evaluate_module, "generate", spy)
    assert main(["eval", "--checkpoint", str(shared_checkpoint()), "--data", str(folder), "--split", "val",
                 "--out", str(out), *options]) == 0
    summary = json.loads((out / "summary.json").read_text())
    answers = {r["question_id"]: r["answer"] for r in json.loads((out / "vqa_results.json").read_text())}
    written = out / "caption_results.json"
    captions = {r["image_id"]: r["caption"] for r in json.loads(written.read_text())} if written.is_file() else {}
    return configs, summary, answers, captions


def test_eval_decodes_as_ask_serves_and_says_so(folder, tmp_path, monkeypatch, capsys):
    root, pictures = folder
    configs, summary, answers, captions = _eval(root, tmp_path / "out", monkeypatch)
    pred = Predictor.from_pretrained(shared_checkpoint(), device="cpu")
    served = {"vqa": pred.answer_settings(), "caption": pred.caption_settings()}
    assert served["vqa"].method == "beam" and served["vqa"].num_beams == 3
    assert {c.method for c in configs} == {"beam", "greedy"}
    assert all(c in served.values() for c in configs)  # each task decoded with exactly what is served
    assert summary["generation"] == {t: c.to_dict() for t, c in served.items()}
    assert summary["decoding"] == {"vqa": "beam search (3 beams, length penalty 0)", "caption": "greedy"}
    printed = capsys.readouterr().out
    assert "decoding: answers beam search (3 beams, length penalty 0); captions greedy" in printed
    assert "scored by VQA v2 (answers normalized when the annotators disagree)" in printed
    for n, path in pictures.items():  # the answers and captions `vqa ask` / `vqa caption` give
        for k, q in enumerate((COLOR_Q, SHAPE_Q)):
            assert answers[f"{n}:{k}"] == pred.answer(str(path), q).answer
        assert captions[path.name] == pred.caption(str(path)).caption  # a JSONL caption's image id: its path


def test_eval_takes_the_decoding_options_as_ask_does(folder, tmp_path, monkeypatch, capsys):
    root, _ = folder
    configs, summary, _, _ = _eval(root, tmp_path / "greedy", monkeypatch, "--method", "greedy")
    assert {c.method for c in configs} == {"greedy"}
    assert summary["decoding"] == {"vqa": "greedy", "caption": "greedy"}
    configs, summary, _, _ = _eval(root, tmp_path / "beams", monkeypatch, "--num-beams", "4", "--tasks", "vqa")
    assert [c.num_beams for c in configs] and all(c == GenerationConfig.served("vqa", num_beams=4) for c in configs)
    assert summary["decoding"] == {"vqa": "beam search (4 beams, length penalty 0)"}
    capsys.readouterr()


def test_training_evaluations_decode_greedily_and_say_so(folder):
    from vqa.data.readers.formats import load_split
    from vqa.evaluation.evaluate import evaluate
    from vqa.weights import checkpoint

    model, tok, _ = checkpoint.load(shared_checkpoint())
    res = evaluate(model, tok, load_split(folder[0], "val"), progress=False)  # as vqa.train calls it
    assert res["summary"]["decoding"] == {"vqa": "greedy", "caption": "greedy"}
