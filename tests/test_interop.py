"""`vqa import --transformers`: a VisionEncoderDecoderModel (ViTModel + GPT-2 with cross-attention) saved by
`transformers` itself is read into a VQAModel that computes what transformers computes (float32 logits within
1e-4, the same greedy and beam captions), and bad folders are refused in one line with nothing written."""

from __future__ import annotations

import pytest
import torch

from tests.hf_fixtures import images, load_ved, save_tiny_ved
from vqa.config import GenerationConfig
from vqa.decoding.generate import generate
from vqa.export.hf_import import import_transformers, read_source
from vqa.model import checkpoint

pytest.importorskip("transformers")


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
        ours = model(x, ids).logits
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
