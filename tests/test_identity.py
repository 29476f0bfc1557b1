"""A checkpoint's identity (`vqa.identity`) is the whole content of every file that changes an output: a byte in
the middle of the weights, an adapter, the config or the tokenizer makes another, a copy is the same; each
file's digest is read once and remembered under its path, size, mtime and inode; a rerun of a collection with
another checkpoint into the same output is refused, never silently empty. The image cache's fingerprint sees
a picture replaced by another file of the same size and time."""

from __future__ import annotations

import builtins
import hashlib
import json
import os
import shutil
import threading

import pytest
import torch
from collect_fixtures import photo_folder, records
from predict_fixtures import shared_checkpoint

import vqa.identity
from vqa.identity import IDENTITY_FILES, NOT_OUTPUTS, checkpoint_identity, digest_cache, file_digest

MiB = 1 << 20
PAST = 1_600_000_000  # a modification time long before the test: a settled file, whose digest is remembered


def settle(path, when: int = PAST) -> None:
    os.utime(path, (when, when))


def fake_checkpoint(folder, weights: bytes) -> None:
    """The files of a checkpoint folder (the identity reads bytes, it does not parse them)."""
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "config.json").write_text(json.dumps({"dec_width": 32}))
    (folder / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0}}}))
    (folder / "card.json").write_text(json.dumps({"step": 1}))


def weights_3mib() -> bytearray:
    return bytearray(torch.randint(0, 256, (3 * MiB,), generator=torch.Generator().manual_seed(0),
                                   dtype=torch.uint8).numpy().tobytes())


def test_one_byte_in_the_middle_of_the_weights_makes_another_identity(tmp_path):
    raw = weights_3mib()
    fake_checkpoint(tmp_path / "a", bytes(raw))
    raw[len(raw) // 2] ^= 1  # what a stage that trains only the middle tensors leaves: start and end unchanged
    fake_checkpoint(tmp_path / "b", bytes(raw))
    assert checkpoint_identity(tmp_path / "a") != checkpoint_identity(tmp_path / "b")
    shutil.copytree(tmp_path / "a", tmp_path / "copy")  # a copy of a checkpoint is the same model
    assert checkpoint_identity(tmp_path / "copy") == checkpoint_identity(tmp_path / "a")


@pytest.mark.parametrize("name, text", [
    ("adapter.safetensors", "other adapter weights"),
    ("adapter_config.json", json.dumps({"rank": 4, "alpha": 8.0, "targets": ["self_attn"]})),
    ("config.json", json.dumps({"dec_width": 64})),
    ("tokenizer.json", json.dumps({"model": {"vocab": {"b": 0}}})),
])
def test_an_adapter_config_or_tokenizer_change_makes_another_identity(tmp_path, name, text):
    fake_checkpoint(tmp_path / "a", b"weights")
    before = checkpoint_identity(tmp_path / "a")
    (tmp_path / "a" / name).write_text(text)
    after = checkpoint_identity(tmp_path / "a")
    assert after != before
    (tmp_path / "a" / "card.json").write_text(json.dumps({"step": 2, "val_scores": {}}))  # changes no output
    (tmp_path / "a" / "train_state.pt").write_bytes(b"resume state")
    assert checkpoint_identity(tmp_path / "a") == after


def test_every_file_a_checkpoint_save_writes_is_in_the_identity_or_changes_no_output(tmp_path):
    from vqa.weights import checkpoint
    from vqa.weights.lora import add_lora

    model, tok, card = checkpoint.load(shared_checkpoint(), merge_adapters=False)
    add_lora(model, 2, 4.0, ("self_attn",))
    folder = checkpoint.save(tmp_path / "lora", model, tok, card, train_state={"step": 1})
    written = {p.name for p in folder.iterdir()}
    assert {"adapter.safetensors", "adapter_config.json"} <= written
    assert written <= set(IDENTITY_FILES) | set(NOT_OUTPUTS)


def opens_of(monkeypatch, path) -> list:
    """A list that grows by one each time `path` is opened."""
    seen, real, target = [], builtins.open, os.path.realpath(path)

    def counting(file, *args, **kwargs):
        if isinstance(file, str | os.PathLike) and os.path.realpath(file) == target:
            seen.append(file)
        return real(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting)
    return seen


def test_a_files_digest_is_read_once_then_remembered_until_the_file_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("VQA_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x" * 3000)
    settle(f)
    opened = opens_of(monkeypatch, f)
    assert file_digest(f) == hashlib.sha256(b"x" * 3000).hexdigest() and len(opened) == 1
    assert file_digest(f) == hashlib.sha256(b"x" * 3000).hexdigest() and len(opened) == 1  # remembered
    settle(f, PAST + 1)  # another modification time: read again
    assert file_digest(f) == hashlib.sha256(b"x" * 3000).hexdigest() and len(opened) == 2
    f.write_bytes(b"y" * 3001)  # another size, the same time
    settle(f, PAST + 1)
    assert file_digest(f) == hashlib.sha256(b"y" * 3001).hexdigest() and len(opened) == 3
    other = tmp_path / "other"  # the same size and time, another inode: a file replaced by another
    other.write_bytes(b"z" * 3001)
    settle(other, PAST + 1)
    os.replace(other, f)
    assert file_digest(f) == hashlib.sha256(b"z" * 3001).hexdigest() and len(opened) == 4
    assert file_digest(f) == hashlib.sha256(b"z" * 3001).hexdigest() and len(opened) == 4


def test_a_file_written_just_now_is_not_remembered(tmp_path, monkeypatch):
    monkeypatch.setenv("VQA_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"fresh")  # a rewrite within the same clock tick would keep its key: read it again next time
    opened = opens_of(monkeypatch, f)
    file_digest(f)
    file_digest(f)
    assert len(opened) == 2


@pytest.mark.parametrize("content", [b"not json {", b"\xff\xfe\x00", b"[1, 2]", b'{"k": 3}', b""])
def test_a_damaged_digest_cache_is_ignored_and_rewritten(tmp_path, monkeypatch, content):
    monkeypatch.setenv("VQA_CACHE", str(tmp_path / "cache"))
    digest_cache().parent.mkdir(parents=True)
    digest_cache().write_bytes(content)
    f = tmp_path / "w"
    f.write_bytes(b"weights")
    settle(f)
    assert file_digest(f) == hashlib.sha256(b"weights").hexdigest()
    assert list(json.loads(digest_cache().read_text()).values()) == [hashlib.sha256(b"weights").hexdigest()]


def test_writers_at_once_lose_no_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("VQA_CACHE", str(tmp_path / "cache"))
    files = []
    for i in range(24):
        files.append(tmp_path / f"f{i}")
        files[-1].write_bytes(str(i).encode())
        settle(files[-1])
    threads = [threading.Thread(target=lambda part=files[k::6]: [file_digest(p) for p in part]) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(json.loads(digest_cache().read_text())) == 24


def test_an_unwritable_cache_folder_only_costs_a_reread(tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("a file where the folder should be")
    monkeypatch.setenv("VQA_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "w"
    f.write_bytes(b"weights")
    settle(f)
    assert file_digest(f) == file_digest(f) == hashlib.sha256(b"weights").hexdigest()


# ------------------------------------------------------------------------- where the project names a model


def test_a_collection_after_another_checkpoint_is_refused_never_silently_empty(tmp_path, capsys):
    from vqa.cli import main
    from vqa.weights import checkpoint
    from vqa.weights.lora import add_lora, lora_layers, save_adapters

    a = shared_checkpoint()
    b = tmp_path / "b"  # A's files, byte for byte, with LoRA adapters beside them: another model
    shutil.copytree(a, b)
    model, _, _ = checkpoint.load(a, merge_adapters=False)
    add_lora(model, 2, 4.0, ("self_attn", "mlp"))
    with torch.no_grad():
        for layer in lora_layers(model).values():
            layer.lora_B.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
    save_adapters(model, b)
    photo_folder(tmp_path / "p", 3)
    out = tmp_path / "caps.jsonl"
    argv = ["caption", str(tmp_path / "p"), "--workers", "0"]
    assert main([*argv, "--checkpoint", str(a), "--out", str(out)]) == 0
    before = out.read_text()
    capsys.readouterr()
    assert main([*argv, "--checkpoint", str(b), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "its records were made with other settings" in err and len(err.splitlines()) == 1
    assert out.read_text() == before
    assert main([*argv, "--checkpoint", str(b), "--out", str(tmp_path / "b.jsonl")]) == 0
    made = records(tmp_path / "b.jsonl")
    assert len(made) == 3 and {r["settings"] for r in made}.isdisjoint({r["settings"] for r in records(out)})


def test_the_demo_card_names_the_checkpoints_identity():
    from predict_fixtures import demo_predictor

    from vqa.demo.card import card_markdown

    pred = demo_predictor()
    assert f"| identity | `{checkpoint_identity(shared_checkpoint())}` |" in card_markdown(pred)


def test_the_image_cache_sees_a_picture_replaced_by_another_file_of_the_same_size_and_time(tmp_path):
    from vqa.data.cache import fingerprint
    from vqa.data.preprocess import Preprocess

    pic, other = tmp_path / "a.png", tmp_path / "b.png"
    pic.write_bytes(b"a" * 100)
    other.write_bytes(b"b" * 100)
    settle(pic)
    settle(other)
    pre = Preprocess(size=32)
    before = fingerprint([str(pic)], pre)
    os.replace(other, pic)
    assert fingerprint([str(pic)], pre) != before


def test_the_cache_is_in_vqas_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("VQA_CACHE", str(tmp_path / "home"))
    assert digest_cache() == tmp_path / "home" / vqa.identity.DIGESTS
