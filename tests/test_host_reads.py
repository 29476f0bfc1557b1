"""Decoding never makes the host wait for the device more than once a token, and answers run in the precision
that suits the device (bf16 on GPUs with bf16 tensor cores, float32 elsewhere).

`vqa.device.count_host_reads` counts the Python calls that copy a tensor's values to the host (tolist, item,
bool/float/int of a tensor, .cpu(), ...): on CUDA each waits for every queued kernel. On a CPU they cost
nothing, so they are counted rather than timed."""

from __future__ import annotations

import pytest
import torch
from helpers import FIRST_TOKEN, lively_model, random_images, tiny_model
from torch.utils._python_dispatch import TorchDispatchMode

from vqa.decoding.generate import generate
from vqa.device import count_host_reads, inference_dtype

NEW = 10


def prompts(n: int) -> list[list[int]]:
    return [[1] + [FIRST_TOKEN + (3 * i + j) % 40 for j in range(1 + i % 4)] for i in range(n)]  # 2-5 tokens


def test_the_counter_counts_reads_and_nothing_else():
    x = torch.arange(4.0)
    with count_host_reads() as c:
        y = (x * 2).sum()  # device work: no read
        x.to("cpu")  # stays where it is: no read
        bool(y > 0), float(y), int(x[1]), x.tolist(), y.item(), x.numpy()  # noqa: B018 (six reads)
    assert c.count == 6, c.calls


@pytest.mark.parametrize("method, extra, most", [
    ("greedy", {}, 3),  # the tokens and scores, at the end
    ("sample", {"seed": 0, "top_k": 5}, 3),
    ("beam", {"num_beams": 4}, NEW + 2),  # one read of the step's top candidates, each step
])
def test_decoding_reads_the_device_at_most_once_a_token(method, extra, most):
    model = lively_model()
    ps = prompts(6)
    with count_host_reads() as c:
        out = generate(model, ps, random_images(len(ps), model.cfg), method=method, max_new_tokens=NEW,
                       min_new_tokens=NEW, **extra)
    assert all(len(s) == NEW for s in out.sequences)
    assert c.count <= most, c.calls


def test_greedy_that_may_stop_early_reads_once_a_step_at_most():
    model = lively_model()
    ps = prompts(6)
    with count_host_reads() as c:
        generate(model, ps, random_images(len(ps), model.cfg), max_new_tokens=NEW)
    assert c.count <= NEW + 2, c.calls


class SyncingOps(TorchDispatchMode):
    """The aten ops run inside that make the host wait for the device: a scalar read (`item`, `bool`, `int` of a
    tensor, `torch.equal`) or an output whose size depends on the values (`nonzero`, `masked_select`, indexing
    with a bool mask). `count_host_reads` sees the Python calls; this sees the ops, those inside torch too."""

    SCALAR = {"_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero", "masked_select"}

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        masks = name.startswith("index") and len(args) > 1 and isinstance(args[1], (list, tuple)) and any(
            torch.is_tensor(i) and i.dtype == torch.bool for i in args[1])
        if name in self.SCALAR or masks:
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


def test_the_op_counter_counts_the_ops_that_wait_and_nothing_else():
    x = torch.arange(4.0)
    with SyncingOps() as c:
        (x * 2).sum(), x[x > 1], x.index_select(0, torch.tensor([1]))  # noqa: B018 (one wait: the bool mask)
        x.nonzero(), bool(x[1]), torch.equal(x, x), x[2].item()  # noqa: B018 (four)
    assert len(c.ops) == 5, c.ops


@pytest.mark.parametrize("method, extra", [("greedy", {}), ("beam", {"num_beams": 3}), ("sample", {"seed": 0})])
def test_an_eager_decoding_waits_for_the_device_once_a_token_at_most(method, extra):
    """Counted at the ops: N tokens, each step's stop check the one wait, for padded prompts with an answer
    vocabulary or banned tokens (what the Predictor decodes with)."""
    model = lively_model()
    ps = prompts(6)
    for restrict in ({"vocab": list(range(FIRST_TOKEN, 40))}, {"banned": [0, 1]}):
        with SyncingOps() as c:
            out = generate(model, ps, random_images(len(ps), model.cfg), method=method, max_new_tokens=NEW,
                           **restrict, **extra)
        assert max(len(s) for s in out.sequences) > 1
        assert len(c.ops) <= NEW + 2, c.ops


def test_the_cache_takes_keys_in_its_own_dtype():
    """Under CUDA autocast a QK-normed key leaves its LayerNorm in float32 while the values come from a bf16
    matmul: the cache stores both in its own dtype (this crashed on an H100: index_copy_ of BFloat16 into
    Float)."""
    from vqa.model.attention import StaticKVCache

    k = torch.zeros(1, 2, 4, 8)
    cache = StaticKVCache(k, k.clone(), torch.tensor([1]))
    keys, values = cache.append(torch.ones(1, 2, 1, 8), torch.full((1, 2, 1, 8), 2.0, dtype=torch.bfloat16))
    assert keys.dtype == values.dtype == torch.float32
    assert keys[0, :, 1].eq(1).all() and values[0, :, 1].eq(2).all() and not values[0, :, 0].any()


def test_generation_under_autocast():
    model = tiny_model(dec_qk_norm=True)
    ps = prompts(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = generate(model, ps, random_images(len(ps), model.cfg), max_new_tokens=4, min_new_tokens=4)
    assert [len(s) for s in out.sequences] == [4, 4, 4]


def test_answers_run_in_bf16_on_gpus_with_bf16_tensor_cores_and_float32_elsewhere(monkeypatch):
    assert inference_dtype(torch.device("cpu")) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert inference_dtype(torch.device("cuda")) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert inference_dtype(torch.device("cuda")) == torch.float32


def test_the_predictor_defaults_to_the_devices_precision_and_float32_is_selectable():
    from vqa.inference.predict import Predictor

    assert Predictor(tiny_model(), tokenizer=None).precision == "float32"  # on this CPU
    assert Predictor(tiny_model(), tokenizer=None, dtype="bf16").precision == "bfloat16"
