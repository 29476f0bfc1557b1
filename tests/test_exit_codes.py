"""Every subcommand's exit status is the documented one (README, `vqa --help`): 2 for a usage error (a missing
argument, options that cannot work together, a bad option value), 1 for a missing or bad file, each with one line
`vqa COMMAND: error: ...` on stderr and no traceback. One table over all the commands, run in this process."""

from __future__ import annotations

import re
import shutil

import pytest
from PIL import Image
from predict_fixtures import shared_checkpoint

from vqa.cli import COMMANDS, main

NONE = "no-such-run"  # a checkpoint that does not exist: a usage error must stop before any checkpoint is read

# (command line with {placeholders}, exit status, what the error line says)
CASES = [
    # vqa ask: a missing argument
    ("ask --checkpoint {none} {img}", 2, r"vqa ask needs INPUT\.\.\. QUESTION"),
    ("ask --checkpoint {none}", 2, r"vqa ask needs INPUT\.\.\. QUESTION"),
    ("ask --checkpoint {none} {img} {blank}", 2, r"the question is empty"),
    ("ask --checkpoint {none} --out {tmp}/a.jsonl {pics} {blank}", 2, r"the question \(the last argument\) is empty"),
    # vqa ask: options that cannot work together, values that cannot work
    ("ask --checkpoint {none} --questions {questions} {img}", 2, r"either --questions Q\.jsonl or INPUT"),
    ("ask --checkpoint {none} --int8 --precision bf16 {img} q", 2, r"--int8 and --precision bf16 do not go together"),
    ("ask --checkpoint {none} --attention-out {tmp}/att --out {tmp}/a.jsonl {img} q", 2,
     r"--attention-out explains one image"),
    ("ask --checkpoint {none} --merge {tmp}/a.jsonl {img} q", 2, r"--merge merges the part files"),
    ("ask --checkpoint {none} --merge {tmp}/a.jsonl --questions {questions}", 2, r"--merge merges the part files"),
    ("ask --checkpoint {none} --top-k 0 {img} q", 2, r"--top-k must be at least 1, got 0"),
    ("ask --checkpoint {none} --top-k 5 --num-beams 3 {img} q", 2, r"--num-beams 3 cannot return --top-k 5"),
    ("ask --checkpoint {none} --top-k 2 --method greedy {img} q", 2, r"greedy decoding gives one answer"),
    ("ask --checkpoint {none} --batch-size 0 {img} q", 2, r"--batch-size must be at least 1"),
    ("ask --checkpoint {none} --method beam --num-beams x {img} q", 2, r"argument --num-beams"),
    ("ask --checkpoint {none} --point --top-k 3 --out {tmp}/a.jsonl {pics} star", 2,
     r"--point finds one point .*no --top-k"),
    # vqa caption
    ("caption --checkpoint {none}", 2, r"vqa caption needs an INPUT"),
    ("caption --checkpoint {none} --merge {tmp}/c.jsonl {img}", 2, r"--merge merges the part files"),
    ("caption --checkpoint {none} --int8 --precision fp16 {img}", 2, r"--int8 and --precision fp16"),
    ("caption --checkpoint {none} --attention-out {tmp}/att --out {tmp}/c.jsonl {img}", 2,
     r"--attention-out explains one image"),
    ("caption --checkpoint {none} --method sample --top-p 1.5 {img}", 2, r"top_p must be in \(0, 1\]"),
    ("caption --checkpoint {none} --workers -1 {img}", 2, r"--workers must be at least 0"),
    # vqa train
    ("train --data {shapes}", 2, r"--out is required"),
    ("train --out {tmp}/run", 2, r"--data is required"),
    ("train --data {shapes} --out {tmp}/run --max-steps 1 --epochs 1", 2, r"give one of --epochs, --max-steps"),
    ("train --data {shapes} --out {tmp}/run --shard fsdp --precision fp16", 2, r"--shard fsdp does not take"),
    ("train --data {shapes} --out {tmp}/run --train-only decoder --vit-lr 0.001", 2, r"--vit-lr 0\.001 trains"),
    ("train --data {shapes} --out {tmp}/run --config {tmp}/none.yaml", 2, r"--config .*: no such file"),
    # vqa pretrain
    ("pretrain --minutes 1", 2, r"the following arguments are required: --out"),
    ("pretrain --out {tmp}/pt --minutes 0", 2, r"--minutes must be more than 0"),
    ("pretrain --out {tmp}/pt --grounding-weight -1", 2, r"--grounding-weight must be >= 0"),
    # vqa eval
    ("eval --checkpoint {none}", 2, r"the following arguments are required: --data"),
    ("eval --checkpoint {none} --data {shapes} --batch-size 0", 2, r"--batch-size must be at least 1"),
    ("eval --checkpoint {ckpt} --data {shapes} --device cpu --tasks caption --consistency", 2,
     r"--consistency asks questions"),
    ("eval --checkpoint {ckpt} --data {plain} --device cpu --grounding", 2, r"--grounding needs a Shapes or Scenes"),
    ("eval --checkpoint {ckpt} --data {shapes} --device cpu --tasks caption --pointing", 2,
     r"--pointing asks questions"),
    # vqa export / import
    ("export --checkpoint {none}", 2, r"one of the arguments --onnx --transformers is required"),
    ("export --checkpoint {none} --onnx {tmp}/a --transformers {tmp}/b", 2, r"not allowed with argument"),
    ("import --transformers {tmp}", 2, r"the following arguments are required: --out"),
    ("import --transformers {tmp}/none --out {pics}", 2, r"--out .* exists and is not an empty folder"),
    # vqa data
    ("data", 2, r"the following arguments are required"),
    ("data shapes", 2, r"the following arguments are required: --out"),
    ("data convert {shapes} {tmp}/cv --to webdataset --shard-size 0", 2, r"--shard-size must be >= 1"),
    # vqa demo
    ("demo --checkpoint {none} --port 0", 2, r"--port must be from 1 to 65535"),
    # vqa push
    ("push {tmp}/run", 2, r"the following arguments are required: --repo-id"),
    ("demo --checkpoint {none} --max-batch 0", 2, r"--max-batch must be at least 1"),
    # a missing or bad file: a failure while running, 1
    ("ask --checkpoint {none} {img} q", 1, r"no checkpoint at no-such-run"),
    ("ask --checkpoint {none} --questions {tmp}/none.jsonl", 1, r"no such questions file"),
    ("ask --checkpoint {none} --questions {bad_questions}", 1, r"bad\.jsonl.*malformed|bad\.jsonl:1"),
    ("caption --checkpoint {ckpt} --device cpu {bad_img}", 1, r"bad\.png: not an image file"),
    ("caption --checkpoint {none} --merge {tmp}/c.jsonl", 1, r"no part files to merge"),
    ("train --data {tmp}/none --out {tmp}/run", 1, r"no such data folder"),
    ("eval --checkpoint {ckpt} --data {shapes} --device cpu --split nosplit", 1, r"no split 'nosplit'"),
    ("import --transformers {tmp}/none --out {tmp}/imported", 1, r"--transformers .*none: no such folder"),
    ("import --transformers {shapes} --out {tmp}/imported", 1, r"config\.json: missing"),
    ("export --checkpoint {none} --onnx {tmp}/onnx", 1, r"no checkpoint at no-such-run"),
    ("data info {tmp}/none", 1, r"no such data folder"),
]


@pytest.fixture
def places(tmp_path, shapes_dir):
    img = tmp_path / "pics" / "a.png"
    img.parent.mkdir()
    Image.new("RGB", (32, 32), "red").save(img)
    (tmp_path / "bad.png").write_bytes(b"\x00" * 10)
    (tmp_path / "q.jsonl").write_text('{"image": "pics/a.png", "question": "what color?"}\n')
    (tmp_path / "bad.jsonl").write_text('{"image": "pics/a.png", "question": \n')
    return dict(none=NONE, blank="  ", img=img, pics=img.parent, tmp=tmp_path, questions=tmp_path / "q.jsonl",
                bad_questions=tmp_path / "bad.jsonl", bad_img=tmp_path / "bad.png", shapes=shapes_dir)


def _plain(shapes_dir, tmp_path):
    """A VQA v2 folder that is not a Shapes or Scenes set: the Shapes one without its scene files."""
    plain = tmp_path / "plain"
    shutil.copytree(shapes_dir, plain, ignore=shutil.ignore_patterns("*_scenes.json"))
    return plain


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own usage errors
        return e.code


@pytest.mark.parametrize("line, status, match", CASES, ids=[f"{c[0].split()[0]}-{i}" for i, c in enumerate(CASES)])
def test_every_command_exits_with_the_documented_status_in_one_line(places, tmp_path, shapes_dir, capsys,
                                                                    monkeypatch, line, status, match):
    monkeypatch.chdir(tmp_path)
    if "{ckpt}" in line:
        places["ckpt"] = shared_checkpoint()
    if "{plain}" in line:
        places["plain"] = _plain(shapes_dir, tmp_path)
    argv = [a.format(**places) for a in line.split()]
    capsys.readouterr()
    code = run(argv)
    err = capsys.readouterr().err
    assert code == status, (argv, code, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    errors = [x for x in err.splitlines() if ": error: " in x]
    assert len(errors) == 1 and re.match(rf"vqa {argv[0]}( [a-z]+)?: error: ", errors[0]), err[-2000:]
    assert re.search(match, errors[0]), err[-2000:]


def test_under_torchrun_a_collection_without_out_is_a_usage_error(places, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    capsys.readouterr()
    assert main(["caption", "--checkpoint", NONE, str(places["pics"])]) == 2
    assert "under torchrun every process writes a part of --out" in capsys.readouterr().err


def test_the_table_covers_every_command():
    assert {c[0].split()[0] for c in CASES} == set(COMMANDS)
