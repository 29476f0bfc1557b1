"""`vqa export --transformers`: an imported run goes back to its source tensors exactly; a model built here
loads in `transformers` (VisionEncoderDecoderModel.from_pretrained) and its generate() gives vqa's captions;
models transformers cannot express are refused in one line naming each field, before anything is written;
`transformers` stays an optional extra that the core and the CLI never import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_fixtures import images, load_ved, save_tiny_ved

from vqa.config import GenerationConfig, preset
from vqa.decoding.generate import generate
from vqa.export.hf_export import export_transformers
from vqa.export.hf_import import import_transformers
from vqa.identity import checkpoint_identity
from vqa.model import VQAModel
from vqa.tokenizer import Tokenizer
from vqa.weights import checkpoint
from vqa.weights.hf_layout import IGNORED

pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parent.parent
TEXTS = ["a red circle", "two blue squares", "a green star left of a yellow triangle", "three shapes"] * 5


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(folder / "model.safetensors"))
    return torch.load(folder / "pytorch_model.bin", weights_only=True)


@pytest.mark.parametrize("kind", ["projection", "same width, .bin"])
def test_import_then_export_gives_the_source_tensors_back(tmp_path, kind):
    kw = dict(dec_width=32, bin_file=True, tokenizer_json=False) if kind != "projection" else {}
    src = save_tiny_ved(tmp_path / "src", **kw)
    run = import_transformers(src, tmp_path / "run")
    out = export_transformers(run, tmp_path / "hf")
    before = {k: v for k, v in _tensors(src).items() if not IGNORED.fullmatch(k)}
    after = {k: v for k, v in _tensors(out).items() if not k.startswith("encoder.pooler.")}
    assert before.keys() == after.keys()
    for k, v in before.items():
        assert torch.equal(v, after[k]), k
    assert ("enc_to_dec_proj.weight" in after) == (kind == "projection")
    assert json.loads((out / "vqa-export.json").read_text())["model"] == checkpoint_identity(checkpoint.resolve(run))
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["decoder_start_token_id"] == gen["eos_token_id"] and "forced_bos_token_id" not in gen
    assert "decoder_start_token_id" not in json.loads((out / "config.json").read_text()).get("decoder", {})


def _model_here(folder: Path, dec_width: int, **fields) -> Path:
    """A checkpoint of a model built here (vqa's BPE tokenizer, its prompts), with weights spread enough that
    a wrong mapping shows, written as `vqa train` writes it."""
    tok = Tokenizer.train(TEXTS, vocab_size=120)
    fields = dict(vit_conv_stem=False, vit_qk_norm=False, vit_memory_pos=False, dec_qk_norm=False, vit_image_size=32,
                  vit_patch_size=8, vit_width=32, vit_depth=2, vit_heads=2, dec_width=dec_width, dec_depth=2,
                  dec_heads=2, dec_max_len=20) | fields
    cfg = preset("tiny", **tok.model_ids(), **fields)
    torch.manual_seed(0)
    model = VQAModel(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or ".ln" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p) if name.endswith("weight") else 0.2 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.2)
    return checkpoint.save(folder, model, tok, {"preset": "tiny"})


CASES = {  # the memory projection folded (same widths) or as enc_to_dec_proj; fixed or learned positions
    "fold, sinusoidal, embedding scale": dict(dec_width=32),
    "enc_to_dec_proj, learned, gelu_tanh": dict(dec_width=48, dec_positions="learned", dec_embed_scale=False,
                                                dec_activation="gelu_tanh"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_export_of_a_model_built_here_generates_vqa_captions(tmp_path, case):
    run = _model_here(tmp_path / "run", **CASES[case])
    model, tok, _ = checkpoint.load(run)
    out = export_transformers(run, tmp_path / "hf")
    hf = load_ved(out)
    x = images(4)
    prompt = tok.caption_prompt()  # <bos> <caption>
    ids = torch.tensor([prompt + [7, 9, 11, 5]] * 4)
    with torch.no_grad():
        theirs, ours = hf(pixel_values=x, decoder_input_ids=ids).logits, model.teacher_forced(x, ids).logits
    assert theirs.abs().max() > 1 and (ours - theirs).abs().max() < 1e-4
    with torch.no_grad():
        out_ids = hf.generate(pixel_values=x)  # generation_config.json alone: start, forced <caption>, greedy
    # what `vqa caption` decodes: no special token but <eos> (bad_words_ids there), at least one token
    want = generate(model, [prompt] * 4, images=x, config=GenerationConfig.for_task("caption"),
                    banned=tok.never_generated).sequences
    got = []
    for row in out_ids.tolist():
        assert row[:2] == prompt
        row = row[2:]
        got.append(row[: row.index(tok.eos_id)] if tok.eos_id in row else row)
    assert got == want and len({tuple(s) for s in want}) > 1


def test_exported_configs_carry_what_the_logits_cannot_show(tmp_path):
    """Checked by value where the logits' tolerance or eval mode cannot tell: each tower's LayerNorm epsilon
    (not transformers' defaults), no dropout (the model in train mode computes what it computes in eval mode),
    the decoder's own token ids are the tokenizer's, and the embedding scale unties the head (transformers 4
    ties lm_head to wte otherwise). A decoder MLP 3 x wide (not GPT-2's default 4 x) loads and computes vqa's
    logits."""
    run = _model_here(tmp_path / "run", dec_width=32, vit_norm_eps=1e-3, dec_norm_eps=1e-4, dec_mlp_ratio=3.0)
    model, tok, _ = checkpoint.load(run)
    hf = load_ved(export_transformers(run, tmp_path / "hf"))

    def eps(module):
        return {m.eps for m in module.modules() if isinstance(m, torch.nn.LayerNorm)}

    assert eps(hf.encoder) == eps(model.vision) == {1e-3}
    assert eps(hf.decoder) == eps(model.decoder) == {1e-4}
    x, ids = images(2), torch.tensor([tok.caption_prompt() + [7, 9, 11]] * 2)
    with torch.no_grad():
        theirs, ours = hf(pixel_values=x, decoder_input_ids=ids).logits, model.teacher_forced(x, ids).logits
        assert (ours - theirs).abs().max() < 1e-4
        assert torch.equal(hf.train()(pixel_values=x, decoder_input_ids=ids).logits, theirs)
    dec = hf.config.decoder
    assert (dec.bos_token_id, dec.eos_token_id, dec.pad_token_id) == (tok.bos_id, tok.eos_id, tok.pad_id)
    assert model.cfg.dec_embed_scale and dec.tie_word_embeddings is False


def test_the_export_leans_on_no_transformers_default(tmp_path, monkeypatch):
    """Every value the exported model computes with is written, so a transformers release with other defaults
    exports the same model: with ViTConfig's and GPT2Config's defaults moved (relu, one channel, no qkv bias,
    dropout 0.5), the folder loads into a model that computes vqa's logits in train mode, and the decoder's
    keywords alone make a cross-attending decoder (what `from_encoder_decoder_configs` would otherwise set)."""
    import transformers

    from vqa.export.hf_export import hf_configs

    moved = {transformers.ViTConfig: dict(hidden_act="relu", num_channels=1, qkv_bias=False, hidden_dropout_prob=0.5,
                                          attention_probs_dropout_prob=0.5),
             transformers.GPT2Config: dict(resid_pdrop=0.5, embd_pdrop=0.5, attn_pdrop=0.5)}
    for cls, defaults in moved.items():
        monkeypatch.setattr(transformers, cls.__name__, lambda _c=cls, _d=defaults, **kw: _c(**{**_d, **kw}))
    run = _model_here(tmp_path / "run", dec_width=32)
    model, tok, _ = checkpoint.load(run)
    folder = export_transformers(run, tmp_path / "hf")
    monkeypatch.undo()
    hf = load_ved(folder).train()
    x, ids = images(2), torch.tensor([tok.caption_prompt() + [7, 9, 11]] * 2)
    with torch.no_grad():
        theirs, ours = hf(pixel_values=x, decoder_input_ids=ids).logits, model.teacher_forced(x, ids).logits
    assert theirs.abs().max() > 1 and (ours - theirs).abs().max() < 1e-4
    dec = transformers.GPT2Config(**hf_configs(model, tok)[1])
    assert dec.add_cross_attention is True and dec.is_decoder is True


def test_a_model_of_one_block_per_tower_exports(tmp_path):
    """One ViT block and one decoder block (the configs read the heads and widths off the first block): the
    exported model computes vqa's logits."""
    run = _model_here(tmp_path / "run", dec_width=48, vit_depth=1, dec_depth=1)
    model, tok, _ = checkpoint.load(run)
    hf = load_ved(export_transformers(run, tmp_path / "hf"))
    x, ids = images(2), torch.tensor([tok.caption_prompt() + [7, 9, 11]] * 2)
    with torch.no_grad():
        theirs, ours = hf(pixel_values=x, decoder_input_ids=ids).logits, model.teacher_forced(x, ids).logits
    assert theirs.abs().max() > 1 and (ours - theirs).abs().max() < 1e-4


def test_inexpressible_model_refused_naming_each_field_nothing_written(tmp_path, capsys):
    from vqa.cli import main

    tok = Tokenizer.train(TEXTS, vocab_size=120)
    cfg = preset("tiny", vit_image_size=32, vit_width=32, vit_depth=1, vit_heads=2, dec_width=32, dec_depth=1,
                 dec_heads=2, **tok.model_ids())  # conv stem, QK-norm in both, memory positions
    run = checkpoint.save(tmp_path / "run", VQAModel(cfg), tok, {})
    out = tmp_path / "hf"
    assert main(["export", "--checkpoint", str(run), "--transformers", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("vqa export: error:")
    for field in ("vit_conv_stem=True", "vit_qk_norm=True", "vit_memory_pos=True", "dec_qk_norm=True"):
        assert field in err
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == [".run.lock", "run"]


def test_a_timm_model_vitmodel_cannot_hold_is_refused_by_name():
    from vqa.export.hf_export import blockers

    small = dict(vit_image_size=32, vit_patch_size=8, vit_width=32, vit_depth=1, vit_heads=2, dec_width=32,
                 dec_depth=1, dec_heads=2)
    assert blockers(VQAModel(preset("small", vit_name="vit_small_patch16_224", **small))) == []
    why = blockers(VQAModel(preset("small", vit_name="vit_base_patch16_reg4_gap_256", **small)))
    assert len(why) == 1 and why[0].startswith("vit_name='vit_base_patch16_reg4_gap_256'") and "prefix" in why[0]


def test_export_output_checks(tmp_path, capsys):
    from vqa.cli import main

    run = _model_here(tmp_path / "run", dec_width=32)
    assert main(["export", "--checkpoint", str(run), "--transformers", str(run / "hf")]) == 2
    assert "--transformers" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("mine")
    assert main(["export", "--checkpoint", str(run), "--transformers", str(tmp_path / "other"), "--force"]) == 2
    assert (tmp_path / "other" / "keep.txt").read_text() == "mine"
    assert main(["export", "--checkpoint", str(run), "--transformers", str(tmp_path / "hf")]) == 0
    assert main(["export", "--checkpoint", str(run), "--transformers", str(tmp_path / "hf"), "--force"]) == 0
    assert (tmp_path / "hf" / "model.safetensors").is_file()


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # three fresh interpreters, ~15 s
def test_transformers_is_optional(tmp_path):
    """The CLI never imports transformers unless an export to it runs; import needs none; without the
    extra, the export says how to install it in one line."""
    src = save_tiny_ved(tmp_path / "src")
    blocked = "import sys; sys.modules['transformers'] = None\n"  # `import transformers` raises ImportError
    code = (blocked + "from vqa.cli import main\n"
            f"rc = main(['import', '--transformers', {str(src)!r}, '--out', {str(tmp_path / 'run')!r}])\n"
            "assert rc == 0, rc\n"
            f"rc = main(['export', '--checkpoint', {str(tmp_path / 'run')!r}, '--transformers', "
            f"{str(tmp_path / 'hf')!r}])\n"
            "assert rc == 1, rc\n")
    r = _python(code)
    assert r.returncode == 0, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert "pip install 'vqa[transformers]'" in line and line.startswith("vqa export: error:")
    assert not (tmp_path / "hf").exists()
    r = _python("import sys\nfrom vqa.cli import build_parser\n"
                "for c in ('caption', 'ask', 'train', 'export', 'import', 'eval', 'data'): build_parser([c])\n"
                "import vqa.inference.predict, vqa.train.trainer, vqa.export.hf_import\n"
                "assert 'transformers' not in sys.modules, 'imported'\n")
    assert r.returncode == 0, r.stderr
