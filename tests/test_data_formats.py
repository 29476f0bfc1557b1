"""Readers: VQA v2, OK-VQA, COCO captions (top level and annotations/), JSONL; splits; every bad input."""

from __future__ import annotations

import json

import pytest
from data_fixtures import write_coco, write_image, write_jsonl, write_vqa

from vqa.data.readers.formats import find_splits, load_split
from vqa.data.records import CaptionRecord, VQARecord
from vqa.data.split import corpus_texts
from vqa.errors import DataError


def test_vqa_v2(tmp_path):
    write_vqa(tmp_path, "train2014")
    assert find_splits(tmp_path) == ["train2014"]
    sd = load_split(tmp_path, "train2014")
    assert len(sd.vqa) == 6 and not sd.captions and not sd.skipped
    r = sd.vqa[0]
    assert isinstance(r, VQARecord)
    assert r.image == tmp_path / "train2014" / "COCO_train2014_000000000009.jpg"
    assert r.question == "what color is the bus?" and r.question_id == 9000 and r.image_id == 9
    assert len(r.answers) == 10 and r.answers.count("red") == 7
    assert r.multiple_choice_answer == "red" and r.answer_type == "other" and r.question_type == "what color is the"
    assert "6 questions on 3 images" in sd.report()


def test_okvqa_names_and_png_images(tmp_path):
    write_vqa(tmp_path, "val2014", okvqa=True, ext=".png")
    assert find_splits(tmp_path) == ["val2014"]
    sd = load_split(tmp_path, "val2014")
    assert len(sd.vqa) == 6 and sd.vqa[0].image.suffix == ".png"


def test_split_named_without_year_finds_year_folder(tmp_path):
    write_vqa(tmp_path, "val2014")
    for f in tmp_path.glob("*.json"):
        f.rename(tmp_path / f.name.replace("val2014", "val"))
    sd = load_split(tmp_path, "val")
    assert sd.vqa[0].image.name == "COCO_val2014_000000000009.jpg"


@pytest.mark.parametrize("under", [False, True])
def test_coco_captions(tmp_path, under):
    write_coco(tmp_path, "val2014", under_annotations=under)
    assert find_splits(tmp_path) == ["val2014"]
    sd = load_split(tmp_path, "val2014")
    assert [c.caption for c in sd.captions] == ["A man riding a red bus.", "a bus on a street", "Two dogs on grass."]
    c = sd.captions[0]
    assert isinstance(c, CaptionRecord) and c.image_id == 42 and c.caption_id == 1
    assert c.image == tmp_path / "val2014" / "COCO_val2014_000000000042.jpg"


def test_coco_images_under_images_folder(tmp_path):
    write_coco(tmp_path, "train", image_dir="images/train")
    assert load_split(tmp_path, "train").captions[0].image.parent == tmp_path / "images" / "train"


def test_jsonl(tmp_path):
    write_image(tmp_path / "pics" / "a.png")
    write_jsonl(tmp_path / "train.jsonl", [
        {"image": "pics/a.png", "question": "what is it?", "answers": ["cat", "cat", "dog"]},
        {"image": "pics/a.png", "caption": "a cat on a mat"},
        {"image": "pics/a.png", "question": "is it big?", "answers": "yes", "question_id": 7},
    ])
    (tmp_path / "train.jsonl").write_text((tmp_path / "train.jsonl").read_text() + "\n\n")  # blank lines are fine
    assert find_splits(tmp_path) == ["train"]
    sd = load_split(tmp_path, "train")
    assert [r.question for r in sd.vqa] == ["what is it?", "is it big?"]
    assert sd.vqa[0].answers == ["cat", "cat", "dog"] and sd.vqa[0].multiple_choice_answer == "cat"
    assert sd.vqa[0].image == tmp_path / "pics" / "a.png" and sd.vqa[0].question_id == "train:1"
    assert sd.vqa[1].answers == ["yes"] and sd.vqa[1].question_id == 7
    assert sd.captions[0].caption == "a cat on a mat" and sd.captions[0].image_id == "pics/a.png"


def test_find_splits_mixed_and_merged(tmp_path):
    write_vqa(tmp_path, "train")
    write_coco(tmp_path, "train", under_annotations=True, image_dir="train")
    write_image(tmp_path / "x.png")
    write_jsonl(tmp_path / "extra.jsonl", [{"image": "x.png", "caption": "a red image"}])
    (tmp_path / "notes.json").write_text("{}")
    assert find_splits(tmp_path) == ["extra", "train"]
    sd = load_split(tmp_path, "train")
    assert len(sd.vqa) == 6 and len(sd.captions) == 3
    assert {t for t in corpus_texts(sd)} >= {"what color is the bus?", "maroon", "2", "Two dogs on grass."}
    with pytest.raises(DataError, match=r"no such data folder"):
        find_splits(tmp_path / "nothing")


def test_a_large_corpus_trains_the_tokenizer_on_an_even_sample_with_each_questions_own_answers(tmp_path):
    """Beyond `limit` questions + captions, every k-th question (with its answers) and every k-th caption."""
    records = [{"image": "a.png", "question": f"question {i}?", "answers": [f"answer {i}"]} for i in range(20)]
    records += [{"image": "a.png", "caption": f"caption {i}"} for i in range(10)]
    write_image(tmp_path / "a.png")
    write_jsonl(tmp_path / "train.jsonl", records)
    sd = load_split(tmp_path, "train")
    everything = list(corpus_texts(sd, limit=None))
    assert len(everything) == 20 * 2 + 10
    assert list(corpus_texts(sd, limit=30)) == everything  # at the limit: all of it
    sample = list(corpus_texts(sd, limit=10))  # 30 samples, 10 allowed: every 3rd
    assert sample == [t for i in range(0, 20, 3) for t in (f"question {i}?", f"answer {i}")] + \
        [f"caption {i}" for i in range(0, 10, 3)]


def test_unknown_split_lists_available(tmp_path):
    write_vqa(tmp_path, "train2014")
    write_coco(tmp_path, "val2014")
    with pytest.raises(DataError, match=r"no split 'test'.*train2014, val2014"):
        load_split(tmp_path, "test")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"splits found are: none"):
        load_split(tmp_path / "empty", "train")


def test_missing_images_counted_and_reported(tmp_path, capsys):
    write_vqa(tmp_path, "train", missing_images={1})
    write_coco(tmp_path, "train", missing={73})
    write_jsonl(tmp_path / "train.jsonl", [{"image": "gone.png", "caption": "x"}])
    sd = load_split(tmp_path, "train")
    assert len(sd.vqa) == 4 and len(sd.captions) == 2
    assert sd.skipped == {"question with a missing image": 2, "caption with a missing image": 1,
                          "line with a missing image": 1}
    err = capsys.readouterr().err
    assert err.startswith("warning:") and "2 question with a missing image" in err and len(err.splitlines()) == 1
    assert len(load_split(tmp_path, "train", check_images=False, quiet=True).vqa) == 6
    assert capsys.readouterr().err == ""


def test_questions_without_annotations_counted(tmp_path):
    data = write_vqa(tmp_path, "train", skip_annotation={9000, 25001})
    sd = load_split(tmp_path, "train", quiet=True)
    assert len(sd.vqa) == len(data["questions"]) - 2
    assert sd.skipped["question without annotation"] == 2
    assert "skipped 2: 2 question without annotation" in sd.report()


def test_missing_annotations_file(tmp_path):
    write_vqa(tmp_path, "test")
    (tmp_path / "v2_mscoco_test_annotations.json").unlink()
    with pytest.raises(DataError, match=r"v2_OpenEnded_mscoco_test_questions\.json: "
                                        r"no annotations file v2_mscoco_test_annotations\.json"):
        load_split(tmp_path, "test")
    sd = load_split(tmp_path, "test", require_answers=False)
    assert len(sd.vqa) == 6 and sd.vqa[0].answers == []


def test_empty_split(tmp_path):
    write_vqa(tmp_path, "train", missing_images={0, 1, 2})
    with pytest.raises(DataError, match=r"split 'train' has no usable records.*6 question with a missing image"):
        load_split(tmp_path, "train")


def test_malformed_json_names_file_line_column(tmp_path):
    write_vqa(tmp_path, "train")
    p = tmp_path / "v2_mscoco_train_annotations.json"
    p.write_text('{\n  "annotations": [\n    {"question_id": 1,,}\n  ]\n}')
    with pytest.raises(DataError, match=r"v2_mscoco_train_annotations\.json:3:23: malformed JSON"):
        load_split(tmp_path, "train")


def test_non_utf8_json(tmp_path):
    write_coco(tmp_path, "val")
    p = tmp_path / "captions_val.json"
    p.write_bytes(b'{"images": [],\n "annotations": [{"caption": "caf\xe9"}]}')
    with pytest.raises(DataError, match=r"captions_val\.json:2:\d+: not valid UTF-8 \(byte 0xe9\)"):
        load_split(tmp_path, "val")


def test_wrong_field_types_name_position(tmp_path):
    write_vqa(tmp_path, "train")
    q = tmp_path / "v2_OpenEnded_mscoco_train_questions.json"
    d = json.loads(q.read_text())
    del d["questions"][3]["image_id"]
    q.write_text(json.dumps(d))
    with pytest.raises(DataError, match=r"questions\.json: questions\[3\]: missing field 'image_id'"):
        load_split(tmp_path, "train")
    d["questions"][3]["image_id"] = 9
    d["questions"][2]["question"] = 5
    q.write_text(json.dumps(d))
    with pytest.raises(DataError, match=r"questions\[2\]: field 'question' must be str"):
        load_split(tmp_path, "train")
    q.write_text(json.dumps({"questions": {}}))
    with pytest.raises(DataError, match=r"expected a JSON object with a 'questions' list"):
        load_split(tmp_path, "train")


def test_empty_strings_in_official_files_are_counted(tmp_path):
    write_vqa(tmp_path, "train")
    q = tmp_path / "v2_OpenEnded_mscoco_train_questions.json"
    d = json.loads(q.read_text())
    d["questions"][0]["question"] = "  "
    q.write_text(json.dumps(d))
    write_coco(tmp_path, "train", image_dir="train")
    c = tmp_path / "captions_train.json"
    d = json.loads(c.read_text())
    d["annotations"][1]["caption"] = ""
    d["annotations"].append({"image_id": 999, "id": 9, "caption": "orphan"})
    c.write_text(json.dumps(d))
    sd = load_split(tmp_path, "train", quiet=True)
    assert sd.skipped == {"empty question": 1, "empty caption": 1, "caption of an image id not in 'images'": 1}


def test_empty_answers_of_official_files_are_kept_for_the_official_score(tmp_path):
    """VQA v2's own files hold some empty answers. They stay, so a question keeps its ten annotators and is
    scored by the official leave-one-out formula (3 matches of 10: 0.9), not the few-answers rule (3 of 9:
    1.0); training never targets them; a question whose answers are all empty is skipped and counted."""
    from vqa.evaluation.metrics import vqa_scores

    write_vqa(tmp_path, "train")
    a = tmp_path / "v2_mscoco_train_annotations.json"
    d = json.loads(a.read_text())
    ann = d["annotations"][0]
    ann["answers"] = [{"answer": x, "answer_id": i + 1} for i, x in enumerate(["cat"] * 3 + ["dog"] * 6 + [""])]
    d["annotations"][1]["answers"] = [{"answer": " ", "answer_id": i + 1} for i in range(10)]
    a.write_text(json.dumps(d))
    sd = load_split(tmp_path, "train", quiet=True)
    rec = next(r for r in sd.vqa if r.question_id == ann["question_id"])
    assert len(rec.answers) == 10 and rec.answers[-1] == ""
    assert vqa_scores({rec.question_id: "cat"}, [rec])["overall"] == 90.0
    assert sd.skipped["question with only empty answers"] == 1
    assert "" not in set(corpus_texts(sd))


BAD_LINES = [
    ('{"question": "q?", "answers": ["a"]}', r"train\.jsonl:2: missing field 'image'"),
    ('{"image": "", "caption": "c"}', r"train\.jsonl:2: field 'image' must be a non-empty string"),
    ('{"image": "a.png", "question": "what?"}', r"train\.jsonl:2: field 'question' without 'answers'"),
    ('{"image": "a.png", "question": " ", "answers": ["x"]}', r"train\.jsonl:2: field 'question' must be a non-empty"),
    ('{"image": "a.png", "question": "q?", "answers": []}',
     r"train\.jsonl:2: field 'answers' must be a non-empty list"),
    ('{"image": "a.png", "question": "q?", "answers": ["", "x"]}', r"train\.jsonl:2: field 'answers'\[0\]"),
    ('{"image": "a.png", "caption": ""}', r"train\.jsonl:2: field 'caption' must be a non-empty string"),
    ('{"image": "a.png", "answers": ["x"]}', r"train\.jsonl:2: needs a 'question'"),
    ('{"image": "a.png"}', r"train\.jsonl:2: needs a 'question' \(with 'answers'\) or a 'caption'"),
    ('["a.png", "caption"]', r"train\.jsonl:2: expected a JSON object, got list"),
    ('{"image": "a.png", "caption": "c"', r"train\.jsonl:2:\d+: malformed JSON"),
    ('{"image": "a.png", "question": "q?", "answers": ["x"], "question_id": [7]}',
     r"train\.jsonl:2: field 'question_id' must be an integer or a string"),
]


def test_jsonl_repeated_question_id_names_both_lines(tmp_path):
    # evaluation keys answers by question id: a repeat would score one answer for both questions
    write_image(tmp_path / "a.png")
    write_jsonl(tmp_path / "val.jsonl", [{"image": "a.png", "question": "q1?", "answers": ["x"], "question_id": 7},
                                         {"image": "a.png", "caption": "c"},
                                         {"image": "a.png", "question": "q2?", "answers": ["y"], "question_id": 7}])
    with pytest.raises(DataError, match=r"val\.jsonl:3: question_id 7 is also on line 1"):
        load_split(tmp_path, "val")


@pytest.mark.parametrize("line,message", BAD_LINES)
def test_jsonl_bad_lines(tmp_path, line, message):
    write_image(tmp_path / "a.png")
    write_jsonl(tmp_path / "train.jsonl", [{"image": "a.png", "caption": "fine"}, line])
    with pytest.raises(DataError, match=message):
        load_split(tmp_path, "train")


def test_jsonl_non_utf8_names_line(tmp_path):
    write_image(tmp_path / "a.png")
    p = tmp_path / "train.jsonl"
    p.write_bytes(b'{"image": "a.png", "caption": "ok"}\n{"image": "a.png", "caption": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"train\.jsonl:2:\d+: not valid UTF-8"):
        load_split(tmp_path, "train")
