"""A decoder started from a pretrained GPT-2 (`dec_pretrained`): its logits equal transformers' GPT2LMHeadModel
on the same folder, cached generation equals uncached, the tokenizer is the model's own with vqa's special
tokens, the new cross-attention starts at zero and learns, bad folders get errors naming the file and field,
and a run from a saved GPT-2 trains, saves, resumes and reloads through eval, the Predictor and the app."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from helpers import random_images
from lm_fixtures import edit_config, hf_logits, save_tiny_gpt2

from vqa.config import preset
from vqa.decoding.generate import generate
from vqa.errors import ConfigError
from vqa.model import VQAModel, model_preset
from vqa.tokenizer import SPECIAL_TOKENS, Tokenizer

# a small ViT on 32 px images, so that the model builds in milliseconds; the decoder is the language model's
VIT = dict(vit_width=32, vit_depth=1, vit_heads=2, vit_image_size=32, vit_patch_size=8)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, shapes_dir):
    """A random GPT-2 (2 layers, 32 wide, 4 heads, 64 positions) whose tokenizer knows the Shapes text."""
    from vqa.data.formats import corpus_texts, load_split

    texts = list(corpus_texts(load_split(shapes_dir, "train")))
    return save_tiny_gpt2(tmp_path_factory.mktemp("gpt2") / "lm", texts)


def lm_model(folder, seed: int = 0, **overrides) -> VQAModel:
    torch.manual_seed(seed)
    return VQAModel(model_preset("tiny", dec_pretrained=str(folder), dec_max_len=64, **VIT, **overrides)).eval()


def text_vocab(folder) -> int:
    from tokenizers import Tokenizer as HF

    return HF.from_file(str(folder / "tokenizer.json")).get_vocab_size()


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
        ours = model(images, ids).logits
        other_images = model(random_images(3, model.cfg, seed=1), ids).logits
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
        tok = int(model(image, torch.as_tensor([prompt + seq])).logits[0, -1].argmax())
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
        assert torch.equal(model.eval()(images, ids).logits, model(images.flip(0), ids).logits)
    model.train()
    model(images, ids, loss_mask=mask).loss.backward()
    for blk in model.decoder.blocks:
        assert torch.count_nonzero(blk.cross_attn.proj.weight) == 0
        assert blk.cross_attn.proj.weight.grad.abs().sum() > 0  # the zero projection learns first ...
        assert blk.cross_attn.q.weight.grad.abs().sum() == 0  # ... the rest from the second step on
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.5 * p.grad
        model.eval()
        a = model(images, ids).logits
        b = model(images.flip(0), ids).logits  # the same texts, each with the other image
    # after one step the image changes the logits: by far more than rounding (~1e-6) could
    assert (a - b).abs().amax(-1).min() > 1e-3


def test_pieces_of_the_projects_own_tokenizer_are_unchanged():
    """The per-word grouping of the Predictor reads `pieces`: for vqa's Metaspace BPE it is what it was
    before byte-level tokenizers were supported (the token with its ▁ as a space)."""
    tok = Tokenizer.train(["What color is the big red circle?", "two blue squares, left of 3 stars."] * 3,
                          vocab_size=120)
    ids = list(range(tok.vocab_size))
    assert tok.pieces(ids) == [tok.id_to_token(i).replace("▁", " ") for i in ids]


def test_a_config_from_before_the_pretrained_fields_keeps_todays_decoder():
    import math

    from vqa.config import ModelConfig

    old = {k: v for k, v in preset("tiny").to_dict().items()
           if k not in ("dec_pretrained", "dec_activation", "dec_embed_scale", "dec_norm_eps")}
    cfg = ModelConfig.from_dict(old)
    model = VQAModel(cfg)
    assert model.decoder.embed_scale == math.sqrt(cfg.dec_width)
    assert model.decoder.blocks[0].mlp[1].approximate == "none" and model.decoder.ln_f.eps == 1e-5


# ---------------------------------------------------------------- bad folders


@pytest.fixture()
def lm_copy(gpt2_dir, tmp_path):
    dst = tmp_path / "lm"
    shutil.copytree(gpt2_dir, dst)
    return dst


@pytest.mark.parametrize("changes, match", [
    (dict(model_type="llama", architectures=["LlamaForCausalLM"]),
     r"config\.json: model_type 'llama' \(LlamaForCausalLM\) is not supported"),
    (dict(activation_function="relu"), r"config\.json: activation_function 'relu' is not supported"),
    (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx=True is not supported"),
    (dict(tie_word_embeddings=False), "tie_word_embeddings=False is not supported"),
    (dict(n_head=5), "n_embd=32 is not divisible by n_head=5"),
    (dict(n_embd=64), r"model\.safetensors: wte\.weight is \[\d+, 32\], but config\.json \(n_embd=64.*do not match"),
    (dict(n_layer=3), r"model\.safetensors lacks h\.2\.\S+.*n_layer=3"),
    (dict(n_layer=1), r"model\.safetensors holds tensors config\.json does not describe.*h\.1\."),
    (dict(n_positions=32), r"config\.json: dec_max_len=64 is longer than the language model's n_positions=32"),
    (dict(n_embd="wide"), r"config\.json: n_embd must be a positive integer"),
])
def test_a_bad_config_is_refused_naming_the_file_and_field(lm_copy, changes, match):
    edit_config(lm_copy, **changes)
    with pytest.raises(ConfigError, match=match):
        lm_model(lm_copy)


def test_missing_files_are_named(lm_copy, tmp_path):
    (lm_copy / "model.safetensors").rename(lm_copy / "pytorch_model.bin")
    with pytest.raises(ConfigError, match=r"model\.safetensors: missing \(there is pytorch_model\.bin: a pickle"):
        lm_model(lm_copy)
    (lm_copy / "tokenizer.json").unlink()
    with pytest.raises(ConfigError, match=r"tokenizer\.json: missing.*own tokenizer"):
        lm_model(lm_copy)
    (lm_copy / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"config\.json: missing"):
        lm_model(lm_copy)
    with pytest.raises(ConfigError, match="no such folder"):
        lm_model(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="is a file"):
        lm_model(lm_copy / "pytorch_model.bin")


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path, gpt2_dir):
    n = text_vocab(gpt2_dir)
    folder = save_tiny_gpt2(tmp_path / "lm", rows=260)  # the tokenizer has more tokens than wte has rows
    assert text_vocab(folder) > 260
    with pytest.raises(ConfigError, match=r"tokenizer\.json has \d+ tokens but wte\.weight .* has 260 rows"):
        lm_model(folder)
    assert n > 260


def test_a_model_too_large_for_memory_says_so(gpt2_dir, monkeypatch):
    from vqa.model import pretrained_lm

    monkeypatch.setattr(pretrained_lm, "free_memory", lambda: 10_000)
    with pytest.raises(ConfigError, match=r"M parameters need .* GB as float32 \(the \d+-token vocabulary alone"):
        lm_model(gpt2_dir)


def test_a_hub_name_without_internet_fails_with_a_clear_message(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # nothing here downloads
    with pytest.raises(ConfigError, match=r"'vqa-tests/no-such-lm': no such folder here, and fetching it from the "
                                          r"Hugging Face Hub failed .*hf download vqa-tests/no-such-lm"):
        model_preset("small-gpt2", dec_pretrained="vqa-tests/no-such-lm")


def test_texts_too_long_for_the_context_in_the_models_tokens_are_reported(gpt2_dir):
    from vqa.model.pretrained_lm import context_warning

    tok = Tokenizer.for_language_model(gpt2_dir)
    texts = ["a red circle", "two green stars and a yellow circle on a grey background, left of a blue square"]
    assert len(tok.encode(texts[1])) > 13 >= len(tok.encode(texts[0]))
    msg = context_warning(tok, texts, 16, str(gpt2_dir))  # 16 positions leave 13 tokens for a caption
    assert msg.startswith("1 of 2 training texts checked take more than 13 tokens") and "up to 64 positions" in msg
    assert context_warning(tok, texts[:1], 16, str(gpt2_dir)) is None


def test_the_language_model_fixes_the_decoder_architecture(gpt2_dir):
    cfg = model_preset("tiny", dec_pretrained=str(gpt2_dir), **VIT)
    assert (cfg.dec_width, cfg.dec_depth, cfg.dec_heads, cfg.dec_mlp_ratio) == (32, 2, 4, 4.0)
    assert (cfg.dec_positions, cfg.dec_activation, cfg.dec_embed_scale, cfg.dec_qk_norm) == (
        "learned", "gelu_tanh", False, False)
    assert cfg.vocab_size == text_vocab(gpt2_dir) + len(SPECIAL_TOKENS)
    with pytest.raises(ConfigError, match=r"remove dec_qk_norm=True \(the language model has False\)"):
        model_preset("tiny", dec_pretrained=str(gpt2_dir), dec_qk_norm=True)
    with pytest.raises(ConfigError, match=r"remove dec_width=96"):
        model_preset("tiny", dec_pretrained=str(gpt2_dir), dec_width=96)
    plain = model_preset("small-gpt2", dec_pretrained=None)  # the same shapes, random weights, nothing read
    assert (plain.dec_width, plain.dec_depth, plain.dec_positions) == (768, 6, "learned")


# ---------------------------------------------------------------- the whole path


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*no_silent_downcasting", "ignore:The copy keyword is deprecated")
def test_a_run_from_a_saved_gpt2_trains_saves_and_reloads_everywhere(shapes_dir, gpt2_dir, tmp_path, capsys):
    from conftest import TINY_SET

    from vqa import Predictor
    from vqa.cli import main
    from vqa.model import checkpoint

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
    assert (saved["dec_activation"], saved["dec_embed_scale"], saved["dec_positions"]) == ("gelu_tanh", False, "learned")
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


# ---------------------------------------------------------------- options that cannot be combined


def test_a_pretrained_decoder_refuses_options_that_change_its_attention_or_layout():
    """Whatever the language model's config.json says, a GPT-2-layout decoder has no QK-norm, learned
    positions and unscaled embeddings: a config that says otherwise is refused where it is made, naming the
    option and why (no model, no file read)."""
    from vqa.config import ModelConfig

    base = dict(dec_pretrained="gpt2", dec_positions="learned", dec_embed_scale=False, vit_image_size=32,
                vit_mean=(0.5,) * 3, vit_std=(0.5,) * 3)
    ModelConfig(**base)
    for key, value, why in (("dec_qk_norm", True, "no LayerNorm on queries and keys"),
                            ("dec_positions", "sinusoidal", "learned table"),
                            ("dec_embed_scale", True, "unscaled")):
        with pytest.raises(ConfigError, match=f"{key}={value!r} cannot be combined with dec_pretrained='gpt2': .*{why}"):
            ModelConfig(**{**base, key: value})
    ModelConfig(**{**base, "dec_pretrained": None, "dec_qk_norm": True})  # a decoder from scratch may


def test_train_refuses_a_clashing_set_at_start_up_before_the_run_folder_exists(gpt2_dir, shapes_dir, tmp_path,
                                                                                capsys):
    from vqa.cli import main

    vit = [a for item in VIT.items() for a in ("--set", f"{item[0]}={item[1]}")]
    for clash, said in (("dec_qk_norm=true", "remove dec_qk_norm=True"),
                        ("dec_activation=gelu", "remove dec_activation='gelu' (the language model has 'gelu_tanh')"),
                        ("dec_heads=2", "remove dec_heads=2")):
        run = tmp_path / clash
        capsys.readouterr()
        assert main(["train", "--data", str(shapes_dir), "--out", str(run), "--max-steps", "1", *vit,
                     "--set", f"dec_pretrained={gpt2_dir}", "--set", clash]) == 2
        assert said in capsys.readouterr().err
        assert not run.exists()  # refused before the run folder was made or the data read


def test_init_from_a_gpt2_run_refuses_a_set_that_changes_the_language_model(gpt2_dir, tmp_path):
    """A run started from a language model keeps it: --init-from with a --set of a field the language model
    fixes (an activation, an embedding scale: same shapes, other function) or another dec_pretrained is
    refused; --set of a field it does not fix still works."""
    from vqa.config import TrainConfig
    from vqa.model import checkpoint
    from vqa.train.setup import init_from

    src = tmp_path / "src"
    model = lm_model(gpt2_dir)
    checkpoint.save(src, model, Tokenizer.for_language_model(gpt2_dir))

    def start(**model_set):
        return init_from(TrainConfig(data="d", out=str(tmp_path / "run"), init_from=str(src), model=model_set), str(src))

    for key, value in (("dec_activation", "gelu"), ("dec_embed_scale", True), ("dec_norm_eps", 1e-3),
                       ("dec_pretrained", str(tmp_path / "other"))):
        with pytest.raises(ConfigError, match=rf"--set {key}=.* cannot be combined with its decoder"):
            start(**{key: value})
    assert start(dec_dropout=0.1)[0].cfg.dec_dropout == 0.1
