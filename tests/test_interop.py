"""`vqa import --transformers`: a VisionEncoderDecoderModel (ViTModel + GPT-2 with cross-attention) saved by
`transformers` itself is read into a VQAModel that computes what transformers computes (float32 logits within
1e-4, the same greedy and beam captions), and bad folders are refused in one line with nothing written. The
captions are compared exactly: the two implementations differ by float32 rounding only, and the tiny model's
random weights (std 0.2, hf_fixtures.save_tiny_ved) decide its greedy and beam choices by margins well above
that rounding, so they agree on every CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_fixtures import edit_json, images, load_ved, save_tiny_ved

from vqa.config import GenerationConfig
from vqa.decoding.generate import generate
from vqa.export.hf_import import import_transformers, read_source
from vqa.weights import checkpoint

pytest.importorskip("transformers")
# the model classes imported with the module, not in the first test: mutmut's fork server imports the test
# modules once, and each mutant's process would otherwise import them again (~4 s)
from transformers import GPT2Config, GPT2LMHeadModel, VisionEncoderDecoderModel, ViTConfig, ViTModel  # noqa: E402


@pytest.fixture(scope="module")
def ved(tmp_path_factory):
    """(folder, transformers model) with enc_to_dec_proj (widths 32 -> 48)."""
    folder = save_tiny_ved(tmp_path_factory.mktemp("ved") / "src")
    return folder, load_ved(folder)


@pytest.fixture(scope="module")
def ved_same_width(tmp_path_factory):
    """(folder, transformers model) without enc_to_dec_proj (both 32 wide), saved as an old pytorch_model.bin
    with the lm_head stored and no tokenizer.json (vocab.json + merges.txt only)."""
    folder = save_tiny_ved(tmp_path_factory.mktemp("ved1") / "src", dec_width=32, seed=3, bin_file=True,
                           tokenizer_json=False)
    return folder, load_ved(folder)


@pytest.fixture(scope="module")
def imported(ved, tmp_path_factory):
    out = import_transformers(ved[0], tmp_path_factory.mktemp("run") / "imported")
    return checkpoint.load(out)


def _logits_pair(folder, hf, model):
    x = images(3)
    ids = torch.randint(0, hf.config.decoder.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = hf(pixel_values=x, decoder_input_ids=ids).logits
        ours = model.teacher_forced(x, ids).logits
    return ours, theirs


def test_imported_logits_equal_transformers(ved, imported):
    model, tok, card = imported
    ours, theirs = _logits_pair(*ved, model)
    assert theirs.abs().max() > 1  # logits that vary: a wrong mapping cannot hide in the tolerance
    assert (ours - theirs).abs().max() < 1e-4
    assert model.cfg.vit_resize == "squash" and model.cfg.vit_resample == "bilinear"
    vit = model.vision.vit  # ViT's LayerNorm epsilon everywhere (timm's own is 1e-6)
    assert {m.eps for m in vit.modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-12}
    assert card["tasks"] == ["caption"]


def test_same_width_bin_and_vocab_merges_import(ved_same_width, tmp_path):
    folder, hf = ved_same_width
    cfg, state, tok = read_source(folder)
    assert torch.equal(state["vision.proj.weight"], torch.eye(32))  # no enc_to_dec_proj: the identity
    model, _, _ = checkpoint.load(import_transformers(folder, tmp_path / "run"))
    ours, theirs = _logits_pair(folder, hf, model)
    assert (ours - theirs).abs().max() < 1e-4
    from transformers import GPT2TokenizerFast

    ref = GPT2TokenizerFast.from_pretrained(str(folder))  # from vocab.json + merges.txt, as ours
    text = "a red circle, two Stars!"
    assert tok.encode(text) == ref(text)["input_ids"]


def _hf_generate(hf, x, **kw):
    with torch.no_grad():
        out = hf.generate(pixel_values=x, max_new_tokens=12, do_sample=False, **kw)
    end = hf.config.eos_token_id
    rows = []
    for row in out.tolist():
        row = row[1:]  # the start token
        rows.append(row[: row.index(end)] if end in row else row)  # vqa's sequences end before <eos>
    return rows


def _ours(model, tok, x, **kw):
    prompt = tok.caption_prompt()
    assert prompt == [model.cfg.bos_id]  # the start token alone, no vqa prompt tokens
    gen = generate(model, [prompt] * len(x), images=x, config=GenerationConfig(max_new_tokens=12, **kw))
    return [list(s) for s in gen.sequences]


def test_greedy_and_beam_captions_equal_transformers(ved, imported):
    folder, hf = ved
    model, tok, _ = imported
    x = images(4)
    greedy = _ours(model, tok, x)
    assert greedy == _hf_generate(hf, x)
    assert len({tuple(s) for s in greedy}) > 1  # images of different content, different captions
    beam = _ours(model, tok, x, method="beam", num_beams=4)
    assert beam == _hf_generate(hf, x, num_beams=4, early_stopping="never")
    assert beam != greedy


# ------------------------------------------------------------------------- the tensor names, both ways


def _ved_in_memory(enc_width: int, dec_width: int):
    """A VisionEncoderDecoderModel of odd sizes (2 ViT layers, 3 GPT-2 layers, ViT's MLP 56 wide and GPT-2's
    40, 10 image tokens), so that no two sizes or layer counts can stand in for each other."""
    torch.manual_seed(enc_width + dec_width)
    enc = ViTConfig(hidden_size=enc_width, num_hidden_layers=2, num_attention_heads=2, intermediate_size=56,
                    image_size=24, patch_size=8)
    dec = GPT2Config(n_embd=dec_width, n_layer=3, n_head=2, n_inner=40, vocab_size=50, n_positions=20,
                     add_cross_attention=True, is_decoder=True, bos_token_id=0, eos_token_id=0)
    return VisionEncoderDecoderModel(encoder=ViTModel(enc), decoder=GPT2LMHeadModel(dec))


@pytest.mark.parametrize("widths", [(24, 16), (16, 16)])
def test_the_layout_is_transformers_own_and_maps_back_to_the_same_tensors(widths, tmp_path):
    """hf_shapes lists exactly the tensors transformers' save_pretrained writes (less the ignored ones), with
    their shapes; hf_to_vqa then vqa_to_hf gives every one of them back unchanged (an identity projection, when the
    widths match, is left out) as tensors safetensors can write."""
    from safetensors.torch import load_file

    from vqa.export.hf_import import check_decoder, check_encoder
    from vqa.weights.hf_layout import IGNORED, hf_shapes, hf_to_vqa, vqa_to_hf

    hf = _ved_in_memory(*widths)
    hf.save_pretrained(tmp_path)  # the file layout, which every transformers version reads and writes
    theirs = {k: v for k, v in load_file(str(tmp_path / "model.safetensors")).items() if not IGNORED.fullmatch(k)}
    enc = check_encoder(hf.config.encoder.to_dict(), "test")
    dec = check_decoder(hf.config.decoder.to_dict(), "test")
    shapes = hf_shapes(enc, dec, 50)
    assert shapes == {k: tuple(v.shape) for k, v in theirs.items()}
    assert all(type(n) is int for s in shapes.values() for n in s)  # 17.0 == 17, but an error line prints it
    ours = hf_to_vqa(theirs, 2, 3, widths[1])
    assert ours["vision.vit.blocks.1.attn.qkv.weight"].shape == (3 * widths[0], widths[0])
    assert ours["decoder.blocks.2.cross_attn.kv.weight"].shape == (2 * widths[1], widths[1])
    if widths[0] == widths[1]:
        assert torch.equal(ours["vision.proj.weight"], torch.eye(16)) and not ours["vision.proj.bias"].any()
    back = vqa_to_hf(ours, 2, 3, project=widths[0] != widths[1])
    assert back.keys() == theirs.keys()
    for k, v in theirs.items():
        assert torch.equal(back[k], v) and back[k].is_contiguous(), k
    # safetensors writes only contiguous tensors that share no memory (q, k and v are chunks of one qkv)
    assert len({v.untyped_storage().data_ptr() for v in back.values()}) == len(back)


# ------------------------------------------------------------------------------------ the command line


def test_cli_import_then_caption_equals_transformers_on_its_processor(ved, tmp_path, capsys):
    """`vqa import` then `vqa caption` on a non-square picture: the checkpoint squashes it as ViTImageProcessor
    does, and the caption is transformers' generate() on the processor's pixel values."""
    import numpy as np
    from PIL import Image
    from transformers import ViTImageProcessor

    from vqa.cli import main
    from vqa.inference.predict import Predictor

    folder, hf = ved
    run = tmp_path / "run"
    assert main(["import", "--transformers", str(folder), "--out", str(run)]) == 0
    pic = Image.fromarray(np.random.default_rng(0).integers(0, 255, (41, 57, 3), dtype=np.uint8))
    pic.save(tmp_path / "pic.png")
    pixels = ViTImageProcessor.from_pretrained(str(folder))(images=pic, return_tensors="pt")["pixel_values"]
    pred = Predictor.from_pretrained(run, device="cpu")
    assert (pred.transform(pic) - pixels[0]).abs().max() <= 2 / 255 / 0.5 + 1e-6  # one level of rounding at most
    want = _hf_generate(hf, pixels)[0]
    got = pred.caption(tmp_path / "pic.png", max_new_tokens=12)
    assert got.ids == want
    capsys.readouterr()
    assert main(["caption", "--checkpoint", str(run), str(tmp_path / "pic.png")]) == 0
    assert pred.tokenizer.decode(want) in capsys.readouterr().out


def _copy(folder, tmp_path):
    import shutil

    return Path(shutil.copytree(folder, tmp_path / "bad"))


BAD = {
    # name: (edit the copied folder, words the one-line error must hold)
    "not a VisionEncoderDecoder": (lambda f: edit_json(f / "config.json", model_type="gpt2"),
                                   ["config.json", "model_type 'gpt2'"]),
    "encoder not ViT": (lambda f: edit_json(f / "config.json", **{"encoder.model_type": "deit"}),
                        ["config.json", "encoder.model_type 'deit'"]),
    "decoder not GPT-2": (lambda f: edit_json(f / "config.json", **{"decoder.model_type": "bert"}),
                          ["config.json", "decoder.model_type 'bert'"]),
    "no cross-attention": (lambda f: edit_json(f / "config.json", **{"decoder.add_cross_attention": False}),
                           ["config.json", "decoder.add_cross_attention"]),
    "mismatched shapes": (lambda f: edit_json(f / "config.json", **{"encoder.intermediate_size": 96}),
                          ["model.safetensors", "encoder.encoder.layer.0.intermediate.dense.weight", "[96, 32]"]),
    "missing tensors": (lambda f: edit_json(f / "config.json", **{"decoder.n_layer": 3}),
                        ["model.safetensors", "decoder.transformer.h.2.", "n_layer=3"]),
    "truncated safetensors": (lambda f: (f / "model.safetensors").write_bytes(
        (f / "model.safetensors").read_bytes()[:5000]), ["model.safetensors", "not a readable safetensors"]),
    "no weights": (lambda f: (f / "model.safetensors").unlink(), ["model.safetensors", "missing"]),
    "start token": (lambda f: edit_json(f / "config.json", decoder_start_token_id=5),
                    ["config.json", "decoder_start_token_id=5"]),
    "preprocessor size": (lambda f: edit_json(f / "preprocessor_config.json", size={"height": 48, "width": 48}),
                          ["preprocessor_config.json", "size", "image_size=32"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_cli_bad_input_one_line_exit_1_nothing_written(ved, tmp_path, capsys, case):
    from vqa.cli import main

    edit, words = BAD[case]
    folder = _copy(ved[0], tmp_path)
    edit(folder)
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["import", "--transformers", str(folder), "--out", str(out)]) == 1  # a bad file, not a usage error
    err = capsys.readouterr().err.strip()
    assert err.startswith("vqa import: error: ") and "\n" not in err and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)
    assert not out.exists() and not list(tmp_path.glob("out*")) and not list(tmp_path.glob(".out*"))


def test_attention_maps_of_a_squashing_model_cover_the_whole_picture():
    """An imported model saw the picture stretched to its square: patch borders and maps span the picture."""
    from vqa.inference.heatmaps import patch_edges, upsample_map

    assert patch_edges(100, 50, 4, 32, resize="squash") == ([0, 25, 50, 75, 100], [0, 12.5, 25, 37.5, 50])
    xs, ys = patch_edges(100, 50, 4, 32)  # letterboxed: the picture fills the middle rows only
    assert xs == [0, 25, 50, 75, 100] and ys == [-25, 0, 25, 50, 75][1:4]
    m = torch.zeros(4, 4).numpy()
    m[0, 0] = 1.0
    up = upsample_map(m, 100, 50, 32, resize="squash")
    assert up[:6, :12].min() > 0.5 and up[30:, 60:].max() == 0  # the top-left patch is the top-left corner
