"""How a Predictor runs its model, on its own (`vqa.decoding.precision`): the precision asked for, the
images' dtype that goes with it, and when decoding is compiled (the Predictor through it: test_precision.py)."""

from __future__ import annotations

import pytest
import torch

from vqa.decoding.precision import apply_run_policy
from vqa.errors import InputError

CPU = torch.device("cpu")


def test_a_cpu_runs_float32_eagerly_unless_told_otherwise():
    model = torch.nn.Linear(4, 4)
    policy = apply_run_policy(model, CPU)
    assert (policy.precision, policy.dtype, policy.compile, policy.notice) == ("float32", torch.float32, False, None)
    assert apply_run_policy(model, CPU, compile=True).compile is True


def test_a_dtype_casts_the_weights_and_the_images_go_in_as_it():
    model = torch.nn.Linear(4, 4)
    policy = apply_run_policy(model, CPU, dtype="bf16")
    assert policy.precision == "bfloat16" and policy.dtype == torch.bfloat16
    assert model.weight.dtype == torch.bfloat16


def test_bad_settings_are_input_errors():
    with pytest.raises(InputError, match="quantize must be 'int8'"):
        apply_run_policy(torch.nn.Linear(2, 2), CPU, quantize="int4")
    with pytest.raises(InputError, match="not both"):
        apply_run_policy(torch.nn.Linear(2, 2), CPU, quantize="int8", dtype=torch.bfloat16)
