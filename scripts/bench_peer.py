"""Our model against a Hugging Face peer of the same size, measured in one run, alternating ours/peer per repeat.

    .venv/bin/pip install -e '.[bench]'                  # transformers (never a runtime dependency)
    .venv/bin/python scripts/bench_peer.py               # tiny and small, the default sizes
    .venv/bin/python scripts/bench_peer.py --quick       # fewer repeats and smaller batches (about a minute)
    .venv/bin/python scripts/bench_peer.py --presets tiny --device cuda --json peer.json
    .venv/bin/python scripts/bench_peer.py --variants eager     # without the compiled and int8 rows

The peer is transformers' VisionEncoderDecoderModel: a ViTModel encoder and a GPT2LMHeadModel decoder with
add_cross_attention=True, random init, at our preset's sizes (image size, patch, widths, depths, heads, MLP ratio
4, vocabulary, max positions, no dropout, exact GELU, default attention implementation = SDPA).

Generation variants of ours (--variants): eager (generate's default), compiled (generate(compile=True): the
torch.compile'd decode step, weights frozen in) and int8 (dynamic int8 linear layers, compiled step and encoder;
CPU only), each against the same float32 peer. Compiled variants are compiled before the timed runs.

Training: the same VQA batch for both (images, 4 questions each, loss on the answer tokens only). The peer has no
image_index, so each image is repeated once per question (what a user of it would do) and its ViT encodes every
copy. Generation: greedy, exactly 16 new tokens (ours: min_new_tokens=16; peer: eos_token_id=None), same prompts.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import _bench_common as C
import torch

from vqa.decoding.generate import generate

TARGETS = {"train": 2.0, "gen_b1": 3.0, "gen_b32": 2.0}  # ours/peer speed-ups asked for; memory: no higher


def build_peer(cfg, device):
    from transformers import GPT2Config, GPT2LMHeadModel, VisionEncoderDecoderModel, ViTConfig, ViTModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    import timm

    vit = timm.create_model(cfg.vit_name, pretrained=False)  # the widths the preset keeps from timm
    vw, vd = cfg.vit_width or vit.embed_dim, cfg.vit_depth or len(vit.blocks)
    vh = cfg.vit_heads or vit.blocks[0].attn.num_heads
    del vit
    enc = ViTModel(ViTConfig(hidden_size=vw, num_hidden_layers=vd, num_attention_heads=vh, intermediate_size=4 * vw,
                             image_size=cfg.vit_image_size, patch_size=cfg.vit_patch_size, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0, layer_norm_eps=1e-6), add_pooling_layer=False)
    dec = GPT2LMHeadModel(GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.dec_max_len, n_embd=cfg.dec_width,
                                     n_layer=cfg.dec_depth, n_head=cfg.dec_heads,
                                     n_inner=int(cfg.dec_mlp_ratio * cfg.dec_width),
                                     activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     add_cross_attention=True, bos_token_id=C.BOS, eos_token_id=C.EOS,
                                     pad_token_id=C.PAD))
    torch.manual_seed(0)
    model = VisionEncoderDecoderModel(encoder=enc, decoder=dec).to(device)
    model.config.decoder_start_token_id, model.config.pad_token_id = C.BOS, C.PAD
    gc = model.generation_config
    gc.eos_token_id, gc.pad_token_id, gc.decoder_start_token_id, gc.bos_token_id = None, C.PAD, C.BOS, C.BOS
    return model


def peer_trainer(model, device):
    """The peer's training step on our batch: each image repeated per question, labels = the next token on
    answer positions (-100 elsewhere; VisionEncoderDecoderModel does not shift labels given decoder_input_ids)."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), weight_decay=0.05,
                            fused=True if device.type == "cuda" else None)
    dt = C.amp_dtype(device)

    def step(b):
        ids, lm = b["input_ids"], b["loss_mask"]
        labels = torch.full_like(ids, -100)
        labels[:, :-1] = ids[:, 1:].masked_fill(~lm[:, 1:], -100)
        pixels = b["images"].index_select(0, b["image_index"])  # one copy of the image per question
        with torch.autocast(device.type, dtype=dt or torch.float32, enabled=dt is not None):
            out = model(pixel_values=pixels, decoder_input_ids=ids, labels=labels)
        return C.update(model, opt, out.loss)

    return step


def gen_fns(ours, peer, n_prompts, n_images, device, decode_only=False, compile=False):
    """Greedy generation of exactly 16 tokens for `n_prompts` prompts over `n_images` images (each image's
    prompts consecutive). decode_only: both get their encoded images (ours: memory, peer: encoder_outputs).
    compile: ours decodes through the compiled step (generate(compile=True))."""
    cfg = ours.cfg
    g = torch.Generator().manual_seed(2)
    images = torch.randn(n_images, 3, cfg.vit_image_size, cfg.vit_image_size, generator=g).to(device)
    index = torch.arange(n_images, device=device).repeat_interleave(n_prompts // n_images)
    ps = C.prompts(n_prompts)
    pixels, ids = images.index_select(0, index), torch.as_tensor(ps, device=device)
    dt = C.amp_dtype(device)
    ac = lambda: torch.autocast(device.type, dtype=dt or torch.float32, enabled=dt is not None)  # noqa: E731
    inputs_o, inputs_p = dict(images=images), dict(inputs=pixels)
    if decode_only:
        with torch.inference_mode(), ac():
            inputs_o = dict(memory=ours.encode(images))
            inputs_p = dict(encoder_outputs=peer.encoder(pixel_values=pixels))

    def run_ours():
        with torch.inference_mode(), ac():
            out = generate(ours, ps, **inputs_o, image_index=None if n_images == n_prompts else index,
                           max_new_tokens=C.NEW_TOKENS, min_new_tokens=C.NEW_TOKENS, compile=compile)
        assert all(len(s) == C.NEW_TOKENS for s in out.sequences)

    def run_peer():
        with torch.inference_mode(), ac():
            out = peer.generate(**inputs_p, decoder_input_ids=ids, max_new_tokens=C.NEW_TOKENS, do_sample=False,
                                num_beams=1, use_cache=True)
        assert out.shape[1] == ids.shape[1] + C.NEW_TOKENS

    return run_ours, run_peer


def alternate(fa, fb, device, repeats):
    """Median seconds of fa and fb run in turn (ab ab ab ...) after one warm-up run of each (4 x the repeats
    when a pair takes under a second); the peak memory
    of each: tensor memory (C.tensor_peak, one more run each) and, on CPU, the largest peak-RSS rise over the
    timed runs (C.PeakMemory; its set-up is outside the timing)."""
    warm = C.timed(fa, device) + C.timed(fb, device)
    if warm < 1.0:  # cheap cases (batch 1) are the noisiest: more repeats cost little
        repeats *= 4
    res = {fa: ([], 0), fb: ([], 0)}
    for _ in range(repeats):
        for f in (fa, fb):
            with C.PeakMemory(device) as pm:
                t = C.timed(f, device)
            res[f] = (res[f][0] + [t], max(res[f][1], pm.bytes))
    return (C.median(res[fa][0]), C.median(res[fb][0]), C.tensor_peak(fa, device), C.tensor_peak(fb, device),
            res[fa][1], res[fb][1])


# The peer (ViT + GPT-2) has neither a convolutional stem nor QK-norm: by default ours is built without them
# too, so both sides do the same work; --as-preset times our preset exactly as configured.
LIKE_FOR_LIKE = dict(vit_conv_stem=False, vit_qk_norm=False, dec_qk_norm=False, vit_memory_pos=False)


def bench(name, args, device, limits=None):
    ours = C.build_ours(name, device, **({} if args.as_preset else LIKE_FOR_LIKE))
    peer = build_peer(ours.cfg, device)
    n_ours, n_peer = ours.num_parameters(), sum(p.numel() for p in peer.parameters())
    print(f"[{name}] ours {n_ours / 1e6:.2f} M parameters, peer {n_peer / 1e6:.2f} M", file=sys.stderr)
    small = ours.cfg.vit_image_size > 100
    n_img = (2 if args.quick else 4) if small else (8 if args.quick else 32)
    batch = C.vqa_batch(ours.cfg, n_img, device)
    so, sp = C.ours_trainer(ours, device), peer_trainer(peer, device)
    t_o, t_p, m_o, m_p, r_o, r_p = alternate(lambda: so(batch), lambda: sp(batch), device, args.repeats)
    rows = [dict(metric=f"train images/s ({n_img} img x {C.QUESTIONS} q)", ours=n_img / t_o, peer=n_img / t_p,
                 higher=True, target=TARGETS["train"], mem_ours=m_o, mem_peer=m_p, rss_ours=r_o, rss_peer=r_p)]
    ours.eval(), peer.eval()
    b32 = 8 if args.quick and small else 32
    cases = [(1, 1, False, "gen_b1"), (b32, b32, False, "gen_b32"), (b32, b32 // C.QUESTIONS, False, None),
             (1, 1, True, None), (b32, b32, True, None)]
    for n_prompts, n_images, dec_only, key in cases:
        fo, fp = gen_fns(ours, peer, n_prompts, n_images, device, dec_only)
        t_o, t_p, m_o, m_p, r_o, r_p = alternate(fo, fp, device, args.repeats)
        what = ("decode only" if dec_only else "generate") + f" ms, batch {n_prompts}"
        what += "" if n_images == n_prompts else f" ({n_images} img x {C.QUESTIONS} q)"
        rows.append(dict(metric=what, ours=t_o * 1e3, peer=t_p * 1e3, higher=False,
                         bound_batch=n_prompts if n_images == n_prompts and not dec_only else None,
                         target=TARGETS[key] if key else None, mem_ours=m_o, mem_peer=m_p, rss_ours=r_o, rss_peer=r_p))
        print(f"[{name}] {what}: ours {t_o * 1e3:.1f} peer {t_p * 1e3:.1f}", file=sys.stderr)
    for variant in args.variants:
        if variant == "eager":
            continue
        model = ours
        if variant == "int8":
            import copy

            from vqa.decoding.precision import quantize_int8

            model = copy.deepcopy(ours).eval()
            quantize_int8(model)
        for n_prompts, key in ((1, "gen_b1"), (b32, "gen_b32")):
            fo, fp = gen_fns(model, peer, n_prompts, n_prompts, device, compile=True)
            t0 = time.time()
            fo()  # compiling, before anything is timed
            compiling = time.time() - t0
            t_o, t_p, m_o, m_p, r_o, r_p = alternate(fo, fp, device, args.repeats)
            what = f"generate ms, batch {n_prompts}, ours {'compiled step' if variant == 'compiled' else 'int8'}"
            rows.append(dict(metric=what, ours=t_o * 1e3, peer=t_p * 1e3, higher=False, target=TARGETS[key],
                             bound_batch=n_prompts,
                             mem_ours=m_o, mem_peer=m_p, rss_ours=r_o, rss_peer=r_p))
            print(f"[{name}] {what}: ours {t_o * 1e3:.1f} peer {t_p * 1e3:.1f} (compiling {compiling:.0f} s)",
                  file=sys.stderr)
    if limits is not None:  # the physical bound of our float32 generation rows (one image per prompt)
        bounds = {}
        for r in rows:
            n = r.get("bound_batch")
            if n is not None:
                if n not in bounds:
                    bounds[n] = C.generation_bound(ours, device, n, limits)["bound_ms"]
                r["bound"] = bounds[n]
    for r in rows:
        r["speedup"] = r["ours"] / r["peer"] if r["higher"] else r["peer"] / r["ours"]
        r["met"] = None if r["target"] is None else bool(r["speedup"] >= r["target"])
        r["mem_ratio"] = r["mem_ours"] / max(r["mem_peer"], 1)
        r["preset"] = name
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="tiny,small")
    p.add_argument("--device", default="auto")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="2 repeats, smaller batches for small (a minute or two)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--variants", default="eager,compiled,int8",
                   help="our generation variants: eager (always), compiled, int8 (CPU only)")
    p.add_argument("--no-bound", action="store_true", help="skip measuring the machine and the physical bounds")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--as-preset", action="store_true",
                   help="time our presets as configured (tiny: + conv stem and QK-norm, which the peer lacks)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = min(args.repeats, 2)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    device = C.pick_device(args.device)
    args.variants = [v for v in args.variants.split(",") if v]
    if device.type != "cpu" and "int8" in args.variants:
        args.variants.remove("int8")  # int8 is for CPUs
    limits = None if args.no_bound else C.machine_limits(device)
    rows = [r for name in args.presets.split(",") for r in bench(name.strip(), args, device, limits)]
    print(f"\n{C.environment(device)}, median of {args.repeats} alternating repeats "
          "(x4 where a pair of runs takes < 1 s)\n")
    fmt = lambda v: f"{v:.1f}" if v >= 10 else f"{v:.2f}"  # noqa: E731
    cpu = device.type == "cpu"
    if limits is not None:
        print(f"machine: {limits['bandwidth'] / 1e9:.1f} GB/s memory read, {limits['gemm'] / 1e9:.0f} GFLOP/s GEMM; "
              "bound: the least time our generation can take here (scripts/bench.py's docstring)\n")
    print(C.table(
        ["preset", "metric", "ours", "peer", "speed-up ours/peer", "target", "ours / bound",
         "tensor peak MiB ours / peer", "memory ours/peer"] + (["peak RSS rise MiB ours / peer"] if cpu else []),
        [[r["preset"], r["metric"], fmt(r["ours"]), fmt(r["peer"]), f"{r['speedup']:.2f}x",
          "-" if r["target"] is None else f">= {r['target']:g}x " + ("met" if r["met"] else "MISSED"),
          f"{r['ours'] / r['bound']:.2f}x ({fmt(r['bound'])})" if r.get("bound") else "-",
          f"{C.mib(r['mem_ours'])} / {C.mib(r['mem_peer'])}",
          f"{r['mem_ratio']:.2f}" + (" ok" if r["mem_ratio"] <= 1 else " HIGHER")]
         + ([f"{C.mib(r['rss_ours'])} / {C.mib(r['rss_peer'])}"] if cpu else []) for r in rows]))
    if args.json:
        C.write_json(args.json, device, args.repeats, limits=limits, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
