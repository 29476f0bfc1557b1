"""The Predictor on a trained tiny checkpoint: answers, top-k, ranking, captions, batching, the encoding cache,
attention maps and heatmaps, bad input; and the `vqa ask` / `vqa caption` commands."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from predict_fixtures import COLOR_Q, ITEMS, SHAPE_Q, draw, shared_checkpoint, write_pictures

from vqa.device import pick_device
from vqa.errors import CheckpointError, ConfigError, InputError
from vqa.inference.heatmaps import attention_heatmap, letterbox_box, select_map, upsample_map
from vqa.inference.predict import Predictor


@pytest.fixture(scope="module")
def ckpt():
    return shared_checkpoint()


@pytest.fixture(scope="module")
def pred(ckpt):
    return Predictor.from_pretrained(ckpt, device="cpu")


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    return write_pictures(tmp_path_factory.mktemp("pictures"))


# ---------------------------------------------------------------- loading


def test_from_pretrained_loads_model_tokenizer_card_and_picks_a_device(ckpt, pred):
    assert pred.card["preset"] == "test-tiny" and pred.card["parameters"] == pred.model.num_parameters()
    assert not pred.model.training and pred.device == torch.device("cpu")
    assert pred.grid == 4 and pred.transform.size == 32
    assert pick_device("cpu") == torch.device("cpu")  # the device asked for
    assert Predictor.from_pretrained(ckpt.parent).path == ckpt.parent  # a run folder holding the checkpoint
    with pytest.raises(CheckpointError, match="does not exist"):
        Predictor.from_pretrained(ckpt.parent / "nowhere")


# ---------------------------------------------------------------- answers


@pytest.mark.parametrize("name", list(ITEMS))
def test_answers_the_trained_questions_from_a_path_a_pil_image_and_an_array(pred, pictures, name):
    colour, shape, _ = ITEMS[name]
    img = draw(name)
    assert pred.answer(pictures[name], COLOR_Q).answer == colour
    assert pred.answer(img, SHAPE_Q).answer == shape
    assert pred.answer(np.asarray(img), COLOR_Q).answer == colour


def test_top_k_is_sorted_probabilities_sum_to_at_most_one_and_the_answer_comes_first(pred):
    res = pred.answer(draw("red_circle"), COLOR_Q, top_k=3)
    assert res.answer == "red" and res.top_k[0][0] == "red"
    assert 1 <= len(res.top_k) <= 3 and len({a for a, _ in res.top_k}) == len(res.top_k)
    probs = [p for _, p in res.top_k]
    assert probs == sorted(probs, reverse=True)
    assert all(0 < p <= 1 for p in probs) and sum(probs) <= 1 + 1e-6
    assert probs[0] > 0.5  # overfit: the model is sure
    assert pred.answer(draw("red_circle"), COLOR_Q, top_k=1).top_k[0][0] == "red"
    d = res.to_dict()
    assert d["answer"] == "red" and d["top_k"][0]["answer"] == "red" and d["truncated"] is False
    json.dumps(d)


def test_rank_puts_the_right_candidate_first_with_probabilities_summing_to_one(pred):
    for name in ITEMS:
        colour, shape, _ = ITEMS[name]
        ranked = pred.rank(draw(name), COLOR_Q, ["green", "red", "blue"])
        assert ranked[0][0] == colour
        assert sum(p for _, p in ranked) == pytest.approx(1.0, abs=1e-5)
        assert [p for _, p in ranked] == sorted((p for _, p in ranked), reverse=True)
        assert pred.rank(draw(name), SHAPE_Q, ["square", "circle", "triangle"])[0][0] == shape


@pytest.mark.parametrize("cuda, mps, want", [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")])
def test_pick_device_prefers_cuda_then_mps_then_the_cpu(monkeypatch, cuda, mps, want):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2 if cuda else 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    assert pick_device() == pick_device("auto") == pick_device(None) == torch.device(want)
    if cuda:
        assert pick_device("cuda:1") == torch.device("cuda:1")  # a name given is used as given
    else:  # a GPU this machine lacks is refused before anything loads (tests/test_device_errors.py)
        with pytest.raises(ConfigError, match="--device cuda:1: no CUDA GPU is available here"):
            pick_device("cuda:1")


def _teacher_forced_log_prob(pred, image, prompt_ids, ids) -> float:
    """The reference: the model's log-probability of `ids` then <eos> after `prompt_ids`, in one
    teacher-forced pass (logits at position p score token p+1)."""
    seq = torch.tensor([[*prompt_ids, *ids, pred.tokenizer.eos_id]])
    with torch.no_grad():
        logp = pred.model.teacher_forced(pred.transform(pred.load(image))[None], seq).logits.log_softmax(-1)[0]
    return sum(float(logp[p - 1, seq[0, p]]) for p in range(len(prompt_ids), seq.shape[1]))


def test_captions_greedy_beam_and_seeded_sampling(pred):
    for name in ITEMS:
        cap = ITEMS[name][2]
        assert pred.caption(draw(name)).caption == cap
        beam = pred.caption(draw(name), method="beam", num_beams=3)
        assert beam.beams and beam.caption == beam.beams[0][0]
        # the beam's log-probability is its caption's, <eos> included, as a teacher-forced pass scores it
        assert beam.log_prob == pytest.approx(
            _teacher_forced_log_prob(pred, draw(name), beam.prompt_ids, beam.ids), abs=1e-4)
        # best first, as beam search ranks them: log-probability / (tokens incl. <eos>) ** length_penalty
        lp = pred.caption_settings(changes=dict(method="beam", num_beams=3)).length_penalty
        ranked = [s / (len(pred.tokenizer.encode(c)) + 1) ** lp for c, s in beam.beams]
        assert beam.beams[0][1] == beam.log_prob and ranked == sorted(ranked, reverse=True)
    # hot sampling from the overfit model: a seed gives one caption every time, other seeds other captions
    hot = dict(method="sample", temperature=3.0)
    a = pred.caption(draw("red_circle"), seed=3, **hot)
    b = pred.caption(draw("red_circle"), seed=3, **hot)
    assert a.caption == b.caption and a.log_prob == b.log_prob
    others = {pred.caption(draw("red_circle"), seed=s, **hot).caption for s in range(4, 10)}
    assert len(others | {a.caption}) > 1, others
    json.dumps(a.to_dict())


def test_batched_equals_one_by_one(pred):
    imgs = [draw("red_circle"), draw("blue_square"), draw("red_circle"), draw("blue_square")]
    qs = [COLOR_Q, SHAPE_Q, SHAPE_Q, COLOR_Q]
    batched = pred.answer_batch(imgs, qs, top_k=2)
    single = [pred.answer(i, q, top_k=2) for i, q in zip(imgs, qs, strict=True)]
    assert [r.answer for r in batched] == [r.answer for r in single] == ["red", "square", "circle", "blue"]
    for rb, rs in zip(batched, single, strict=True):
        assert [a for a, _ in rb.top_k] == [a for a, _ in rs.top_k]
        assert [p for _, p in rb.top_k] == pytest.approx([p for _, p in rs.top_k], abs=1e-4)
    caps = pred.caption_batch([draw("blue_square"), draw("red_circle")])
    assert [c.caption for c in caps] == [pred.caption(draw(n)).caption for n in ("blue_square", "red_circle")]
    # one image for many questions
    assert [r.answer for r in pred.answer_batch(draw("blue_square"), [COLOR_Q, SHAPE_Q])] == ["blue", "square"]


def test_a_second_question_about_the_same_image_reuses_its_encoding(pred, pictures, monkeypatch):
    pred.encodings.clear()
    calls = []
    real = pred.model.encode
    monkeypatch.setattr(pred.model, "encode", lambda x: calls.append(x.shape[0]) or real(x))
    pred.answer(pictures["red_circle"], COLOR_Q)
    pred.answer(pictures["red_circle"], SHAPE_Q, top_k=3)
    pred.answer(Image.open(pictures["red_circle"]), COLOR_Q)  # the same picture from another source
    pred.rank(pictures["red_circle"], COLOR_Q, ["red", "blue"])
    pred.caption(pictures["red_circle"])
    assert calls == [1]
    # a batch encodes each distinct image once, in one call, and reuses cached ones
    pred.answer_batch([draw("blue_square"), draw("red_circle"), draw("blue_square")], [COLOR_Q] * 3)
    assert calls == [1, 1]
    # the cache is bounded (LRU)
    for i in range(pred.cache_size + 2):
        pred.answer(Image.new("RGB", (40, 30), (i * 20, 100, 100)), COLOR_Q)
    assert len(pred.encodings) == pred.cache_size


# ---------------------------------------------------------------- attention


def test_attention_maps_per_generated_token_over_the_patch_grid(pred):
    res = pred.answer(draw("blue_square"), COLOR_Q, return_attention=True)
    cfg = pred.cfg
    assert res.attention.shape == (len(res.tokens), cfg.dec_depth, cfg.dec_heads, 4, 4)
    sums = res.attention.sum((-1, -2))  # the CLS token is dropped: each map sums to at most 1
    assert torch.all(sums <= 1 + 1e-5) and torch.all(sums > 0)
    words = res.words()
    assert [w for w, _ in words] == ["blue"] and words[0][1].shape == (cfg.dec_depth, cfg.dec_heads, 4, 4)
    cap = pred.caption(draw("blue_square"), return_attention=True)
    assert cap.attention.shape[0] == len(cap.tokens) and [w for w, _ in cap.words()] == ["a", "blue", "square"]
    assert pred.answer(draw("blue_square"), COLOR_Q).attention is None


def test_attention_maps_of_a_padded_batch_equal_each_rows_alone(pred):
    """The maps' teacher-forced pass (the written-out attention under `vqa.model.masks.causal_mask`, as in the
    explain path) over prompts of different lengths padded into one batch gives each row its own maps."""
    imgs, qs = [draw("red_circle"), draw("blue_square"), draw("blue_square")], [COLOR_Q, SHAPE_Q, "is it?"]
    batched = pred.answer_batch(imgs, qs, return_attention=True)
    assert len({len(r.prompt_ids) + len(r.ids) for r in batched}) > 1  # rows of different lengths: padding
    for res, img, q in zip(batched, imgs, qs, strict=True):
        alone = pred.answer(img, q, return_attention=True)
        assert res.ids == alone.ids
        torch.testing.assert_close(res.attention, alone.attention, atol=1e-5, rtol=1e-4)
        # its own copy: a view would keep the batch's maps of every row and prompt token alive with each result
        assert res.attention.untyped_storage().nbytes() == res.attention.numel() * res.attention.element_size()


def test_heatmap_has_the_image_size_and_follows_the_letterbox():
    grid = 4
    maps = torch.zeros(2, 3, grid, grid)
    maps[1, 2, 1, 0] = 1.0  # layer 1, head 2 looks at the second patch row, first column only
    wide = Image.new("RGB", (200, 100), (128, 128, 128))
    out = attention_heatmap(wide, maps, layer=1, head=2, image_size=32)
    assert out.size == wide.size and out.mode == "RGB"
    # a 2:1 picture fills rows 8..24 of the 32 px square, i.e. patch rows 1 and 2: patch (1, 0) covers the
    # picture's top-left quarter (x 0..50, y 0..50)
    assert letterbox_box(200, 100, 32) == (0.0, 8.0, 32.0, 24.0)
    arr = np.asarray(out).astype(int)
    hot, cold = arr[25, 25], arr[90, 190]  # turbo: high = red; low attention lets the grey picture show
    assert hot[0] > hot[2] + 50 and all(abs(c - 128) < 40 for c in cold)
    # the map is cropped to the picture: patch row 0 lies wholly in the padding above it, row 1 fills its top half
    up = upsample_map(maps[1, 2].numpy(), 200, 100, 32)
    assert up.shape == (100, 200) and up[25, 10] == pytest.approx(1.0, abs=0.05) and up[80:, :].max() < 0.05
    pad = torch.zeros(grid, grid)
    pad[0, 0] = 1.0
    up = upsample_map(pad.numpy(), 200, 100, 32)
    assert up.max() <= 0.55 and up[25:].max() < 0.01  # only bilinear bleed into the picture's top edge
    # a tall picture: the padding is left and right instead
    assert letterbox_box(50, 100, 32) == (8.0, 0.0, 24.0, 32.0)
    tall = np.zeros((grid, grid), np.float32)
    tall[:, 1] = 1.0  # patch column 1 = the picture's left half
    up = upsample_map(tall, 50, 100, 32)
    assert up[50, 12] == pytest.approx(1.0, abs=0.05) and up[50, 45] < 0.01
    # averaging over layers and heads, and a plain [grid, grid] map, work too
    assert attention_heatmap(wide, maps, image_size=32).size == wide.size
    assert attention_heatmap(wide, maps[1, 2], image_size=32).size == wide.size
    assert select_map(maps).shape == (grid, grid)
    with pytest.raises(InputError, match="layer 5 does not exist"):
        select_map(maps, layer=5)


def test_heatmap_on_the_predictor_output_matches_the_input_size(pred):
    img = draw("red_circle", size=(123, 77))
    res = pred.answer(img, COLOR_Q, return_attention=True)
    heat = attention_heatmap(img, res.words()[0][1], image_size=pred.cfg.vit_image_size)
    assert heat.size == (123, 77)


# ---------------------------------------------------------------- bad input


def test_bad_questions(pred):
    img = draw("red_circle")
    for q in ("", "   \n"):
        with pytest.raises(InputError, match="the question is empty"):
            pred.answer(img, q)
    with pytest.raises(InputError, match="must be text"):
        pred.answer(img, None)
    long = pred.answer(img, "what color " * 1000)
    assert long.truncated and long.answer  # cut to fit, still answered
    assert not pred.answer(img, COLOR_Q).truncated
    for q in ("what color is the shape? 🙂🎨", "ما لون الشكل؟", "מה הצבע?"):
        assert isinstance(pred.answer(img, q).answer, str)  # unknown characters become <unk>
    with pytest.raises(InputError, match="no candidate"):
        pred.rank(img, COLOR_Q, [])
    with pytest.raises(InputError, match="non-empty"):
        pred.rank(img, COLOR_Q, ["red", " "])
    with pytest.raises(InputError, match="top_k must be at least 1"):
        pred.answer(img, COLOR_Q, top_k=0)
    with pytest.raises(InputError, match="unknown decoding method"):
        pred.caption(img, method="beam_sample")
    with pytest.raises(InputError, match="top_p"):
        pred.caption(img, method="sample", top_p=0)
    with pytest.raises(InputError, match="num_beams=2 cannot return top_k=3"):
        pred.answer(img, COLOR_Q, top_k=3, num_beams=2)


def test_bad_images(pred, tmp_path, monkeypatch):
    with pytest.raises(InputError, match="no image"):
        pred.answer(None, COLOR_Q)
    text = tmp_path / "notes.png"
    text.write_text("not a picture")
    with pytest.raises(InputError, match="not an image"):
        pred.answer(text, COLOR_Q)
    with pytest.raises(InputError, match="not found"):
        pred.answer(tmp_path / "missing.png", COLOR_Q)
    import vqa.data.images as images

    monkeypatch.setattr(images, "MAX_PIXELS", 1000)
    with pytest.raises(InputError, match="over the limit"):
        pred.answer(Image.new("RGB", (100, 100)), COLOR_Q)
    small = Predictor(pred.model, pred.tokenizer, pred.card, max_pixels=500)
    monkeypatch.setattr(images, "MAX_PIXELS", 64_000_000)
    with pytest.raises(InputError, match="over the limit"):
        small.answer(Image.new("RGB", (30, 30)), COLOR_Q)


# ---------------------------------------------------------------- CLI


def test_cli_ask_and_caption(ckpt, pictures, capsys):
    from vqa.cli import main

    assert main(["ask", "--checkpoint", str(ckpt), str(pictures["red_circle"]), COLOR_Q]) == 0
    assert capsys.readouterr().out.strip() == "red"
    assert main(["ask", "--checkpoint", str(ckpt), str(pictures["blue_square"]), SHAPE_Q,
                 "--top-k", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["answer"] == "square" and out["top_k"][0]["answer"] == "square" and len(out["top_k"]) <= 3
    assert main(["ask", "--checkpoint", str(ckpt), str(pictures["blue_square"]), SHAPE_Q, "--top-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "square" and "square" in lines[1] and "%" in lines[1]
    assert main(["caption", "--checkpoint", str(ckpt), str(pictures["blue_square"])]) == 0
    assert capsys.readouterr().out.strip() == "a blue square"
    assert main(["caption", "--checkpoint", str(ckpt), str(pictures["red_circle"]), "--method", "beam",
                 "--num-beams", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["caption"] and len(out["beams"]) == 3
    sample = ["caption", "--checkpoint", str(ckpt), str(pictures["red_circle"]), "--method", "sample",
              "--temperature", "3", "--seed", "1", "--json"]
    assert main(sample) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(sample) == 0
    assert json.loads(capsys.readouterr().out) == first  # the seed reaches the sampler
    # on ask, --top-k counts answers and sampling's top-k is --sample-top-k (sampling gives one answer: --top-k
    # 2 with it is refused, tests/test_ask_checks.py)
    assert main(["ask", "--checkpoint", str(ckpt), str(pictures["red_circle"]), COLOR_Q, "--top-k", "1",
                 "--method", "sample", "--temperature", "3", "--sample-top-k", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["answer"] == "red" and len(out["top_k"]) == 1  # one sample, the only token kept each step


def test_cli_errors_are_one_clear_line(ckpt, pictures, tmp_path, capsys):
    from vqa.cli import main

    assert main(["ask", "--checkpoint", str(ckpt), str(pictures["red_circle"]), "  "]) == 2
    assert "the question is empty" in capsys.readouterr().err
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"\x00" * 10)
    assert main(["caption", "--checkpoint", str(ckpt), str(bad)]) == 1
    assert "not an image" in capsys.readouterr().err
    assert main(["caption", "--checkpoint", str(tmp_path / "none"), str(pictures["red_circle"])]) == 1
    assert "vqa data shapes --out data/shapes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["caption", "--checkpoint", str(ckpt), str(bad), "--method", "nucleus"])
    assert "invalid choice: 'nucleus'" in capsys.readouterr().err
    assert main(["caption", "--checkpoint", str(ckpt), str(pictures["red_circle"]), "--method", "sample",
                 "--top-p", "1.5"]) == 2
    err = capsys.readouterr().err
    assert "top_p must be in (0, 1]" in err and "Traceback" not in err
