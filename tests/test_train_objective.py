"""The training objective: task groups share one encoding, each task's tokens are weighted, and padding
(for torch.compile's few shapes) changes nothing."""

from __future__ import annotations

import pytest
import torch
from helpers import random_images, tiny_model

from vqa.data.collate import collate
from vqa.train.objective import Objective


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


@torch.no_grad()
def test_weights_weigh_each_tasks_target_tokens():
    model = tiny_model()
    objective = Objective(model)
    batch = collate(items(model, torch.Generator().manual_seed(0)), pad_id=0)
    vqa, cap = batch.groups
    assert (vqa.task, vqa.n_targets, cap.task, cap.n_targets) == ("vqa", 2 * 2 * 2, "caption", 2 * 7)
    total = objective(batch.images, batch.groups, [1.0, 1.0])
    only_vqa = objective(batch.images, [vqa], [1.0])
    only_cap = objective(batch.images, [cap], [1.0])
    torch.testing.assert_close(total, only_vqa + only_cap)
    torch.testing.assert_close(objective(batch.images, batch.groups, [1.0, 0.0]), only_vqa)
    torch.testing.assert_close(objective(batch.images, batch.groups, [1.0, 0.5]), only_vqa + 0.5 * only_cap)
    # a group's sum over its tokens is the model's own teacher-forced mean loss times the token count
    for g, part in ((vqa, only_vqa), (cap, only_cap)):
        out = model(batch.images, g.input_ids, loss_mask=g.loss_mask, image_index=g.image_index, return_logits=False)
        assert out.n_targets == g.n_targets
        assert float(part) == pytest.approx(float(out.loss) * g.n_targets, rel=1e-5)


@torch.no_grad()
def test_padding_to_multiples_changes_nothing():
    model = tiny_model()
    objective = Objective(model)
    its = items(model, torch.Generator().manual_seed(1))
    plain, padded = collate(its, pad_id=0), collate(its, pad_id=0, pad_multiple=8)
    assert padded.groups[0].input_ids.shape[0] == 8 and plain.groups[0].input_ids.shape[0] == 4
    a = objective(plain.images, plain.groups, [1.0, 0.5])
    b = objective(padded.images, padded.groups, [1.0, 0.5])
    assert float(b) == pytest.approx(float(a), rel=1e-5)


def test_gradients_match_the_models_own_loss():
    """The objective's gradient / n equals the gradient of the model's mean loss (one group)."""
    model = tiny_model()
    batch = collate(items(model, torch.Generator().manual_seed(2)), pad_id=0, pad_multiple=8)
    g = batch.groups[1]
    model.zero_grad()
    (Objective(model)(batch.images, [g], [1.0]) / g.n_targets).backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    rows = slice(0, g.rows)
    model(batch.images, g.input_ids[rows], loss_mask=g.loss_mask[rows], image_index=g.image_index[rows]).loss.backward()
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(ours[n], p.grad, atol=1e-6, rtol=1e-4, msg=n)


def test_a_batch_without_any_text_row_gives_a_zero_loss_that_backpropagates():
    """A batch whose samples were all unusable still makes a step: zero loss, zero gradients everywhere."""
    model = tiny_model()
    images = random_images(2, model.cfg)
    batch = collate([dict(image=images[0], rows=[]), dict(image=images[1], rows=[])], pad_id=0)
    assert batch.groups == []
    loss = Objective(model)(batch.images, batch.groups, [])
    loss.backward()
    assert float(loss.detach()) == 0.0
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_grad_clip_bounds_the_norm_of_the_steps_gradient():
    """--grad-clip: with plain SGD at lr 1 a step moves the weights by exactly the (clipped) gradient."""
    from vqa.train.step import StepRunner

    moved = {}
    for clip in (0.0, 1e-3):
        model = tiny_model().train()
        params = [p for p in model.parameters() if p.requires_grad]
        before = [p.detach().clone() for p in params]
        runner = StepRunner(Objective(model), torch.optim.SGD(params, lr=1.0), torch.amp.GradScaler("cpu", enabled=False),
                            params, torch.device("cpu"), {"vqa": 1.0, "caption": 0.5}, grad_clip=clip)
        runner([collate(items(model, torch.Generator().manual_seed(0)), pad_id=0)])
        moved[clip] = float(torch.cat([(p.detach() - b).flatten() for p, b in zip(params, before, strict=True)]).norm())
    assert moved[0.0] > 0.1 and moved[1e-3] == pytest.approx(1e-3, rel=1e-3)
