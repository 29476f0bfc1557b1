"""A decoder started from a Llama-layout language model (`dec_layout="llama"`): with the cross-attention
gates at zero its logits equal transformers' own model on the same folder (Llama with grouped-query attention
and Llama 3's rotary scaling, SmolLM2's tied head, Qwen2's q/k/v biases, Qwen3's q/k norm), cached generation
equals uncached, and configs the decoder cannot hold are refused in one line."""

from __future__ import annotations

import pytest
import torch
from helpers import random_images
from llama_fixtures import FAMILIES, hf_llama_logits, save_tiny_llama
from lm_fixtures import VIT, text_vocab

from vqa.model import VQAModel
from vqa.tokenizer import SPECIAL_TOKENS
from vqa.weights import model_files
from vqa.weights.language_model import build_model, model_preset


def llama_model(folder, seed=0, **overrides) -> VQAModel:
    torch.manual_seed(seed)
    fields = {"dec_max_len": 64, **VIT, **overrides}
    return build_model(model_preset("tiny", dec_pretrained=str(folder), **fields)).eval()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_equal_transformers_with_the_gates_at_zero(tmp_path, family):
    folder = save_tiny_llama(tmp_path / family, family)
    model = llama_model(folder, dec_cross_every=2)
    assert len(model.decoder.cross) == 2  # before layers 0 and 2 of 3
    n = text_vocab(folder)
    ids = torch.randint(0, n, (3, model.cfg.dec_max_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model.teacher_forced(random_images(3, model.cfg), ids).logits
        other_images = model.teacher_forced(random_images(3, model.cfg, seed=1), ids).logits
    assert ours.shape[-1] == n + len(SPECIAL_TOKENS)
    ref = hf_llama_logits(folder, ids)
    assert ref.abs().max() > 1.0
    assert (ours[..., :n] - ref).abs().max() < 1e-4
    assert torch.equal(ours, other_images)  # the gates at zero: the image changes nothing yet


def open_gates(model) -> None:
    """Random cross-attention weights and open gates: the image now matters."""
    with torch.no_grad():
        for blk in model.decoder.cross:
            blk.attn_gate.fill_(0.3)
            blk.mlp_gate.fill_(-0.2)
            blk.cross_attn.proj.weight.normal_(0, 0.2)


def gates_open(tmp_path):
    """A Llama (grouped-query attention, untied head) with open gates, two prompts and two images."""
    from vqa.tokenizer import Tokenizer

    folder = save_tiny_llama(tmp_path / "llama", "llama")
    model = llama_model(folder)
    open_gates(model)
    tok = Tokenizer.for_language_model(folder)
    return model, [tok.vqa_prompt("what color is it?"), tok.caption_prompt()], random_images(2, model.cfg)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_cached_generation_equals_uncached(tmp_path, family):
    """Greedy decoding over the rotary-position caches (prompts of several lengths, left-padded) gives what
    the whole model over prompt + generated gives at every step, gates closed and open."""
    from test_pretrained_lm import ref_greedy

    from vqa.decoding.generate import generate
    from vqa.tokenizer import Tokenizer

    folder = save_tiny_llama(tmp_path / family, family)
    model = llama_model(folder)
    tok = Tokenizer.for_language_model(folder)
    prompts = [tok.vqa_prompt("what color is it?"), tok.caption_prompt(),
               tok.vqa_prompt("Is there a red square left of the blue triangle?")]
    images = random_images(3, model.cfg)
    for stage in ("as loaded", "gates open"):
        out = generate(model, prompts, images, max_new_tokens=12)
        assert any(len(set(s)) > 2 for s in out.sequences), out.sequences
        for i, prompt in enumerate(prompts):
            assert out.sequences[i] == ref_greedy(model, images[i : i + 1], prompt, 12), (stage, i)
        open_gates(model)
    assert generate(model, prompts, images.flip(0), max_new_tokens=12).sequences != out.sequences


@torch.inference_mode()
def test_compiled_decode_step_equals_the_eager_one(tmp_path, quick_compile):
    from vqa.config import GenerationConfig
    from vqa.decoding.batch import DecodingBatch

    model, prompts, images = gates_open(tmp_path)
    kv = model.memory_kv(model.encode(images))
    config = GenerationConfig(max_new_tokens=6)
    eager = DecodingBatch(model, kv, prompts, config)
    compiled = DecodingBatch(model, kv, prompts, config, compiled=True)
    torch.testing.assert_close(compiled.logits, eager.logits)
    for t in range(6):
        token = eager.logits.argmax(-1)
        torch.testing.assert_close(compiled.step(token), eager.step(token), atol=1e-5, rtol=1e-5, msg=f"step {t}")
    assert compiled.compiled_step.failed is None  # really compiled, no fallback


def test_the_new_blocks_learn_the_language_model_part_of_the_optimizer_split(tmp_path):
    """One step's gradients: the gates get one at once (tanh'(0) = 1), the language model too; the optimizer
    puts the gated blocks with the cross-attention (--lr), the language model with the decoder
    (x dec_lr_scale); the model saves and loads back to the same logits."""
    from vqa.train.optim import part_of

    folder = save_tiny_llama(tmp_path / "lm", "qwen3")
    model = llama_model(folder).train()
    ids = torch.randint(0, text_vocab(folder), (2, 10), generator=torch.Generator().manual_seed(0))
    images = random_images(2, model.cfg)
    model.teacher_forced(images, ids, loss_mask=torch.ones_like(ids, dtype=torch.bool)).loss.backward()
    for blk in model.decoder.cross:
        assert blk.attn_gate.grad.abs() > 0 and blk.mlp_gate.grad.abs() > 0
    assert model.decoder.blocks[0].self_attn.qkv.weight.grad.abs().sum() > 0
    parts = {name: part_of(name) for name, _ in model.named_parameters()}
    assert parts["decoder.cross.0.attn_gate"] == parts["decoder.cross.1.cross_attn.kv.weight"] == "cross_attention"
    assert parts["decoder.blocks.0.self_attn.qkv.weight"] == parts["decoder.head"] == "decoder"
    model.eval()
    with torch.no_grad():
        open_gates(model)
        want = model.teacher_forced(images, ids).logits
        back = model_files.load(model_files.save(model, tmp_path / "saved"))
        assert torch.equal(back.teacher_forced(images, ids).logits, want)


def test_int8_quantizes_the_layers_and_answers_with_the_untied_head_in_float(tmp_path):
    from vqa.decoding.generate import generate
    from vqa.decoding.precision import int8_unavailable, quantize_int8

    if int8_unavailable("cpu"):
        pytest.skip(int8_unavailable("cpu"))
    model, prompts, images = gates_open(tmp_path)
    quantize_int8(model)
    int8 = [n for n, m in model.decoder.named_modules() if type(getattr(m, "weight", None)).__name__ == "Int8Tensor"]
    assert len(int8) == 3 * 4 + 3 * 5  # per layer qkv, proj, gate_up, down; per gated block q, kv, proj, gate_up, down
    assert type(model.decoder.head) is torch.nn.Parameter
    for vocab in (None, [*range(40), model.cfg.eos_id]):  # the whole head, and its rows for a vocabulary
        out = generate(model, prompts, images, max_new_tokens=6, vocab=vocab).sequences
        assert all(len(s) > 0 for s in out) and (vocab is None or all(t in vocab for s in out for t in s))


def test_a_llama_decoder_is_refused_by_the_transformers_export_in_one_line(tmp_path):
    from vqa.export.hf_export import blockers

    why = blockers(llama_model(save_tiny_llama(tmp_path / "lm", "smollm2")))
    assert len(why) == 1 and why[0].startswith("dec_layout='llama'"), why


@pytest.mark.parametrize(("change", "says"), [
    (dict(rope_parameters=dict(rope_type="yarn", factor=4.0, rope_theta=10000.0)), "rope_type 'yarn' is not supported"),
    (dict(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
    (dict(num_key_value_heads=3), "num_attention_heads=4 is not a multiple of num_key_value_heads=3"),
    (dict(use_sliding_window=True), "use_sliding_window=true is not supported"),
])
def test_configs_the_decoder_cannot_hold_are_refused_naming_the_field(tmp_path, change, says):
    from lm_fixtures import edit_config

    from vqa.errors import ConfigError

    folder = save_tiny_llama(tmp_path / "lm", "llama")
    edit_config(folder, **change)
    with pytest.raises(ConfigError, match=str(folder / "config.json")) as e:
        llama_model(folder)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_context_longer_than_the_language_models_is_refused(tmp_path):
    from vqa.errors import ConfigError

    folder = save_tiny_llama(tmp_path / "lm", "smollm2")
    with pytest.raises(ConfigError,
                       match="dec_max_len=200 is longer than the language model's max_position_embeddings=128"):
        llama_model(folder, dec_max_len=200)


SMOLLM2 = {  # the fields of HuggingFaceTB/SmolLM2-135M's and -360M's config.json that shape the decoder
    "small-smollm2": dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                          num_hidden_layers=30),
    "base-smollm2": dict(hidden_size=960, intermediate_size=2560, num_attention_heads=15, num_key_value_heads=5,
                         num_hidden_layers=32),
}


@pytest.mark.parametrize("name", list(SMOLLM2))
def test_the_smollm2_presets_repeat_their_language_models_config(name):
    """So that `dec_pretrained=None` builds the shapes the language model's folder would (nothing read)."""
    from vqa.config import preset
    from vqa.weights.llama import architecture, check_config

    raw = dict(model_type="llama", hidden_act="silu", max_position_embeddings=8192, rms_norm_eps=1e-5,
               rope_theta=100000, rope_scaling=None, tie_word_embeddings=True, vocab_size=49152, **SMOLLM2[name])
    cfg = preset(name, dec_pretrained=None)
    lm = architecture(check_config(raw, "config.json"))
    assert {k: getattr(cfg, k) for k in lm} == lm
    assert cfg.dec_layout == "llama" and cfg.dec_cross_every > 1


def test_attention_maps_and_the_explain_arrays_have_one_layer_per_cross_attention_block(tmp_path):
    from vqa.decoding.generate import cross_attention_maps
    from vqa.inference.explain import explain_tokens

    model = llama_model(save_tiny_llama(tmp_path / "lm", "llama"), dec_cross_every=2)
    open_gates(model)
    image = random_images(1, model.cfg)
    with torch.no_grad():
        maps = cross_attention_maps(model, model.encode(image), [1, 5, 9], [7, 8])  # [G, L, H, N]
        arrays = explain_tokens(model, image, [1, 5, 9], [7, 8])
    assert maps.shape[:3] == (2, model.cfg.cross_layers, model.cfg.dec_heads) and model.cfg.cross_layers == 2
    assert torch.allclose(maps.sum(-1), torch.ones(()))
    assert arrays["cross_weights"].shape[:2] == (2, model.cfg.dec_heads)
    assert arrays["self_weights"].shape[:3] == (model.cfg.dec_depth, model.cfg.dec_heads, 5)


def test_a_run_from_a_saved_llama_trains_resumes_evaluates_answers_and_is_refused_by_exports(shapes_dir, tmp_path,
                                                                                            capsys):
    import json
    import shutil

    from conftest import TINY_SET

    from vqa import Predictor
    from vqa.cli import main
    from vqa.weights import checkpoint

    lm = save_tiny_llama(tmp_path / "lm", "qwen2")
    run = tmp_path / "run"
    vit = [a for item in TINY_SET if item.startswith("vit_") for a in ("--set", item)]
    base = ["--data", str(shapes_dir), "--batch-size", "4", "--warmup", "2", "--log-every", "1",
            "--eval-images", "4", "--lr", "3e-3", *vit]
    assert main(["train", *base, "--out", str(run), "--max-steps", "2", "--set", f"dec_pretrained={lm}",
                 "--set", "dec_max_len=64", "--set", "dec_cross_every=2"]) == 0
    saved = json.loads((run / "last" / "config.json").read_text())
    assert (saved["dec_layout"], saved["dec_kv_heads"], saved["dec_qkv_bias"], saved["dec_cross_every"]) == \
        ("llama", 2, True, 2)
    shutil.rmtree(lm)  # from here on everything reads the run alone
    assert main(["train", "--out", str(run), "--resume", "--max-steps", "3"]) == 0
    assert checkpoint.load_train_state(run / "last")["step"] == 3
    ev = tmp_path / "eval"
    assert main(["eval", "--checkpoint", str(run), "--data", str(shapes_dir), "--split", "val", "--out", str(ev)]) == 0
    assert json.loads((ev / "summary.json").read_text())["questions"] > 0
    pred = Predictor.from_pretrained(run, device="cpu")
    image = shapes_dir / "val" / sorted(p.name for p in (shapes_dir / "val").iterdir())[0]
    ans = pred.answer(image, "What color is the circle?", top_k=2, return_attention=True)
    assert ans.attention.shape[:3] == (len(ans.tokens), 2, 4)  # a map per generated token, cross block and head
    e = pred.explain(image, "What color is the circle?", result=ans)  # self: 3 layers, cross: 2 blocks
    assert (e.self_weights.shape[0], e.cross_weights.shape[0]) == (3, 2)
    assert any("query_keys" in p.name for p in e.save(tmp_path / "explained"))  # the last cross block's figure
    # the export formats that cannot hold the gated blocks refuse in one line naming the field
    capsys.readouterr()
    for fmt in ("--onnx", "--transformers"):
        assert main(["export", "--checkpoint", str(run), fmt, str(tmp_path / fmt.strip("-"))]) == 2
        err = capsys.readouterr().err.strip()
        assert "dec_layout='llama'" in err and len(err.splitlines()) == 1, err


def test_the_llama_layouts_fields_are_refused_in_the_gpt_layout():
    from vqa.config import preset
    from vqa.errors import ConfigError

    with pytest.raises(ConfigError, match=r"dec_kv_heads=2, dec_cross_every=2 need dec_layout='llama'"):
        preset("tiny", dec_cross_every=2, dec_kv_heads=2)
    with pytest.raises(ConfigError, match="dec_layout='llama' has rotary positions, SwiGLU"):
        preset("tiny", dec_layout="llama")  # tiny's sinusoidal positions and GELU


REAL = {  # the decoder-shaping fields of published config.json files (written out here: nothing is downloaded)
    "Llama-3.2-1B": dict(model_type="llama", hidden_size=2048, intermediate_size=8192, num_attention_heads=32,
                         num_key_value_heads=8, num_hidden_layers=16, head_dim=64, max_position_embeddings=131072,
                         rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True, vocab_size=128256,
                         rope_scaling=dict(factor=32.0, high_freq_factor=4.0, low_freq_factor=1.0,
                                           original_max_position_embeddings=8192, rope_type="llama3")),
    "Qwen2.5-0.5B": dict(model_type="qwen2", hidden_size=896, intermediate_size=4864, num_attention_heads=14,
                         num_key_value_heads=2, num_hidden_layers=24, max_position_embeddings=32768,
                         rms_norm_eps=1e-6, rope_theta=1000000.0, sliding_window=32768, use_sliding_window=False,
                         tie_word_embeddings=True, vocab_size=151936),
    "Qwen3-0.6B": dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                       num_key_value_heads=8, num_hidden_layers=28, head_dim=128, max_position_embeddings=40960,
                       rms_norm_eps=1e-6, rope_theta=1000000, rope_scaling=None, attention_bias=False,
                       tie_word_embeddings=True, vocab_size=151936),
}


@pytest.mark.parametrize("name", list(REAL))
def test_published_configurations_build_a_decoder_of_their_shapes(name):
    """Each published configuration gives a valid ModelConfig, and the decoder built from it (on the meta
    device: no memory) holds exactly the language model's parameters plus the new blocks."""
    from vqa.config import preset
    from vqa.model.llama_decoder import LlamaDecoder
    from vqa.weights.llama import architecture, check_config, parameter_count

    c = check_config({"hidden_act": "silu", **REAL[name]}, "config.json")
    cfg = preset("tiny", dec_pretrained=None, vocab_size=c["vocab_size"], dec_cross_every=4, **architecture(c))
    with torch.device("meta"):
        dec = LlamaDecoder(cfg)
    lm = sum(p.numel() for n, p in dec.named_parameters() if not n.startswith("cross."))
    assert lm == parameter_count(c)
    assert len(dec.cross) == c["num_hidden_layers"] // 4


def test_checkpointed_gradients_equal_plain_ones_in_the_llama_layout(tmp_path):
    """--grad-checkpointing recomputes the language model's layers and the gated blocks: the same gradients."""
    folder = save_tiny_llama(tmp_path / "llama", "llama")
    ids = torch.randint(0, text_vocab(folder), (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, 6:] = True
    grads, calls = [], []
    for on in (False, True):
        model = llama_model(folder, dec_cross_every=2).train()
        open_gates(model)
        model.set_grad_checkpointing(on)
        n = [0]
        for blk in [*model.decoder.blocks, *model.decoder.cross]:
            blk.register_forward_pre_hook(lambda *_, n=n: n.__setitem__(0, n[0] + 1))
        model.teacher_forced(random_images(2, model.cfg), ids, mask).loss.backward()
        grads.append({k: p.grad for k, p in model.named_parameters() if p.grad is not None})
        calls.append(n[0])
    assert grads[0].keys() == grads[1].keys() and any("decoder.cross" in k for k in grads[0])
    for k, g in grads[0].items():
        assert torch.allclose(grads[1][k], g, atol=1e-6, rtol=0), k
    assert calls[1] > calls[0]  # the blocks ran again in the backward pass
