"""Bad (and unusual but legitimate) inputs to the public API of probs, sampling, processors,
penalties and best_of_n: each bad argument raises a ValueError naming the argument as the
caller typed it; nothing returns NaN or inf, or a stack trace from inside torch."""

import ast
import math
import pathlib
import re

import numpy as np
import pytest
import torch

import logitlab as ll
from logitlab import penalties, processors
from logitlab._validate import check_int, check_number, check_temperature
from logitlab.best_of_n import select_best
from logitlab.sampling import SamplingConfig, next_token, process_logits

INF = float("inf")
LOGITS = torch.tensor([[1.0, 3.0, 2.0, -INF]])


def finite_or_neginf(t: torch.Tensor) -> bool:
    return not bool((torch.isnan(t) | (t == INF)).any())


# ---------------------------------------------------------------- numbers: one set of checkers


def test_checkers_accept_numpy_numbers_and_return_python_ones():
    unit = "a number in (0, 1]", lambda v: 0 < v <= 1
    for value in (np.float32(0.5), np.float64(0.5), np.float16(0.5), 0.5, 1):
        out = check_number(value, "p", *unit)
        assert type(out) is float and out == float(value)
    for value in (np.int64(3), np.int32(3), np.uint8(3), 3):
        out = check_int(value, "k", minimum=1)
        assert type(out) is int and out == 3


@pytest.mark.parametrize("value", [True, np.bool_(True), math.nan, np.float32("nan"), "0.5", None, 1j, torch.tensor(0.5)])
def test_check_number_refuses_what_is_not_a_real_number(value):
    with pytest.raises(ValueError, match=r"^p must be a number in \(0, 1\], got"):
        check_number(value, "p", "a number in (0, 1]", lambda v: 0 < v <= 1)


@pytest.mark.parametrize("value", [True, 2.0, np.float64(2.0), 0, "2", None])
def test_check_int_refuses_bools_floats_and_too_small(value):
    with pytest.raises(ValueError, match=r"^k must be an integer >= 1, got"):
        check_int(value, "k", minimum=1)


def test_an_int_too_large_for_a_float_is_out_of_range_not_an_overflow_error():
    with pytest.raises(ValueError, match="^temperature must be a finite number"):
        check_temperature(10**400)
    with pytest.raises(ValueError, match="^temperature"):
        ll.softmax(LOGITS, temperature=10**400)


@pytest.mark.parametrize("temperature", [np.float32(0.7), np.float64(0.7), np.int64(2), 2])
def test_numpy_and_int_temperatures_work_everywhere(temperature):
    t = float(temperature)
    assert torch.equal(ll.apply_temperature(LOGITS, temperature), ll.apply_temperature(LOGITS, t))
    assert torch.equal(ll.softmax(LOGITS, temperature), ll.softmax(LOGITS, t))
    assert torch.equal(ll.log_softmax(LOGITS, temperature), ll.log_softmax(LOGITS, t))
    for sampler in (ll.sample, ll.gumbel_max):
        a = sampler(LOGITS.expand(50, -1), temperature, torch.Generator().manual_seed(0))
        b = sampler(LOGITS.expand(50, -1), t, torch.Generator().manual_seed(0))
        assert torch.equal(a, b)
