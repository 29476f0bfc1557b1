"""Small shared helpers for the tests: a very small model config, random images, batches, and a cached tiny
model overfit on 8 (image, prompt, target) triples. Everything here runs in milliseconds to seconds on CPU.

Import it as `from helpers import ...` (pytest puts tests/ on sys.path) or `from tests.helpers import ...`.
"""

from __future__ import annotations

import functools

import torch

from vqa.config import ModelConfig
from vqa.model import VQAModel

# ids 0..2 are <pad>, <bos>, <eos> (ModelConfig's defaults); "ordinary" tokens start here
FIRST_TOKEN = 3


def tiny_config(**overrides) -> ModelConfig:
    """A very small ModelConfig: a 1-layer ViT of width 32 on 32 px images in 8 px patches (16 patches + CLS),
    a 2-layer decoder of width 32 with 4 heads, a vocabulary of 50 and at most 32 tokens."""
    fields = dict(
        vit_name="vit_tiny_patch16_224", vit_width=32, vit_depth=1, vit_heads=2,
        vit_image_size=32, vit_patch_size=8,
        dec_width=32, dec_depth=2, dec_heads=4, dec_max_len=32, vocab_size=50,
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def tiny_model(seed: int = 0, **overrides) -> VQAModel:
    """A freshly initialized tiny model (seeded, in eval mode)."""
    torch.manual_seed(seed)
    return VQAModel(tiny_config(**overrides)).eval()


def lively_model(seed: int = 3, std: float = 0.3, **overrides) -> VQAModel:
    """A tiny model whose decoder Linear weights and biases are redrawn with std `std` and whose LayerNorm gains
    are random, so that its greedy output depends on context, position and image. (A freshly initialized
    model just repeats its last token: with the head tied to the embedding, the input embedding dominates.)
    The defaults were picked because they give varied outputs; test_generate*.py rely on them."""
    model = tiny_model(seed, **overrides)
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for mod in model.decoder.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) * std)
                if mod.bias is not None:
                    mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * std)
            elif isinstance(mod, torch.nn.LayerNorm):
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g))
    return model


def random_images(n: int, cfg: ModelConfig, seed: int = 0) -> torch.Tensor:
    """[n, 3, S, S] normalized-looking random images."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, cfg.vit_image_size, cfg.vit_image_size, generator=g)


@torch.no_grad()
def assert_causal(model: VQAModel, min_change: float = 1e-5) -> None:
    """Changing the token at position j never changes the logits before j, and changes every one from j on."""
    images = random_images(1, model.cfg)
    ids = torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])
    base = model.teacher_forced(images, ids).logits
    for j in (1, 4, 7):
        changed = ids.clone()
        changed[0, j] = 40 + j
        out = model.teacher_forced(images, changed).logits
        torch.testing.assert_close(out[:, :j], base[:, :j], atol=1e-6, rtol=0)
        assert (out[:, j:] - base[:, j:]).abs().amax(-1).min() > min_change


def random_tokens(n: int, cfg: ModelConfig, g: torch.Generator) -> list[int]:
    """`n` ordinary token ids (never <pad>, <bos> or <eos>)."""
    return torch.randint(FIRST_TOKEN, cfg.vocab_size, (n,), generator=g).tolist()


def make_batch(prompts: list[list[int]], targets: list[list[int]], pad_id: int = 0):
    """Right-padded teacher-forcing batch: input_ids [B, T] = prompt + target, loss_mask True on the target
    tokens (give targets with their <eos>)."""
    rows = [p + t for p, t in zip(prompts, targets, strict=True)]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompts, rows, strict=True)):
        ids[i, : len(r)] = torch.as_tensor(r)
        mask[i, len(p) : len(r)] = True
    return ids, mask


def overfit_triples(cfg: ModelConfig, n: int = 8, seed: int = 0):
    """`n` random (image, prompt, target) triples; prompts start with <bos> and come in pairs that share the
    same prompt, so the image alone tells the two targets apart. Targets are given without <eos>."""
    g = torch.Generator().manual_seed(seed)
    images = random_images(n, cfg, seed=seed + 1)
    prompts, targets = [], []
    for i in range(n):
        if i % 2 == 0:
            prompt = [cfg.bos_id, *random_tokens(1 + i // 2, cfg, g)]  # lengths 2..n/2+1: padding is exercised
        prompts.append(list(prompt))
        targets.append(random_tokens(2 + i % 3, cfg, g))
    return images, prompts, targets


@functools.lru_cache(maxsize=1)
def overfit_model(max_steps: int = 400):
    """A tiny model trained (AdamW, lr 3e-3) on `overfit_triples` until greedy decoding reproduces every
    target, checked every 10 steps. Returns (model, images, prompts, targets, steps); cached per process."""
    from vqa.decoding.generate import generate

    model = tiny_model(seed=0)
    cfg = model.cfg
    images, prompts, targets = overfit_triples(cfg)
    ids, mask = make_batch(prompts, [t + [cfg.eos_id] for t in targets], cfg.pad_id)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    step = 0
    for step in range(1, max_steps + 1):
        model.train()
        loss = model.teacher_forced(images, ids, loss_mask=mask, return_logits=False).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 10 == 0:
            model.eval()
            if generate(model, prompts, images, max_new_tokens=8).sequences == targets:
                break
    model.eval()
    return model, images, prompts, targets, step
