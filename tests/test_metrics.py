import math

import pytest
import torch

from logitlab.measure.metrics import distinct_n, ngrams, repetition_rate


def test_ngrams():
    assert ngrams([1, 2, 3, 4], 2) == [(1, 2), (2, 3), (3, 4)]
    assert ngrams(torch.tensor([5, 6]), 3) == []


def test_distinct_n_exact_values():
    assert distinct_n([[1, 2, 3, 4]], 2) == 1.0
    assert distinct_n([[1, 2, 1, 2, 1]], 2) == 2 / 4  # (1,2),(2,1),(1,2),(2,1)
    assert distinct_n([[1, 2, 3], [1, 2, 3]], 2) == 2 / 4  # the same sample twice
    assert math.isnan(distinct_n([[1]], 2))


def test_repetition_rate_exact_values():
    assert repetition_rate([1, 2, 3, 4, 5], 3) == 0.0
    assert repetition_rate([7, 7, 7, 7, 7], 3) == 2 / 3  # (7,7,7) three times: two repeats
    assert repetition_rate(torch.tensor([1, 2, 3, 1, 2, 3]), 3) == 1 / 4
    assert math.isnan(repetition_rate([1, 2], 3))


def test_bad_n_raises():
    with pytest.raises(ValueError, match="n must be"):
        distinct_n([[1, 2]], 0)
