"""The optimizers: Muon equals torch.optim.Muon's update, which parameters it takes, and Muon + AdamW
saved and restored mid-run continues exactly."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from vqa.config import preset
from vqa.model.encoder_decoder import VQAModel
from vqa.train.optim import MUON_LR_SCALE, Muon, MuonAdamW, make_optimizer, orthogonalize, param_groups


def _grads(params, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def test_muon_in_bfloat16_is_torchs_muon_with_adamw_matched_rms():
    torch.manual_seed(0)
    ours = [nn.Parameter(torch.randn(12, 5)), nn.Parameter(torch.randn(6, 9))]  # a tall and a wide matrix
    theirs = [nn.Parameter(p.detach().clone()) for p in ours]
    start = [p.detach().clone() for p in ours]
    a = Muon(ours, lr=0.02, weight_decay=0.1, ns_dtype=torch.bfloat16)
    b = torch.optim.Muon(theirs, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for step in range(4):
        _grads(ours, step), _grads(theirs, step)
        a.step(), b.step()
    for p, q in zip(ours, theirs, strict=True):
        assert torch.equal(p, q)
    assert not any(torch.allclose(p, s0) for p, s0 in zip(ours, start, strict=True))  # (they did move)


def test_float32_newton_schulz_orthogonalizes():
    g = torch.randn(96, 288, generator=torch.Generator().manual_seed(1))
    for m in (g, g.T):  # wide and tall
        s = torch.linalg.svdvals(orthogonalize(m))
        # the quintic iteration trades exactness for speed: singular values land near 1 (Jordan et al.: 0.5-1.5)
        assert s.min() > 0.5 and s.max() < 1.3, (s.min(), s.max())
        assert orthogonalize(m).shape == m.shape and orthogonalize(m).dtype == torch.float32
    # and it is not the bfloat16 iteration (which would lose ~3 digits)
    assert not torch.equal(orthogonalize(g), orthogonalize(g, dtype=torch.bfloat16).float())


def test_muon_refuses_parameters_that_are_not_matrices():
    with pytest.raises(ValueError, match="2-D"):
        Muon([nn.Parameter(torch.zeros(3, 3, 3))])


def test_muon_takes_the_linear_weights_and_adamw_the_rest():
    model = VQAModel(preset("tiny", vocab_size=50))
    groups = param_groups(model, lr=1e-3, vit_lr=3e-4, weight_decay=0.05, muon=True)
    in_muon = {id(p) for g in groups if g["muon"] for p in g["params"]}
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    assert in_muon == linear and linear  # every attention / MLP matrix, and nothing else
    names = {id(p): n for n, p in model.named_parameters()}
    others = [names[id(p)] for g in groups if not g["muon"] for p in g["params"]]
    assert "decoder.embed.weight" in others and "vision.vit.pos_embed" in others
    assert any("patch_embed" in n for n in others)  # the conv stem (4-D) stays with AdamW
    assert sorted(g["base_lr"] for g in groups if g["muon"]) == pytest.approx([MUON_LR_SCALE * 3e-4,
                                                                               MUON_LR_SCALE * 1e-3])
    assert {g["base_lr"] for g in groups if not g["muon"]} == {3e-4, 1e-3}
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


def _run(model, opt, steps, start=0):
    for s in range(start, start + steps):
        _grads(model.parameters(), 100 + s)
        opt.step()
        opt.zero_grad()


def test_muon_adamw_state_dict_round_trip_continues_exactly():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.LayerNorm(8), nn.Linear(8, 4))
    twin = copy.deepcopy(model)
    opt = make_optimizer(model, 1e-2, 1e-2, 0.05, kind="muon")
    assert isinstance(opt, MuonAdamW)
    _run(model, opt, 6)  # uninterrupted

    first = make_optimizer(twin, 1e-2, 1e-2, 0.05, kind="muon")
    _run(twin, first, 3)
    saved = copy.deepcopy(first.state_dict())
    again = make_optimizer(twin, 1e-2, 1e-2, 0.05, kind="muon")  # a fresh process: new optimizer, loaded state
    again.load_state_dict(saved)
    _run(twin, again, 3, start=3)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)
    with pytest.raises(ValueError, match="--optimizer"):
        again.load_state_dict(torch.optim.AdamW(model.parameters()).state_dict())


def test_unknown_optimizer_is_refused():
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        make_optimizer(nn.Linear(2, 2), 1e-3, 1e-3, 0.0, kind="sgd")


def test_muon_lr_scale_sets_the_step_and_the_decay_of_muons_matrices():
    """--muon-lr-scale s: Muon's matrices get lr s x --lr; an update's RMS is 0.2 x that lr (RMS-matched to
    AdamW's typical update), and the weight decay multiplies them by 1 - s x lr x wd per step."""
    torch.manual_seed(0)
    model = VQAModel(preset("tiny", vocab_size=40))
    lr, wd = 1e-3, 0.1
    for scale in (1.0, 4.0):
        opt = make_optimizer(model, lr, lr, wd, kind="muon", muon_scale=scale)
        assert [g["base_lr"] for g in opt.param_groups if g["muon"]] == pytest.approx([scale * lr] * 2)  # dec, vit
        assert [g["base_lr"] for g in opt.param_groups if not g["muon"]] == pytest.approx([lr] * 4)
    w = nn.Parameter(torch.randn(64, 96))
    before = w.detach().clone()
    muon = Muon([w], lr=4e-3, weight_decay=0.0, nesterov=False, momentum=0.0)
    w.grad = torch.randn(64, 96, generator=torch.Generator().manual_seed(3))
    muon.step()
    rms = (w.detach() - before).pow(2).mean().sqrt().item()
    assert rms == pytest.approx(0.2 * 4e-3, rel=0.3)  # Newton-Schulz gives singular values near, not at, 1
    w.grad = torch.zeros_like(w)
    decayed = Muon([w], lr=4e-3, weight_decay=0.5)
    start = w.detach().clone()
    decayed.step()
    torch.testing.assert_close(w.detach(), start * (1 - 4e-3 * 0.5))
