"""Things scenes of the pretraining corpus (`vqa pretrain --things DIR`): a things folder is checked with
one-line errors; a corpus with things is byte-identical for a seed, draws each thing inside its box, every
answer follows from the scene, and the grounding loss finds the things its words name;
scripts/make_things.py makes a folder from the emoji packages' layout."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from vqa.data.dataset import ImageTextDataset
from vqa.data.regions import Regions, box_cover
from vqa.data.sources import open_split
from vqa.data.synthetic import corpus_things, generator
from vqa.data.synthetic import things as things_lib
from vqa.data.synthetic.corpus import CORPUS_SET
from vqa.data.synthetic.corpus_layout import BACKGROUNDS
from vqa.data.transforms import build_transform
from vqa.errors import ConfigError, DataError
from vqa.tokenizer import Tokenizer
from vqa.train.pretrain import build_corpus
from vqa.weights import shipped

SIDE = 64
ROOT = Path(__file__).resolve().parents[1]
PURE = ((255, 0, 255), (0, 255, 0), (255, 255, 0), (0, 0, 255), (255, 0, 0))  # far from every background
DRAW = {"dog": "ellipse", "cat": "rectangle", "bus": "pieslice", "tree": "chord"}


def _picture(path: Path, how: str, colour) -> None:
    im = Image.new("RGBA", (64, 48), (0, 0, 0, 0))  # transparent all round: the loader crops to the opaque part
    getattr(ImageDraw.Draw(im), how)((10, 6, 54, 42), fill=colour, **({"start": 0, "end": 270}
                                                                         if how in ("pieslice", "chord") else {}))
    im.save(path)


def make_things(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for k, (name, how) in enumerate(DRAW.items()):
        for artist in range(2):
            file = f"{name}-{artist}.png"
            _picture(folder / file, how, (*PURE[(k + artist) % len(PURE)], 255))
            rows.append(dict(file=file, name=name))
    (folder / "things.json").write_text(json.dumps(dict(things=rows)))
    return folder


@pytest.fixture(scope="module")
def things_dir(tmp_path_factory):
    return make_things(tmp_path_factory.mktemp("things") / "things")


def _build(out: Path, things: Path, share=0.5, seed=3, n=40):
    generator.generate(corpus_things.with_things(things, share), out, n, 6, size=SIDE, seed=seed, progress=False,
                       workers=1)
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, things_dir):
    return _build(tmp_path_factory.mktemp("corpus") / "c", things_dir)


def _split(folder: Path, split="train"):
    scenes = {s["image_id"]: s for s in json.loads((folder / f"corpus_{split}_scenes.json").read_text())["scenes"]}
    qs = json.loads((folder / f"v2_OpenEnded_mscoco_{split}_questions.json").read_text())["questions"]
    anns = json.loads((folder / f"v2_mscoco_{split}_annotations.json").read_text())["annotations"]
    caps = json.loads((folder / f"captions_{split}.json").read_text())["annotations"]
    return scenes, list(zip(qs, anns, strict=True)), caps


def test_a_things_folder_is_checked_with_errors_that_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="no things.json"):
        things_lib.load(str(tmp_path))
    bad = tmp_path / "bad"
    make_things(bad)
    index = bad / "things.json"
    good = index.read_text()
    cases = {"{not json": "not a things index", json.dumps({"things": [{"file": "dog-0.png"}]}): r"things\[0\] needs",
             json.dumps({"things": [{"file": "dog-0.png", "name": "hot dog"}]}): "not one lower-case word",
             json.dumps({"things": [{"file": "gone.png", "name": "dog"}, {"file": "cat-0.png", "name": "cat"}]}):
                 r"things\[0\] file gone.png is missing",
             json.dumps({"things": [{"file": "dog-0.png", "name": "dog"}]}): "at least 2"}
    for text, message in cases.items():
        index.write_text(text)
        things_lib.load.cache_clear()
        with pytest.raises(DataError, match=message):
            things_lib.load(str(bad))
    index.write_text(good)
    things_lib.load.cache_clear()
    assert things_lib.load(str(bad)).names == ("bus", "cat", "dog", "tree")
    (bad / "cat-1.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with pytest.raises(DataError, match="cat-1.png: not a readable picture"):
        things_lib.picture(str(bad), "cat-1.png")
    Image.new("RGBA", (8, 8), (0, 0, 0, 0)).save(bad / "cat-0.png")
    with pytest.raises(DataError, match="fully transparent"):
        things_lib.picture(str(bad), "cat-0.png")


def test_a_corpus_with_things_is_byte_identical_for_a_seed_and_mixes_both_kinds(corpus, things_dir, tmp_path):
    again = _build(tmp_path / "again", things_dir)
    digest = {p.relative_to(corpus).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
              for p in sorted(corpus.rglob("*")) if p.is_file()}
    assert digest == {p.relative_to(again).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
                      for p in sorted(again.rglob("*")) if p.is_file()}
    styles = [s["style"] == corpus_things.STYLE for s in _split(corpus)[0].values()]
    assert 0.25 < np.mean(styles) < 0.75  # share 0.5 of 40
    # the corpus without things is the corpus it always was: the mixing never touches its scenes
    plain = generator.make_scenes(CORPUS_SET, "train", 5, SIDE, 3)
    assert all(s["style"] != corpus_things.STYLE for s in plain)


def test_each_thing_is_drawn_inside_its_box(corpus, things_dir):
    spec = corpus_things.with_things(things_dir, 0.5)
    scenes = [s for s in generator.make_scenes(spec, "train", 40, SIDE, 3) if s["style"] == corpus_things.STYLE]
    assert [s["objects"] for s in scenes] == [s["objects"] for s in _split(corpus)[0].values()
                                              if s["style"] == corpus_things.STYLE]  # the boxes written
    for scene in scenes:
        alone = [dict(scene, objects=[o]) for o in scene["objects"]]
        for one, o in zip(alone, scene["objects"], strict=True):
            bare = np.asarray(corpus_things.render(dict(one, objects=[]), SIDE, str(things_dir)), np.int16)
            drawn = np.asarray(corpus_things.render(one, SIDE, str(things_dir)), np.int16)
            ys, xs = np.nonzero(np.abs(drawn - bare).sum(-1) > 60)
            x0, y0, x1, y1 = o["box"]
            assert len(xs) > 20
            assert xs.min() >= x0 - 1 and xs.max() <= x1 and ys.min() >= y0 - 1 and ys.max() <= y1, (o, xs, ys)
            assert 0 <= x0 < x1 <= SIDE and 0 <= y0 < y1 <= SIDE
    with pytest.raises(DataError, match="things scene"):
        CORPUS_SET.render(scenes[0], SIDE)  # the plain corpus cannot draw it: a one-line error


def test_every_answer_and_caption_of_a_things_scene_follows_from_it(corpus, things_dir):
    scenes, qa, caps = _split(corpus)
    rel = generator.relation_holds
    asked = set()
    for q, a in qa:
        scene = scenes[q["image_id"]]
        if scene["style"] != corpus_things.STYLE:
            continue
        objs, text, answer = scene["objects"], q["question"], a["multiple_choice_answer"]
        kinds = [o["kind"] for o in objs]
        asked.add(a["question_type"])
        if text in corpus_things.WHAT_Q:
            assert kinds == [answer]
        elif text in corpus_things.SIDE_Q.values():
            way = next(r for r, t in corpus_things.SIDE_Q.items() if t == text)
            i = kinds.index(answer)
            assert all(rel(objs[i], p, way, SIDE) for p in objs if p is not objs[i])
        elif text in corpus_things.BACKGROUND_Q:
            assert answer == scene["background"] and answer in BACKGROUNDS
        elif text in corpus_things.COUNT_Q:
            assert answer == str(len(objs))
        elif text.startswith(("is there a", "can you see a")):
            name = text.rstrip("?").split()[-1]
            assert name in DRAW and answer == ("yes" if name in kinds else "no")
        else:
            a_name, b_name = (w for w in text.rstrip("?").split() if w in kinds)
            way = next(r for r in corpus_things.RELATIONS if f" {r} " in text)
            assert answer == ("yes" if rel(objs[kinds.index(a_name)], objs[kinds.index(b_name)], way, SIDE)
                              else "no"), text
    assert asked >= {"attribute_shape", "attribute_color", "existence", "count", "spatial"}
    for c in caps:
        scene = scenes[c["image_id"]]
        if scene["style"] == corpus_things.STYLE and c["caption"].startswith("the "):  # a relation statement
            words = c["caption"].split()
            a, b = (next(o for o in scene["objects"] if o["kind"] == w) for w in (words[1], words[-1]))
            way = " ".join(words[3:-2])
            assert rel(a, b, way, SIDE), c["caption"]


def test_the_grounding_loss_finds_the_things_its_words_name(tmp_path, things_dir):
    folder = _build(tmp_path / "all", things_dir, share=1.0, n=24)
    model, tok, _ = shipped.load("tiny")
    cfg = model.cfg
    ds = ImageTextDataset(open_split(folder, "train"), tok, build_transform(cfg, train=False), cfg.dec_max_len,
                          questions_per_image=6, captions_per_image=4, train=True)
    regions = ds.maker.regions = Regions.of(folder, "train", tok, cfg.vit_image_size, cfg.grid)
    named = answered = 0
    for i in range(len(ds)):
        for row in ds[i]["rows"]:
            objs = regions.scenes.scenes[row["meta"]["image_id"]]["objects"]
            boxes = [box_cover([tuple(v * cfg.grid / SIDE for v in o["box"])], cfg.grid) for o in objs]
            answers = set(range(row["prompt_len"] - 1, len(row["input_ids"]) - 1)) if row["task"] == "vqa" else set()
            for at, target in zip(*row.get("regions", ([], [])), strict=True):
                if at in answers:  # "what is on the left?": the thing that is the answer
                    answered += 1
                    answer = row["meta"]["answers"][0]
                    assert np.allclose(target, boxes[[o["kind"] for o in objs].index(answer)])
                    continue
                named += 1  # the last piece of a thing's name, looking at that thing
                piece = tok.decode([row["input_ids"][at]]).strip()
                k = next(k for k, o in enumerate(objs) if o["kind"].endswith(piece))
                assert np.allclose(target, boxes[k])
    assert named >= 20 and answered >= 4, (named, answered)


def test_build_corpus_records_its_things_and_refuses_other_ones(tmp_path, things_dir):
    folder = tmp_path / "corpus"
    tok = build_corpus(folder, 12, 4, 0, workers=1, progress=False, things=things_dir, things_share=0.5)
    info = json.loads((folder / "corpus_info.json").read_text())
    assert info["things"] == dict(digest=things_lib.load(str(things_dir)).digest, share=0.5)
    assert Tokenizer.load(tok).encode("the dog is left of the cat")  # the things' words are in its text
    assert "▁dog" in json.loads(tok.read_text())["model"]["vocab"]
    assert build_corpus(folder, 12, 4, 0, workers=1, progress=False, things=things_dir, things_share=0.5) == tok
    with pytest.raises(ConfigError, match="things"):
        build_corpus(folder, 12, 4, 0, workers=1, progress=False, things=things_dir, things_share=0.3)
    with pytest.raises(ConfigError, match="things"):
        build_corpus(folder, 12, 4, 0, workers=1, progress=False)


def test_make_things_keeps_one_word_things_of_both_artists(tmp_path):
    gem = tmp_path / "gemojione"
    (gem / "config").mkdir(parents=True)
    (gem / "assets" / "png").mkdir(parents=True)
    emojify = tmp_path / "emojify"
    emojify.mkdir()
    index = {"dog2": dict(unicode="1f415", name="dog", shortname=":dog2:", category="nature"),
             "bus": dict(unicode="1f68c", name="bus", shortname=":bus:", category="travel"),
             "grin": dict(unicode="1f600", name="grinning", shortname=":grin:", category="symbols"),
             "tree": dict(unicode="1f333", name="deciduous tree", shortname=":tree:", category="nature")}
    (gem / "config" / "index.json").write_text(json.dumps(index))
    for e in index.values():
        _picture(gem / "assets" / "png" / f"{e['unicode'].upper()}.png", "ellipse", (200, 10, 10, 255))
    _picture(emojify / "dog2.png", "rectangle", (10, 10, 200, 255))
    out = tmp_path / "things"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_things.py"), "--gemojione", str(gem),
                          "--emojify", str(emojify), "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "3 pictures of 2 things" in run.stdout
    things = things_lib.load(str(out))
    assert things.files == {"bus": ("gemojione/1F68C.png",), "dog": ("gemojione/1F415.png", "emojify/dog2.png")}
    missing = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_things.py"), "--gemojione",
                              str(tmp_path / "nowhere"), "--out", str(out)], capture_output=True, text=True)
    assert missing.returncode != 0 and "index.json is missing" in missing.stderr


def test_vqa_data_corpus_and_vqa_pretrain_take_a_things_folder(tmp_path, things_dir, capsys):
    from vqa.cli import main

    out = tmp_path / "corpus"
    assert main(["data", "corpus", "--out", str(out), "--train", "10", "--val", "2", "--workers", "1",
                 "--no-progress", "--things", str(things_dir), "--things-share", "1"]) == 0
    scenes = json.loads((out / "corpus_train_scenes.json").read_text())["scenes"]
    assert {s["style"] for s in scenes} == {corpus_things.STYLE}
    assert main(["data", "corpus", "--out", str(tmp_path / "x"), "--things", str(things_dir),
                 "--things-share", "0"]) == 2
    assert "--things-share must be in (0, 1]" in capsys.readouterr().err
    run = tmp_path / "pre"
    assert main(["pretrain", "--out", str(run), "--max-steps", "1", "--images", "32", "--val-images", "2",
                 "--workers", "1", "--things", str(things_dir), "--things-share", "0.5"]) == 0
    card = json.loads((run / "pretrain.json").read_text())
    assert card["corpus"]["things"] == dict(folder=str(things_dir), share=0.5,
                                            digest=things_lib.load(str(things_dir)).digest)
    assert main(["pretrain", "--out", str(tmp_path / "none"), "--things", str(tmp_path / "nowhere")]) == 2
    assert "no things.json" in capsys.readouterr().err
