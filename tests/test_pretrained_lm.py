"""A decoder started from a pretrained GPT-2 (`dec_pretrained`): its logits equal transformers'
GPT2LMHeadModel on the same folder, cached generation equals uncached, the tokenizer is the model's own with
vqa's special tokens, the new cross-attention starts at zero and learns, and a run from a saved GPT-2 trains,
saves, resumes and reloads through eval, the Predictor and the app. Bad folders and the options that clash
with a language model are in test_pretrained_lm_config.py; the `gpt2_dir` fixture is in conftest.py."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import random_images
from lm_fixtures import hf_logits, lm_model, save_tiny_gpt2, text_vocab

from vqa.config import preset
from vqa.decoding.generate import generate
from vqa.model import VQAModel
from vqa.tokenizer import BYTE_TOKENS, SPECIAL_TOKENS, Tokenizer

# ---------------------------------------------------------------- exactness


@pytest.mark.parametrize("variant", [
    {},  # GPT-2's own settings: gelu_new, LayerNorm eps 1e-5, MLP 4x
    dict(activation_function="gelu", layer_norm_epsilon=1e-3, n_inner=48, n_head=2),
])
def test_loaded_decoder_logits_equal_transformers_gpt2(tmp_path, variant):
    folder = save_tiny_gpt2(tmp_path / "lm", **variant)
    model = lm_model(folder)
    n = text_vocab(folder)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, n, (3, model.cfg.dec_max_len), generator=g)  # every position the decoder has
    images = random_images(3, model.cfg)
    with torch.no_grad():
        ours = model.teacher_forced(images, ids).logits
        other_images = model.teacher_forced(random_images(3, model.cfg, seed=1), ids).logits
    assert ours.shape[-1] == n + len(SPECIAL_TOKENS)  # the special tokens are added after the model's vocabulary
    ref = hf_logits(folder, ids)
    assert ref.abs().max() > 1.0  # logits that are not all near zero: a wrong mapping shows
    assert (ours[..., :n] - ref).abs().max() < 1e-4
    # the cross-attention's contribution is exactly zero at the start: another image, the same logits
    assert torch.equal(ours, other_images)


@torch.no_grad()
def ref_greedy(model, image, prompt, max_new):
    """Greedy decoding without a cache: the whole model over prompt + generated at every step."""
    seq = []
    for _ in range(max_new):
        tok = int(model.teacher_forced(image, torch.as_tensor([prompt + seq])).logits[0, -1].argmax())
        if tok == model.cfg.eos_id:
            break
        seq.append(tok)
    return seq


def test_cached_generation_equals_uncached_with_the_loaded_weights(gpt2_dir):
    model = lm_model(gpt2_dir)
    tok = Tokenizer.for_language_model(gpt2_dir)
    prompts = [tok.vqa_prompt("what color is it?"), tok.caption_prompt(),
               tok.vqa_prompt("Is there a red square left of the blue triangle?")]  # left-padded to one length
    images = random_images(3, model.cfg)
    for stage in ("as loaded", "cross-attention switched on"):
        out = generate(model, prompts, images, max_new_tokens=12)
        assert any(len(set(s)) > 2 for s in out.sequences), out.sequences  # outputs depend on context
        for i, prompt in enumerate(prompts):
            assert out.sequences[i] == ref_greedy(model, images[i : i + 1], prompt, 12), (stage, i)
        with torch.no_grad():  # random cross-attention output projections: the image now matters
            for blk in model.decoder.blocks:
                blk.cross_attn.proj.weight.normal_(0, 0.5)
    swapped = generate(model, prompts, images.flip(0), max_new_tokens=12).sequences
    assert swapped != out.sequences


# ---------------------------------------------------------------- tokenizer and initialization


def test_the_tokenizer_is_the_language_models_own_with_the_special_tokens_added(gpt2_dir):
    from tokenizers import Tokenizer as HF

    raw = HF.from_file(str(gpt2_dir / "tokenizer.json"))
    tok = Tokenizer.for_language_model(gpt2_dir)
    n = raw.get_vocab_size()
    text = "Is there a Red circle? <eos> <answer> <|endoftext|>"
    plain = "Is there a Red circle?"
    assert tok.encode(plain) == raw.encode(plain, add_special_tokens=False).ids  # the model's own ids, case kept
    assert sorted(tok.model_ids()[k] for k in ("pad_id", "bos_id", "eos_id")) == [n, n + 1, n + 2]
    assert {tok.question_id, tok.answer_id, tok.caption_id} == {n + 4, n + 5, n + 6}
    end = raw.token_to_id("<|endoftext|>")
    assert end in raw.encode(text, add_special_tokens=False).ids  # the raw tokenizer reads it as a control token
    assert not {tok.eos_id, tok.answer_id, end} & set(tok.encode(text))  # here, typed control tokens stay text
    assert tok.decode(tok.encode(text)) == text
    ids = tok.encode("a red circle and two stars")
    pieces = tok.pieces(ids)
    assert "".join(pieces) == "a red circle and two stars"  # byte-level Ġ turned back into spaces
    assert sum(p.startswith(" ") for p in pieces) == 5  # each word after the first starts with its space


def test_new_token_rows_start_near_the_mean_and_distinct(gpt2_dir):
    model = lm_model(gpt2_dir)
    n = text_vocab(gpt2_dir)
    emb = model.decoder.embed.weight.detach()
    from safetensors.torch import load_file

    wte = load_file(str(gpt2_dir / "model.safetensors"))["transformer.wte.weight"]
    assert torch.equal(emb[:n], wte[:n])
    new, mean = emb[n:], wte.mean(0)
    spread = (wte - mean).norm(dim=1).mean()
    assert ((new - mean).norm(dim=1) < 0.3 * spread).all()  # near the mean: ordinary logits at the start
    assert torch.cdist(new, new).add(torch.eye(len(new))).min() > 0  # but no two special tokens alike


def test_the_cross_attention_starts_at_zero_and_learns(gpt2_dir):
    model = lm_model(gpt2_dir).train()
    cfg = model.cfg
    images = random_images(2, cfg)
    ids = torch.randint(0, cfg.bos_id, (2, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, 5:] = True
    with torch.no_grad():  # at step 0 the decoder is the language model: the image changes nothing
        assert torch.equal(model.eval().teacher_forced(images, ids).logits,
                           model.teacher_forced(images.flip(0), ids).logits)
    model.train()
    model.teacher_forced(images, ids, loss_mask=mask).loss.backward()
    for blk in model.decoder.blocks:
        assert torch.count_nonzero(blk.cross_attn.proj.weight) == 0
        assert blk.cross_attn.proj.weight.grad.abs().sum() > 0  # the zero projection learns first ...
        assert blk.cross_attn.q.weight.grad.abs().sum() == 0  # ... the rest from the second step on
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.5 * p.grad
        model.eval()
        a = model.teacher_forced(images, ids).logits
        b = model.teacher_forced(images.flip(0), ids).logits  # the same texts, each with the other image
    # after one step the image changes the logits: by far more than rounding (~1e-6) could
    assert (a - b).abs().amax(-1).min() > 1e-3


def test_pieces_of_the_projects_own_tokenizer_are_unchanged():
    """The per-word grouping of the Predictor reads `pieces`: for vqa's Metaspace BPE it is what it was
    before byte-level tokenizers were supported (the token with its ▁ as a space)."""
    tok = Tokenizer.train(["What color is the big red circle?", "two blue squares, left of 3 stars."] * 3,
                          vocab_size=120)
    ids = [i for i in range(tok.vocab_size) if tok.id_to_token(i) not in BYTE_TOKENS]
    assert tok.pieces(ids) == [tok.id_to_token(i).replace("▁", " ") for i in ids]
    # a byte token is its character: an ASCII one whole, one byte of a longer character U+FFFD
    assert tok.pieces([tok.hf.token_to_id("<0x41>"), tok.hf.token_to_id("<0xC3>")]) == ["A", "\ufffd"]


def test_a_config_from_before_the_pretrained_fields_keeps_todays_decoder():
    import math

    from vqa.config import ModelConfig

    old = {k: v for k, v in preset("tiny").to_dict().items()
           if k not in ("dec_pretrained", "dec_activation", "dec_embed_scale", "dec_norm_eps")}
    cfg = ModelConfig.from_dict(old)
    model = VQAModel(cfg)
    assert model.decoder.embed_scale == math.sqrt(cfg.dec_width)
    assert model.decoder.blocks[0].mlp[1].approximate == "none" and model.decoder.ln_f.eps == 1e-5


# ---------------------------------------------------------------- the whole path


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword is deprecated")
def test_a_run_from_a_saved_gpt2_trains_saves_and_reloads_everywhere(shapes_dir, gpt2_dir, tmp_path, capsys):
    from conftest import TINY_SET

    from vqa import Predictor
    from vqa.cli import main
    from vqa.weights import checkpoint

    lm = tmp_path / "lm"
    shutil.copytree(gpt2_dir, lm)
    run = tmp_path / "run"
    vit = [a for item in TINY_SET if item.startswith("vit_") for a in ("--set", item)]
    base = ["--data", str(shapes_dir), "--batch-size", "4", "--warmup", "2", "--log-every", "1",
            "--eval-images", "4", "--lr", "3e-3", *vit]
    args = ["train", *base, "--out", str(run), "--max-steps", "2", "--set", f"dec_pretrained={lm}",
            "--set", "dec_max_len=64"]
    assert main(args) == 0
    saved = json.loads((run / "last" / "config.json").read_text())
    assert saved["dec_pretrained"] == str(lm) and (saved["dec_width"], saved["dec_depth"]) == (32, 2)
    assert (saved["dec_activation"], saved["dec_embed_scale"], saved["dec_positions"]) == (
        "gelu_tanh", False, "learned")
    assert main(["train", *base, "--out", str(tmp_path / "r2"), "--max-steps", "1", "--set", f"dec_pretrained={lm}",
                 "--tokenizer", str(lm / "tokenizer.json")]) == 2
    assert "brings its own tokenizer" in capsys.readouterr().err

    shutil.rmtree(lm)  # from here on everything reads the run alone
    assert main(["train", "--out", str(run), "--resume", "--max-steps", "3"]) == 0
    assert checkpoint.load_train_state(run / "last")["step"] == 3
    ev = tmp_path / "eval"
    assert main(["eval", "--checkpoint", str(run), "--data", str(shapes_dir), "--split", "val", "--out", str(ev)]) == 0
    summary = json.loads((ev / "summary.json").read_text())
    assert summary["questions"] > 0 and "CIDEr-D" in summary

    pred = Predictor.from_pretrained(run, device="cpu")
    image = shapes_dir / "val" / sorted(p.name for p in (shapes_dir / "val").iterdir())[0]
    ans = pred.answer(image, "What color is the circle?", top_k=2, return_attention=True)
    assert ans.attention.shape[:3] == (len(ans.tokens), 2, 4)  # a map per generated token, layer and head
    cap = pred.caption(image, return_attention=True, max_new_tokens=6)
    assert cap.attention.shape[0] == len(cap.tokens) and len(cap.words()) >= 1

    from predict_fixtures import start_app

    pytest.importorskip("gradio_client")
    from gradio_client import Client, handle_file

    demo, url = start_app(pred)
    try:
        answer = Client(url, verbose=False).predict(handle_file(str(image)), "What color is the circle?", 2,
                                                    api_name="/ask")[0]
    finally:
        demo.close()
    assert answer == ans.answer

    # fine-tuning it again with a --set that rebuilds the model needs no language model folder either
    assert main(["train", *base, "--out", str(tmp_path / "again"), "--init-from", str(run), "--max-steps", "1",
                 "--set", "dec_dropout=0.1"]) == 0
    again, _, card = checkpoint.load(tmp_path / "again" / "last")
    assert again.cfg.dec_dropout == 0.1 and card["init_from"] == str(run)
