"""Training's loss (`VQAModel.forward`: `model(images, rows)`): each task's target tokens weighted, equal to
the model's own teacher-forced loss, unchanged by padding (for torch.compile's few shapes), defined once in
the package; the step's gradient clipped as asked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from helpers import random_images, tiny_model

import vqa
from vqa.data.collate import collate
from vqa.train.step import StepRunner, StepStats


def items(model, g: torch.Generator):
    """Two images, each with 2 short VQA rows (prompt 3, target 2) and 1 long caption row (prompt 2,
    target 7): rows as the dataset gives them."""
    cfg = model.cfg
    images = random_images(2, cfg)
    out = []
    for k in range(2):
        rows = []
        for task, p, t, n in (("vqa", 3, 2, 2), ("caption", 2, 7, 1)):
            for _ in range(n):
                ids = torch.randint(3, cfg.vocab_size, (p + t,), generator=g).tolist()
                rows.append(dict(input_ids=ids, loss_mask=[False] * p + [True] * t, task=task, meta={}, prompt_len=p))
        out.append(dict(image=images[k], rows=rows))
    return out


def loss(model, its, vqa: float, caption: float, multiple: int = 1) -> torch.Tensor:
    b = collate(its, pad_id=0, pad_multiple=multiple, task_weights={"vqa": vqa, "caption": caption})
    return model(b.images, b.packed)


def teacher_forced(model, its, task: str) -> tuple[torch.Tensor, int]:
    """(the model's own mean loss over one task's rows, their target count), by `VQAModel.teacher_forced`."""
    rows = [(k, r) for k, it in enumerate(its) for r in it["rows"] if r["task"] == task]
    images = torch.stack([it["image"] for it in its])
    out = model.teacher_forced(images, torch.tensor([r["input_ids"] for _, r in rows]),
                               loss_mask=torch.tensor([r["loss_mask"] for _, r in rows]),
                               image_index=torch.tensor([k for k, _ in rows]), return_logits=False)
    return out.loss, out.n_targets


@torch.no_grad()
def test_weights_weigh_each_tasks_target_tokens():
    model = tiny_model()
    its = items(model, torch.Generator().manual_seed(0))
    only_vqa, only_cap = loss(model, its, 1.0, 0.0), loss(model, its, 0.0, 1.0)
    torch.testing.assert_close(loss(model, its, 1.0, 1.0), only_vqa + only_cap)
    torch.testing.assert_close(loss(model, its, 1.0, 0.5), only_vqa + 0.5 * only_cap)
    # a task's sum over its tokens is the model's own teacher-forced mean loss times the token count
    for task, part, n in (("vqa", only_vqa, 2 * 2 * 2), ("caption", only_cap, 2 * 7)):
        mean, count = teacher_forced(model, its, task)
        assert count == n
        assert float(part) == pytest.approx(float(mean) * n, rel=1e-5)
    b = collate(its, pad_id=0, task_weights={"vqa": 1.0, "caption": 0.5})
    assert b.packed.weighted_targets == 2 * 2 * 2 + 0.5 * 2 * 7


def test_the_package_defines_its_loss_once():
    """One cross-entropy in vqa/ (`vqa.model.encoder_decoder.target_loss`): training's loss and the
    teacher-forced one are the same definition, so they cannot drift apart."""
    package = Path(vqa.__file__).parent
    found = [f"{path.relative_to(package)}:{n}" for path in sorted(package.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\b(cross_entropy|nll_loss)\(", line)]
    assert len(found) == 1 and found[0].startswith("model/encoder_decoder.py:"), found


@torch.no_grad()
def test_padding_to_multiples_changes_nothing():
    model = tiny_model()
    its = items(model, torch.Generator().manual_seed(1))
    assert float(loss(model, its, 1.0, 0.5, multiple=8)) == pytest.approx(float(loss(model, its, 1.0, 0.5)), rel=1e-5)


def test_gradients_match_the_models_own_loss():
    """The training loss's gradient / n equals the gradient of the model's mean loss (one task)."""
    model = tiny_model()
    its = items(model, torch.Generator().manual_seed(2))
    model.zero_grad()
    (loss(model, its, 0.0, 1.0, multiple=8) / (2 * 7)).backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    teacher_forced(model, its, "caption")[0].backward()
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(ours[n], p.grad, atol=1e-6, rtol=1e-4, msg=n)


def test_grad_clip_bounds_the_norm_of_the_steps_gradient():
    """--grad-clip: with plain SGD at lr 1 a step moves the weights by exactly the (clipped) gradient."""
    moved = {}
    for clip in (0.0, 1e-3):
        model = tiny_model().train()
        params = [p for p in model.parameters() if p.requires_grad]
        before = [p.detach().clone() for p in params]
        runner = StepRunner(model, torch.optim.SGD(params, lr=1.0),
                            torch.amp.GradScaler("cpu", enabled=False), params, torch.device("cpu"), grad_clip=clip)
        runner([collate(items(model, torch.Generator().manual_seed(0)), pad_id=0,
                        task_weights={"vqa": 1.0, "caption": 0.5})])
        moved[clip] = float(torch.cat([(p.detach() - b).flatten() for p, b in zip(params, before, strict=True)]).norm())
    assert moved[0.0] > 0.1 and moved[1e-3] == pytest.approx(1e-3, rel=1e-3)


def test_a_steps_stats_read_back_the_mean_loss_and_the_callers_values():
    """StepRunner returns [summed loss, weighted target count, *extra]; read, the loss is the mean per target
    (a step without targets divides by 1) and the extra values come back in order."""
    stats = StepStats.read(torch.tensor([6.0, 4.0, 1.0, 250.0]))
    assert (stats.loss, stats.extra) == (1.5, (1.0, 250.0))
    assert StepStats.read(torch.tensor([0.5, 0.0])).loss == 0.5 and StepStats.read(torch.tensor([0.5, 0.0])).extra == ()
