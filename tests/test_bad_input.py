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


# ---------------------------------------------------------------- temperature overflow


@pytest.mark.parametrize("logits, temperature", [
    (torch.tensor([[1.0, 3.0, 2.0, -INF]]), 1e-39),  # 3 / 1e-39 is inf in float32
    (torch.tensor([[-1.0, -3.0, -2.0, -INF]]), 1e-39),  # the row's maximum overflows to -inf
    (torch.tensor([[1.0, 3.0, 2.0, -INF]]), 1e-46),  # T itself is 0 in float32: 0 / 0 was NaN
    (torch.tensor([[0.0, -3.0, -2.0, -INF]]), 5e-324),
    (torch.tensor([[1.0, 3.0, 2.0, -INF]], dtype=torch.float64), 5e-324),
    (torch.tensor([[10.0, 9.0, 8.0, -INF]]).half(), 1e-4),
    (torch.tensor([[60000.0, 1.0, 0.0, -INF]]).half(), 0.5),  # not even a small temperature
    (torch.tensor([[1.0, 3.0, 2.0, -INF]]).bfloat16(), 1e-39),
])
def test_a_temperature_that_overflows_the_division_tends_to_greedy(logits, temperature):
    one_hot = torch.zeros_like(logits)
    one_hot[0, logits[0].float().argmax()] = 1
    scaled = ll.apply_temperature(logits, temperature)
    assert finite_or_neginf(scaled) and scaled.max() == 0 and torch.isneginf(scaled[0, 3])
    assert torch.equal(ll.softmax(logits, temperature), one_hot)
    logp = ll.log_softmax(logits, temperature)
    assert finite_or_neginf(logp) and torch.equal(logp.exp(), one_hot)
    assert ll.entropy(ll.softmax(logits, temperature).float()).item() == 0
    assert ll.kl(one_hot.float(), ll.softmax(logits, temperature).float()).item() == 0
    assert ll.tv_distance(one_hot.float(), ll.softmax(logits, temperature).float()).item() == 0
    for sampler in (ll.sample, ll.gumbel_max):
        tokens = sampler(logits.expand(200, -1), temperature, torch.Generator().manual_seed(0))
        assert (tokens == logits[0].float().argmax()).all()


def test_tiny_temperature_splits_ties_evenly_as_the_limit_does():
    logits = torch.tensor([[5.0, 1.0, 5.0]])
    assert torch.equal(ll.softmax(logits, 1e-39), torch.tensor([[0.5, 0.0, 0.5]]))
    assert torch.equal(ll.softmax(logits - 5, 1e-46), torch.tensor([[0.5, 0.0, 0.5]]))  # 0 / 0 at the ties
    assert torch.equal(ll.softmax(torch.zeros(1, 1), 1e-46), torch.ones(1, 1))
    for sampler in (ll.sample, ll.gumbel_max):
        counts = sampler(logits.expand(4000, -1), 1e-39, torch.Generator().manual_seed(1)).bincount(minlength=3)
        assert counts[1] == 0 and 1800 < counts[0] < 2200


def test_temperature_without_overflow_is_still_a_plain_division():
    logits = torch.tensor([[2.0, 1.0, -INF], [-40.0, 0.5, 3.0]])
    for t in (1e-30, 0.01, 0.5, 3.0):
        assert torch.equal(ll.apply_temperature(logits, t), logits / t)


def test_distributions_on_different_devices_name_the_argument():
    p = torch.tensor([[0.5, 0.5]])
    elsewhere = torch.tensor([[0.25, 0.75]], device="meta")
    for distance in (ll.kl, ll.tv_distance):
        with pytest.raises(ValueError, match="^q is on meta but p is on cpu"):
            distance(p, elsewhere)
        with pytest.raises(ValueError, match="^q must be"):
            distance(p, [[0.5, 0.5]])
