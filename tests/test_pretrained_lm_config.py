"""What a pretrained language model's folder and the options around it may say (`dec_pretrained`): bad folders
are refused naming the file and field, a model too large for memory and a hub name without internet say so,
texts too long for its context are reported, it fixes the decoder's architecture, and the options that clash
with it are refused where they are made. The `gpt2_dir` fixture is in conftest.py."""

from __future__ import annotations

import shutil

import pytest
from lm_fixtures import VIT, edit_config, lm_model, save_tiny_gpt2, text_vocab

from vqa.errors import ConfigError
from vqa.tokenizer import SPECIAL_TOKENS, Tokenizer
from vqa.weights.language_model import model_preset

# ---------------------------------------------------------------- bad folders


@pytest.fixture()
def lm_copy(gpt2_dir, tmp_path):
    dst = tmp_path / "lm"
    shutil.copytree(gpt2_dir, dst)
    return dst


@pytest.mark.parametrize("changes, match", [
    (dict(model_type="gemma", architectures=["GemmaForCausalLM"]),
     r"config\.json: model_type 'gemma' \(GemmaForCausalLM\) is not supported"),
    (dict(model_type="llama"), r"config\.json: hidden_size must be a positive integer"),
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
    from vqa.weights import language_model

    monkeypatch.setattr(language_model, "free_memory", lambda: 10_000)
    with pytest.raises(ConfigError, match=r"M parameters need .* GB as float32 \(the \d+-token vocabulary alone"):
        lm_model(gpt2_dir)


def test_a_hub_name_without_internet_fails_with_a_clear_message(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # nothing here downloads
    with pytest.raises(ConfigError, match=r"'vqa-tests/no-such-lm': no such folder here, and fetching it from the "
                                          r"Hugging Face Hub failed .*hf download vqa-tests/no-such-lm"):
        model_preset("small-gpt2", dec_pretrained="vqa-tests/no-such-lm")


def test_texts_too_long_for_the_context_in_the_models_tokens_are_reported(gpt2_dir):
    from vqa.data.lengths import text_cuts

    tok = Tokenizer.for_language_model(gpt2_dir)
    texts = ["a red circle", "two green stars and a yellow circle on a grey background, left of a blue square"]
    assert len(tok.encode(texts[1])) > 13 >= len(tok.encode(texts[0]))
    # 16 positions leave a caption what its prompt and <eos> do not take
    most = 16 - len(tok.caption_prompt()) - 1
    assert text_cuts(tok, 16, [], texts) == [f"vqa: 1 of 2 caption targets (50.00%) were longer than the {most} "
                                             "tokens dec_max_len=16 leaves a caption and were cut"]
    assert text_cuts(tok, 16, [], texts[:1]) == []


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
        with pytest.raises(ConfigError,
                           match=f"{key}={value!r} cannot be combined with dec_pretrained='gpt2': .*{why}"):
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
    from vqa.train.build import init_from
    from vqa.weights import checkpoint

    src = tmp_path / "src"
    model = lm_model(gpt2_dir)
    checkpoint.save(src, model, Tokenizer.for_language_model(gpt2_dir))

    def start(**model_set):
        return init_from(TrainConfig(data="d", out=str(tmp_path / "run"), init_from=str(src), model=model_set),
                         str(src))

    for key, value in (("dec_activation", "gelu"), ("dec_embed_scale", True), ("dec_norm_eps", 1e-3),
                       ("dec_pretrained", str(tmp_path / "other"))):
        with pytest.raises(ConfigError, match=rf"--set {key}=.* cannot be combined with its decoder"):
            start(**{key: value})
    assert start(dec_dropout=0.1)[0].cfg.dec_dropout == 0.1
