"""Memory savers: activation checkpointing gives the plain gradients while recomputing every block, and the
estimate printed before a GPU run names the option that would make the step fit (a fake GPU size on CPU)."""

from __future__ import annotations

import torch
from helpers import make_batch, random_images, tiny_model

from vqa.train.build import estimated_bytes, memory_advice
from vqa.weights import lora


def _grads(checkpointing: bool) -> tuple[dict[str, torch.Tensor], int]:
    model = tiny_model(0, dec_dropout=0.1).train()  # dropout: the recomputation must redraw the same masks
    model.set_grad_checkpointing(checkpointing)
    calls = []
    for blk in [*model.decoder.blocks, *model.vision.vit.blocks]:
        blk.register_forward_pre_hook(lambda *_: calls.append(1))  # (recomputation may stop early)
    ids, mask = make_batch([[1, 5, 7], [1, 9]], [[11, 12, 2], [13, 2]])
    torch.manual_seed(5)
    model.teacher_forced(random_images(2, model.cfg), ids, mask).loss.backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}, len(calls)


def test_checkpointed_gradients_equal_plain_ones_and_blocks_are_recomputed():
    plain, plain_calls = _grads(False)
    ckpt, ckpt_calls = _grads(True)
    assert plain.keys() == ckpt.keys() and len(plain) > 10
    for name, g in plain.items():
        assert torch.allclose(ckpt[name], g, atol=1e-6, rtol=0), name
    assert ckpt_calls == 2 * plain_calls  # each block ran again in the backward pass


def test_checkpointing_is_off_outside_training():
    model = tiny_model(0)
    model.set_grad_checkpointing(True)
    ids, _ = make_batch([[1, 5, 7]], [[11, 2]])
    with torch.no_grad():  # eval: no recomputation needed, the same logits
        want = tiny_model(0).teacher_forced(random_images(1, model.cfg), ids).logits
        assert torch.equal(model.teacher_forced(random_images(1, model.cfg), ids).logits, want)


def test_the_estimate_grows_with_the_batch_and_shrinks_with_checkpointing_and_lora():
    model = tiny_model(0, vit_depth=4, dec_depth=4)
    assert estimated_bytes(model, 16) > estimated_bytes(model, 8) > estimated_bytes(model, 8, checkpointing=True)
    full = estimated_bytes(model, 8)
    lora.add_lora(model, 2, 8.0, ("self_attn", "mlp"))
    lora.freeze_base(model, lambda n: n.startswith("decoder.") and ".cross_attn." not in n)
    assert estimated_bytes(model, 8) < full


def test_the_advice_names_the_option_that_fits():
    model = tiny_model(0, vit_depth=4, dec_depth=4)
    b = 64
    need, ckpt = estimated_bytes(model, b), estimated_bytes(model, b, checkpointing=True)
    fits = memory_advice(model, b, total=int(need / 0.9) + 1, checkpointing=False, lora_rank=None)
    assert fits.startswith("estimated peak training memory") and "may not fit" not in fits
    between = int((ckpt + need) / 2 / 0.9)  # checkpointing fits, the plain step does not
    assert "--grad-checkpointing would need" in memory_advice(model, b, between, False, None)
    small = estimated_bytes(model, 8, checkpointing=True)
    advice = memory_advice(model, b, int(small / 0.9) + 1, True, 4)
    assert "--batch-size 8 --accum 8" in advice
    assert "not fit even one image" in memory_advice(model, b, 1000, True, 4)


def test_the_advice_names_lora_where_the_weights_fill_the_memory():
    from vqa.config import TrainConfig
    from vqa.train.build import memory_options

    big = dict(dec_width=128, dec_depth=4, vocab_size=4000)  # weights and optimizer state dominate at 1 image
    model, adapted = tiny_model(0, **big), tiny_model(0, **big)
    memory_options(TrainConfig(lora_rank=16, grad_checkpointing=True), adapted)
    ckpt, lora_ckpt = estimated_bytes(model, 1, checkpointing=True), estimated_bytes(adapted, 1, checkpointing=True)
    assert lora_ckpt < ckpt / 2
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    advice = memory_advice(model, 1, int((lora_ckpt + ckpt) / 2 / 0.9), False, None)
    assert "it may not fit; --lora-rank 16" in advice, advice
    # the estimate leaves the model as it was
    assert not lora.lora_layers(model) and flags == {n: p.requires_grad for n, p in model.named_parameters()}


def test_a_sharded_estimate_keeps_a_share_of_the_state_and_the_gathered_groups_in_full():
    from vqa.train.sharding import gathered_parameters

    model = tiny_model(0, vit_depth=4, dec_depth=4)
    total, b = model.num_parameters(), 8
    activations = estimated_bytes(model, b) - 16 * total  # every parameter trained
    # the groups fully_shard makes: ViT blocks, each decoder block's cross-attention, the rest of each block
    size = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    dec = model.decoder
    groups = ([size(blk) for blk in model.vision.vit.blocks] + [size(blk.cross_attn) for blk in dec.blocks]
              + [size(blk) - size(blk.cross_attn) for blk in dec.blocks])
    root = total - sum(groups)
    assert root > 0 and gathered_parameters(model) == root + sum(sorted(groups)[-2:])
    assert estimated_bytes(model, b, shards=4) == 16 * total // 4 + 4 * gathered_parameters(model) + activations
    assert estimated_bytes(model, b, shards=1) == estimated_bytes(model, b)
    assert estimated_bytes(model, b, shards=8) < estimated_bytes(model, b, shards=2) < estimated_bytes(model, b)


def test_a_ddp_run_whose_state_fills_the_memory_is_told_to_shard_and_a_sharded_run_says_so():
    model = tiny_model(0, dec_width=128, dec_depth=4, vocab_size=4000)  # weights and optimizer state dominate
    ckpt, sharded = estimated_bytes(model, 1, checkpointing=True), estimated_bytes(model, 1, shards=4)
    assert sharded < ckpt
    total = int((sharded + ckpt) / 2 / 0.9)  # sharding over the 4 processes fits, checkpointing does not
    advice = memory_advice(model, 1, total, False, None, world=4)
    assert f"--shard fsdp would need ~{sharded / 2**30:.2f} GiB a process" in advice, advice
    assert "--shard fsdp" not in memory_advice(model, 1, total, False, None)  # one process: nothing to shard
    line = memory_advice(model, 1, total, False, None, shards=4, world=4)
    assert "each of 4 sharded processes" in line and "may not fit" not in line
