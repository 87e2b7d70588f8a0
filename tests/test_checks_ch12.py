"""The checks of chapter 12's exercises (the green list's z-score, one round of the tournament): a
right answer passes, and each likely mistake is caught with the hint that names it."""

import math

import pytest

from logitlab.course.checks import CheckFailed, check_green_z_score, check_tournament_round
from logitlab.watermark.green_list import green_mask


def z_score(tokens, vocab_size, gamma, key, unique=True):
    pairs = list(zip(tokens, tokens[1:]))
    if unique:
        pairs = list(dict.fromkeys(pairs))
    green = sum(bool(green_mask(a, vocab_size, gamma, key)[b]) for a, b in pairs)
    n = len(pairs)
    return (green - gamma * n) / math.sqrt(n * gamma * (1 - gamma))


def test_a_right_answer_passes(capsys):
    check_green_z_score(z_score)
    assert "check_green_z_score: all 6 cases passed" in capsys.readouterr().out


@pytest.mark.parametrize("fn, message", [
    (lambda t, v, g, k: z_score(t, v, g, k, unique=False), "a phrase said three times.*once"),
    (lambda t, v, g, k: z_score(t, v, 0.25, k), "gamma = 0.5.*gamma is the green share"),
    (lambda t, v, g, k: str(z_score(t, v, g, k)), "a finite float"),
    (lambda t, v, g, k: __import__("logitlab").watermark.green_list.detect(t, v, g, k).z, "library's own code"),
])
def test_mistakes_are_caught(fn, message):
    with pytest.raises(CheckFailed, match=message):
        check_green_z_score(fn)


def one_round(probs, g):
    return probs * (1 + g - (probs * g).sum(dim=-1, keepdim=True))


def test_a_right_round_passes(capsys):
    check_tournament_round(one_round)
    assert "check_tournament_round: all 6 cases passed" in capsys.readouterr().out


@pytest.mark.parametrize("fn, message", [
    (lambda p, g: p * (1 + g) / (p * (1 + g)).sum(dim=-1, keepdim=True), "five tokens"),  # not centred
    (lambda p, g: p * (1 + g - (p * g).sum()), "a batch of two rows.*last dimension"),  # one sum for the batch
    (lambda p, g: (p * (1 + g - (p * g).sum(dim=-1, keepdim=True))).tolist(), "return a tensor"),
])
def test_round_mistakes_are_caught(fn, message):
    with pytest.raises(CheckFailed, match=message):
        check_tournament_round(fn)
