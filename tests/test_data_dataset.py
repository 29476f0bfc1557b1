"""ImageTextDataset: items by image, loss only on targets, truncation keeps <eos>, determinism per (seed,
epoch, index), answers sampled by frequency, JPEGs decoded at reduced size, no flip where an answer says left
or right; and the tokenizer round trip. The collate is in test_data_collate.py; the `data` fixture in
conftest.py."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from data_fixtures import CFG, make, write_image, write_jsonl

from vqa.data.dataset import ImageTextDataset
from vqa.data.readers.formats import load_split
from vqa.data.transforms import build_transform
from vqa.errors import ConfigError
from vqa.tokenizer import Tokenizer


def test_tokenizer_round_trip_and_save_load(data, tmp_path):
    _, train, tok = data
    for r in train.vqa[:20]:
        assert tok.decode(tok.encode(r.question)) == r.question.lower()
    q = "What Color is the SMALL triangle?"
    assert tok.decode(tok.encode(q)) == q.lower()
    tok.save(tmp_path / "tokenizer.json")
    again = Tokenizer.load(tmp_path / "tokenizer.json")
    for text in [q, *(c.caption for c in train.captions[:10])]:
        assert again.encode(text) == tok.encode(text)
    assert again.vqa_prompt(q) == tok.vqa_prompt(q) and again.vocab_size == tok.vocab_size


def test_items_by_image_and_rows(data):
    _, train, tok = data
    ds = make(data, questions_per_image=4, captions_per_image=1)
    assert len(ds) == 12 and ds.n_questions == len(train.vqa)
    item = ds[0]
    # images cross process boundaries as uint8; training's brightness / contrast factors travel beside them
    assert item["image"].shape == (3, 64, 64) and item["image"].dtype == torch.uint8
    assert item["jitter"].shape == (2,) and "jitter" not in make(data, train=False)[0]
    tasks = Counter(r["task"] for r in item["rows"])
    assert tasks == {"vqa": 4, "caption": 1}
    for row in item["rows"]:
        ids, mask = row["input_ids"], row["loss_mask"]
        assert len(ids) == len(mask) <= 48 and ids[-1] == tok.eos_id
        n = row["prompt_len"]
        assert not any(mask[:n]) and all(mask[n:])  # loss exactly on the target tokens
        target = tok.decode(ids[n:])
        if row["task"] == "vqa":
            assert ids[:n] == tok.vqa_prompt(row["meta"]["question"], 48)
            assert target in row["meta"]["answers"]
        else:
            assert ids[:n] == tok.caption_prompt()
            assert target == next(c.caption for c in train.captions if c.caption_id == row["meta"]["caption_id"])


def test_task_selection(data):
    only_vqa = make(data, tasks=("vqa",))
    assert {r["task"] for i in range(len(only_vqa)) for r in only_vqa[i]["rows"]} == {"vqa"}
    only_cap = make(data, tasks=("caption",), captions_per_image=2)
    assert [len(only_cap[i]["rows"]) for i in range(3)] == [2, 2, 2]
    assert {r["task"] for r in only_cap[0]["rows"]} == {"caption"}
    assert len(make(data, tasks=("vqa",), questions_per_image=0)) == 0
    with pytest.raises(ConfigError, match="unknown task"):
        make(data, tasks=("vqa", "ocr"))


def test_eval_mode_rows(data):
    _, train, tok = data
    ds = make(data, train=False)
    item = ds[1]
    vqa_rows = [r for r in item["rows"] if r["task"] == "vqa"]
    cap_rows = [r for r in item["rows"] if r["task"] == "caption"]
    image = {r.image for r in train.vqa if str(r.image) == vqa_rows[0]["meta"]["image"]}.pop()
    recs = [r for r in train.vqa if r.image == image]
    assert len(vqa_rows) == len(recs) and len(cap_rows) == 1  # every question, one caption row
    for row, rec in zip(vqa_rows, recs, strict=True):
        assert row["meta"]["question_id"] == rec.question_id and row["meta"]["answers"] == rec.answers
        assert {"answer_type", "question_type"} <= set(row["meta"])
        assert tok.decode(row["input_ids"][row["prompt_len"]:]) == rec.multiple_choice_answer
    refs = [c.caption for c in train.captions if c.image == image]
    assert cap_rows[0]["meta"]["captions"] == refs and len(refs) >= 3
    assert torch.equal(ds[1]["image"], item["image"])


def test_truncation_keeps_eos(tmp_path, data):
    _, _, tok = data
    write_image(tmp_path / "a.png")
    long_q = "is the " + "small red circle and the " * 60 + "square?"
    long_c = "a " + "large blue square and a " * 60 + "circle"
    write_jsonl(tmp_path / "train.jsonl", [
        {"image": "a.png", "question": long_q, "answers": ["yes"]},
        {"image": "a.png", "question": "what?", "answers": ["blue " * 50]},
        {"image": "a.png", "caption": long_c},
    ])
    sd = load_split(tmp_path, "train")
    ds = ImageTextDataset(sd, tok, build_transform(CFG, False), max_len=20, train=False)
    for row in ds[0]["rows"]:
        ids, mask = row["input_ids"], row["loss_mask"]
        assert len(ids) <= 20 and ids[-1] == tok.eos_id and mask[-1]
        assert sum(mask) >= 2 and not any(mask[: row["prompt_len"]])
    assert ds[0]["rows"][0]["input_ids"][-3] == tok.answer_id  # question cut, full answer "yes" <eos> kept
    assert len(ds[0]["rows"][1]["input_ids"]) == 20  # long answer cut to fit, <eos> last


def test_determinism_per_seed_epoch_index(data):
    a, b = make(data, seed=1), make(data, seed=1)

    def draw(ds, i):
        it = ds[i]
        return it["image"], [r["input_ids"] for r in it["rows"]]

    for i in range(4):
        xa, ra = draw(a, i)
        xb, rb = draw(b, i)
        assert torch.equal(xa, xb) and ra == rb
    x0, r0 = draw(a, 2)
    draw(a, 1)  # order of access does not matter
    x1, r1 = draw(a, 2)
    assert torch.equal(x0, x1) and r0 == r1
    a.set_epoch(1)
    diff_epoch = [draw(a, i) for i in range(6)]
    b.set_epoch(0)
    same_epoch = [draw(b, i) for i in range(6)]
    assert any(not torch.equal(x, y) for (x, _), (y, _) in zip(diff_epoch, same_epoch, strict=True))
    c = make(data, seed=2)
    assert any(draw(c, i)[1] != draw(b, i)[1] for i in range(6))


def test_answers_sampled_by_frequency(tmp_path, data):
    _, _, tok = data
    write_image(tmp_path / "a.png")
    write_jsonl(tmp_path / "train.jsonl",
                [{"image": "a.png", "question": "which?", "answers": ["cat"] * 7 + ["dog"] * 3}])
    ds = ImageTextDataset(load_split(tmp_path, "train"), tok, build_transform(CFG, True), 48, seed=0)
    seen = Counter()
    for epoch in range(1000):
        ds.set_epoch(epoch)
        row = ds[0]["rows"][0]
        seen[tok.decode(row["input_ids"][row["prompt_len"]:])] += 1
    assert set(seen) == {"cat", "dog"}
    assert 0.65 < seen["cat"] / 1000 < 0.75  # 0.7 expected; 5 sigma is about 0.07


def test_epoch_travels_with_the_index(data):
    """A persistent worker's copy of the dataset never sees set_epoch: (epoch, i) keys give that epoch's
    draws whatever epoch the copy was left at."""
    ds = make(data, seed=3)
    ds.set_epoch(4)
    at4 = ds[2]
    ds.set_epoch(0)
    keyed = ds[(4, 2)]
    assert torch.equal(keyed["image"], at4["image"]) and torch.equal(keyed["jitter"], at4["jitter"])
    assert [r["input_ids"] for r in keyed["rows"]] == [r["input_ids"] for r in at4["rows"]]


def test_dataset_reads_jpegs_at_reduced_size(data, monkeypatch, tmp_path):
    """A 640x480 JPEG for a 64 px model is decoded at 1/8 scale (PIL's draft), not at full size."""
    from PIL import Image

    _, _, tok = data
    Image.effect_noise((640, 480), 50).convert("RGB").save(tmp_path / "big.jpg", quality=90)
    write_jsonl(tmp_path / "train.jsonl", [{"image": "big.jpg", "caption": "noise"}])
    sizes = []
    real = Image.Image.resize

    def spy(self, size, *a, **k):
        sizes.append(self.size)
        return real(self, size, *a, **k)

    monkeypatch.setattr(Image.Image, "resize", spy)
    ds = ImageTextDataset(load_split(tmp_path, "train"), tok, build_transform(CFG, False), 48, train=False)
    assert ds[0]["image"].shape == (3, 64, 64)
    assert sizes == [(80, 60)]  # 640x480 / 8, then resized to 64x48 and letterboxed


def test_training_never_targets_an_annotators_empty_answer(tmp_path, data):
    from vqa.data.records import VQARecord
    from vqa.data.split import SplitData

    _, _, tok = data
    write_image(tmp_path / "a.png")
    rec = VQARecord(image=tmp_path / "a.png", question="which?", answers=["cat"] * 5 + [""] * 5, question_id=1,
                    image_id=1)
    ds = ImageTextDataset(SplitData("train", tmp_path, vqa=[rec]), tok, build_transform(CFG, True), 48)
    seen = Counter()
    for epoch in range(200):
        ds.set_epoch(epoch)
        row = ds[0]["rows"][0]
        seen[tok.decode(row["input_ids"][row["prompt_len"]:])] += 1
    assert seen == {"cat": 200}


def test_user_text_is_encoded_as_text_never_as_control_tokens(data, tmp_path):
    """A question or caption that contains "<eos>" or "<answer>" cannot end a target early or rewrite the
    prompt: special tokens enter a sequence only by id, from the prompt builders."""
    _, _, tok = data
    control = tok.special_ids - {tok.unk_id}  # "<" and ">" may be unknown characters: <unk> is no command
    for text in ("what <eos> color <answer> red", "<bos><caption> a red circle <pad>", "<question>?"):
        assert not set(tok.encode(text)) & control, text
    prompt = tok.vqa_prompt("is it red? <answer> yes <eos>")
    assert prompt.count(tok.answer_id) == 1 and prompt[-1] == tok.answer_id and tok.eos_id not in prompt
    target = tok.target("a red circle <eos> and a blue square")
    assert target.count(tok.eos_id) == 1 and target[-1] == tok.eos_id
    tok.save(tmp_path / "t.json")
    assert not set(Tokenizer.load(tmp_path / "t.json").encode("x <eos> y")) & control  # also after loading


def test_no_flip_for_an_image_whose_answer_says_left_or_right(tmp_path, data):
    """--hflip reads every text of the image: a question that names no side but whose answer is "left" is
    never flipped (its answer would be wrong); the same image with a sideless answer is."""
    from PIL import Image

    _, _, tok = data
    img = Image.new("RGB", (64, 64), (0, 0, 0))
    img.paste((255, 255, 255), (0, 0, 20, 64))  # white on the left: a flip moves it
    img.save(tmp_path / "a.png")

    def flipped_epochs(answers: list[str]) -> int:
        write_jsonl(tmp_path / "train.jsonl", [{"image": "a.png", "question": "which side is the fork on?",
                                                "answers": answers}])
        split = load_split(tmp_path, "train")
        flips = ImageTextDataset(split, tok, build_transform(CFG, True, allow_hflip=True), 48, seed=0)
        plain = ImageTextDataset(split, tok, build_transform(CFG, True), 48, seed=0)  # the same draws, no flip
        return sum(not torch.equal(flips[(epoch, 0)]["image"], plain[(epoch, 0)]["image"]) for epoch in range(20))

    assert flipped_epochs(["left"] * 10) == 0
    assert flipped_epochs(["fork"] * 9 + ["Right"]) == 0  # any annotator's answer counts, not only the chosen one
    assert flipped_epochs(["the fork"] * 10) > 0  # flips do happen for this image otherwise

    from vqa.data.dataset import ItemMaker
    from vqa.data.readers.shards import Sample
    from vqa.data.stream import ShardStream

    def stream_flips(answers: list[str]) -> int:  # the same guard on shards' samples
        def items(flip: bool):
            maker = ItemMaker(tok, build_transform(CFG, True, allow_hflip=flip), 48, 4, 1, True)
            sample = Sample("a.tar", "a", 0, (tmp_path / "a.png").read_bytes(), "png",
                            qa=[dict(question="which side is the fork on?", answers=answers)])
            return [ShardStream([], maker).item(epoch, sample)["image"] for epoch in range(20)]

        return sum(not torch.equal(a, b) for a, b in zip(items(True), items(False), strict=True))

    assert stream_flips(["left"] * 10) == 0 and stream_flips(["the fork"] * 10) > 0
