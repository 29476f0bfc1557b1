"""The standard protocols' files as data sources: the Karpathy split file, TextVQA, VizWiz and GQA's balanced
questions, each written here in its official layout."""

import json

import pytest
from data_fixtures import write_image

from vqa.data.readers.formats import find_splits, load_split
from vqa.errors import DataError
from vqa.evaluation.metrics import vqa_scores


def _karpathy(root):
    images = [
        dict(filepath="train2014", filename="COCO_train2014_000000000009.jpg", imgid=0, split="train", cocoid=9,
             sentids=[1], sentences=[dict(tokens=["a", "dog"], raw="A dog.", imgid=0, sentid=1)]),
        dict(filepath="val2014", filename="COCO_val2014_000000000042.jpg", imgid=1, split="restval", cocoid=42,
             sentids=[2], sentences=[dict(tokens=["a", "cat"], raw="A  cat ", imgid=1, sentid=2)]),
        dict(filepath="val2014", filename="COCO_val2014_000000000073.jpg", imgid=2, split="val", cocoid=73,
             sentids=[3], sentences=[dict(tokens=["a", "bus"], raw="A bus", imgid=2, sentid=3)]),
        dict(filepath="val2014", filename="COCO_val2014_000000000074.jpg", imgid=3, split="test", cocoid=74,
             sentids=[4, 5, 6], sentences=[dict(tokens=["a", "red", "car"], raw="A red car.", imgid=3, sentid=4),
                                           dict(tokens=[], raw=" ", imgid=3, sentid=5),
                                           dict(tokens=["a", "car"], raw="a car", imgid=3, sentid=6)]),
        dict(filepath="val2014", filename="COCO_val2014_000000000099.jpg", imgid=4, split="test", cocoid=99,
             sentids=[7], sentences=[dict(tokens=["gone"], raw="gone", imgid=4, sentid=7)]),  # no image file
    ]
    for im in images[:4]:
        write_image(root / im["filepath"] / im["filename"])
    (root / "dataset_coco.json").write_text(json.dumps({"images": images, "dataset": "coco"}))


def test_karpathy_splits_train_with_restval_val_and_test(tmp_path):
    _karpathy(tmp_path)
    assert find_splits(tmp_path) == ["test", "train", "val"]
    train = load_split(tmp_path, "train", quiet=True)
    assert sorted(train.captions.caption) == ["A cat", "A dog."]  # restval belongs to the training split
    test = load_split(tmp_path, "test", quiet=True)
    assert [(r.image_id, r.caption, r.caption_id) for r in test.captions] == [(74, "A red car.", 4), (74, "a car", 6)]
    assert test.skipped == {"empty caption": 1, "caption with a missing image": 1}
    assert {p.name for p in test.images()} == {"COCO_val2014_000000000074.jpg"}
    assert len(load_split(tmp_path, "val").captions) == 1


def test_karpathy_file_without_sentences_names_the_image(tmp_path):
    (tmp_path / "dataset_coco.json").write_text(json.dumps({"images": [{"filename": "a.jpg", "split": "test"}]}))
    with pytest.raises(DataError, match=r"dataset_coco.json: images\[0\]: missing field 'sentences'"):
        load_split(tmp_path, "test")


def test_textvqa(tmp_path):
    write_image(tmp_path / "train_images" / "003a8ae2ef43b901.jpg")
    answers = ["nous les gosses"] * 6 + ["dakota"] * 2 + ["nous"] * 2
    data = [dict(question="what is the brand?", image_id="003a8ae2ef43b901", image_classes=["Vehicle"],
                 flickr_original_url="", flickr_300k_url="", image_width=1024, image_height=664, answers=answers,
                 question_tokens=["what", "is", "the", "brand"], question_id=34602, set_name="val"),
            dict(question="what time is it?", image_id="ffffffffffffffff", answers=["10"] * 10, question_id=34603,
                 set_name="val")]
    (tmp_path / "TextVQA_0.5.1_val.json").write_text(json.dumps(
        dict(dataset_type="val", dataset_name="textvqa", dataset_version="0.5.1", data=data)))
    (tmp_path / "TextVQA_0.5.1_test.json").write_text(json.dumps(
        dict(dataset_type="test", data=[dict(question="what?", image_id="003a8ae2ef43b901", question_id=1)])))
    write_image(tmp_path / "test_images" / "003a8ae2ef43b901.jpg")
    assert find_splits(tmp_path) == ["test", "val"]
    sd = load_split(tmp_path, "val", quiet=True)
    (r,) = list(sd.vqa)
    assert (r.question_id, r.image_id, r.question, r.multiple_choice_answer) == (
        34602, "003a8ae2ef43b901", "what is the brand?", "nous les gosses")
    assert sd.skipped == {"question with a missing image": 1}
    assert vqa_scores({34602: "dakota"}, [r])["overall"] == 60.0  # two annotators of ten
    test = load_split(tmp_path, "test", require_answers=False)
    assert test.vqa[0].answers == [] and test.vqa[0].image.parent.name == "test_images"
    with pytest.raises(DataError, match="no usable records"):
        load_split(tmp_path, "test", quiet=True)


def test_vizwiz(tmp_path):
    write_image(tmp_path / "val" / "VizWiz_val_00000000.jpg")
    write_image(tmp_path / "val" / "VizWiz_val_00000001.jpg")
    ans = [dict(answer=a, answer_confidence="yes") for a in ["unanswerable"] * 7 + ["blue"] * 3]
    rows = [dict(image="VizWiz_val_00000000.jpg", question="What color is this?", answers=ans,
                 answer_type="unanswerable", answerable=0),
            dict(image="VizWiz_val_00000001.jpg", question="", answers=ans, answer_type="other", answerable=1)]
    (tmp_path / "Annotations").mkdir()
    (tmp_path / "Annotations" / "val.json").write_text(json.dumps(rows))
    (tmp_path / "Annotations" / "notes.json").write_text("[]")
    assert find_splits(tmp_path) == ["val"]
    sd = load_split(tmp_path, "val", quiet=True)
    (r,) = list(sd.vqa)
    assert (r.question_id, r.image_id, r.answer_type, r.multiple_choice_answer) == (
        "VizWiz_val_00000000.jpg", "VizWiz_val_00000000", "unanswerable", "unanswerable")
    assert sd.skipped == {"empty question": 1}
    assert vqa_scores({r.question_id: "blue"}, [r])["per_answer_type"] == {"unanswerable": 90.0}


def test_a_train_json_that_is_not_vizwiz_is_no_split(tmp_path):
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "train.json").write_text(json.dumps([{"image": "x.jpg", "question": "q"}]))
    assert find_splits(tmp_path) == []


def test_gqa_balanced_questions(tmp_path):
    write_image(tmp_path / "images" / "n161313.jpg")
    q = {"201307251": dict(semantic=[], entailed=[], equivalent=["201307251"], question="Is it overcast?",
                           imageId="n161313", isBalanced=True, groups=dict(**{"global": None, "local": "08c"}),
                           answer="no", semanticStr="verify weather", annotations={}, fullAnswer="No, it is clear.",
                           types=dict(structural="verify", semantic="global", detailed="weatherVerifyC")),
         "201640614": dict(question="Who is wearing the dress?", imageId="n161313", answer="woman",
                           types=dict(structural="query", semantic="rel", detailed="relS"), fullAnswer=""),
         "201640615": dict(question="What is it?", imageId="n000000", answer="cat",
                           types=dict(structural="query", semantic="obj", detailed="objS"))}
    (tmp_path / "testdev_balanced_questions.json").write_text(json.dumps(q))
    assert find_splits(tmp_path) == ["testdev"]
    sd = load_split(tmp_path, "testdev", quiet=True)
    assert [(r.question_id, r.answers, r.answer_type, r.question_type) for r in sd.vqa] == [
        ("201307251", ["no"], "verify", "weatherVerifyC"), ("201640614", ["woman"], "query", "relS")]
    assert sd.skipped == {"question with a missing image": 1}
    # one answer: exact match, GQA's accuracy
    s = vqa_scores({"201307251": "no", "201640614": "women"}, list(sd.vqa))
    assert s["per_answer_type"] == {"verify": 100.0, "query": 0.0}


def test_gqa_question_without_image_id_is_named(tmp_path):
    (tmp_path / "val_balanced_questions.json").write_text(json.dumps({"7": {"question": "q?", "answer": "a"}}))
    with pytest.raises(DataError, match=r"question '7': missing field 'imageId'"):
        load_split(tmp_path, "val")
