"""The checkers of chapter 9's exercises accept right answers and reject typical mistakes."""

import pytest
import torch

import logitlab as ll
from logitlab.course.checks import CheckFailed


def keep_best(scores, parents, budget, order="increasing", renumber=True):
    best = sorted(range(len(scores)), key=lambda i: -scores[i])[:budget]
    kept = sorted(best) if order == "increasing" else best
    if not renumber:
        return kept, [parents[i] for i in kept]
    place = {node: j for j, node in enumerate(kept)}
    return kept, [-1 if parents[i] == -1 else place[parents[i]] for i in kept]


def test_check_keep_best(capsys):
    ll.checks.check_keep_best(keep_best)
    assert "check_keep_best: all 5 cases passed" in capsys.readouterr().out
    wrong_answers = {
        "kept in score order": lambda s, p, b: keep_best(s, p, b, order="score"),
        "parents not renumbered": lambda s, p, b: keep_best(s, p, b, renumber=False),
        "the lowest scores": lambda s, p, b: keep_best([-x for x in s], p, b),
        "one node too many": lambda s, p, b: keep_best(s, p, b + 1),
    }
    for name, wrong in wrong_answers.items():
        with pytest.raises(CheckFailed):
            ll.checks.check_keep_best(wrong)
    with pytest.raises(CheckFailed, match="renumbered|place among the kept"):
        ll.checks.check_keep_best(wrong_answers["parents not renumbered"])
    with pytest.raises(CheckFailed, match="pair"):
        ll.checks.check_keep_best(lambda s, p, b: [0])


def after_rejection(r, token, q=None, normalise_first=True, clamp=True, fallback=True, copy=True):
    left = r.clone() if copy else r
    if q is None:
        left[token] = 0
    else:
        left = (left / left.sum() if normalise_first else left) - q
    if clamp:
        left = left.clamp_min(0)
    if fallback and float(left.sum()) <= 0:
        return r
    return left / left.sum()


def test_check_after_rejection(capsys):
    ll.checks.check_after_rejection(after_rejection)
    assert "check_after_rejection: all 8 cases passed" in capsys.readouterr().out
    wrong_answers = {
        "r - q without normalising r": (lambda r, t, q: after_rejection(r, t, q, normalise_first=False), "Normalise r"),
        "no max(0, .)": (lambda r, t, q: after_rejection(r, t, q, clamp=False), "expected"),
        "zero left when q = r": (lambda r, t, q: after_rejection(r, t, q, fallback=False), "non-negative"),
        "r changed in place": (lambda r, t, q: after_rejection(r, t, q, copy=False), "changed r"),
        "the soft q of a chosen candidate": (
            lambda r, t, q: after_rejection(r, t, torch.full_like(r, 1 / len(r)) if q is None else q), "point mass"),
        "r unchanged": (lambda r, t, q: r.clone(), "expected"),
    }
    for name, (wrong, message) in wrong_answers.items():
        with pytest.raises(CheckFailed, match=message):
            ll.checks.check_after_rejection(wrong)


def test_check_after_rejection_wants_r_back_whenever_nothing_is_left():
    def fallback_for_sampled_only(r, token, q):  # a chosen candidate that held all of r leaves zeros
        if q is None:
            left = r.clone()
            left[token] = 0
            return left
        left = (r / r.sum() - q).clamp_min(0)
        return left if left.sum() > 0 else r

    def fallback_when_r_equals_q(r, token, q):  # compares r itself with q, before normalising r
        if q is None:
            return after_rejection(r, token, q)
        return r if torch.equal(r, q) else (r / r.sum() - q).clamp_min(0)

    with pytest.raises(CheckFailed, match="Case a chosen candidate that held all of r.*return r itself"):
        ll.checks.check_after_rejection(fallback_for_sampled_only)
    with pytest.raises(CheckFailed, match="Case r not normalised, equal to q once normalised.*return r itself"):
        ll.checks.check_after_rejection(fallback_when_r_equals_q)
