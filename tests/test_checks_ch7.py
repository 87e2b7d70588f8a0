"""The checkers of chapter 7's exercises accept right answers and reject typical mistakes."""

import math

import pytest
import torch

import logitlab as ll
from logitlab.course.checks import CheckFailed


def test_check_match_probability(capsys):
    ll.checks.check_match_probability(lambda p: (p * p).sum(-1))
    assert "check_match_probability: all" in capsys.readouterr().out
    wrong_answers = [
        lambda p: p.max(-1).values,  # the most likely token's probability
        lambda p: (p * p).sum(),  # sums over the rows too
        lambda p: 1 - (p * p).sum(-1),  # the probability of a mismatch
    ]
    for wrong in wrong_answers:
        with pytest.raises(CheckFailed):
            ll.checks.check_match_probability(wrong)


def typical_accept_one(draft_tokens, p, epsilon, delta, log=torch.log, bar=min, prefix=True):
    kept = 0
    for i, d in enumerate(draft_tokens.tolist()):
        entropy = -(p[i] * log(p[i].clamp_min(1e-30))).sum().item()
        if p[i, d] > bar(epsilon, delta * math.exp(-entropy)):
            kept += 1
        elif prefix:
            break
    return kept


def test_check_typical_accept(capsys):
    ll.checks.check_typical_accept(typical_accept_one)
    assert "check_typical_accept: all" in capsys.readouterr().out
    wrong_answers = [
        lambda d, p, e, dl: typical_accept_one(d, p, e, dl, log=torch.log2),  # entropy in bits
        lambda d, p, e, dl: typical_accept_one(d, p, e, dl, bar=max),  # max instead of min
        lambda d, p, e, dl: typical_accept_one(d, p, e, dl, prefix=False),  # counts drafts after a failure
        lambda d, p, e, dl: typical_accept_one(d, p, e, e),  # delta ignored
    ]
    for wrong in wrong_answers:
        with pytest.raises(CheckFailed):
            ll.checks.check_typical_accept(wrong)


def test_check_match_probability_keeps_every_leading_dimension():
    # a batched dot product squeezed without a dim: a 3-D batch with groups of one row loses a dimension
    with pytest.raises(CheckFailed, match="Case a three-dimensional batch, one row per group.*expected shape \\(2, 1\\)"):
        ll.checks.check_match_probability(lambda p: (p[..., None, :] @ p[..., :, None]).squeeze())


def test_check_typical_accept_wants_a_strict_test():
    def at_least_the_bar(draft_tokens, p, epsilon, delta):  # >= where the test is >
        kept = 0
        for i, d in enumerate(draft_tokens.tolist()):
            entropy = -torch.xlogy(p[i], p[i]).sum().item()
            if p[i, d].item() < min(epsilon, delta * math.exp(-entropy)):
                break
            kept += 1
        return kept

    with pytest.raises(CheckFailed, match="Case a draft exactly at the bar fails.*expected 0 accepted drafts, got 2"):
        ll.checks.check_typical_accept(at_least_the_bar)
