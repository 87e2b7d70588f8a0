"""The checkers of chapters 2 (top-k, top-p) and 11 (best gamma, truncation distance) accept right
answers and reject plausible wrong ones, each at the case that explains its mistake. (Chapter 6's
checkers are tested in test_checks_ch45.py.)"""

import pytest
import torch

from logitlab.course.checks import CheckFailed, check_best_gamma, check_top_k, check_top_p, check_truncation_distance

NEG_INF = float("-inf")


# Chapter 2 -------------------------------------------------------------------------------------


def top_k(logits, k):
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p(logits, p):
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    remove = torch.cumsum(probs, dim=-1) - probs >= p
    remove[..., 0] = False
    return torch.empty_like(logits).scatter(-1, order, sorted_logits.masked_fill(remove, NEG_INF))


def top_p_as_stated(logits, p):
    """The statement word for word: a token is kept when the tokens strictly more likely than it
    hold less than p (it keeps every token tied at the boundary; the check has no such tie)."""
    probs = torch.softmax(logits, dim=-1)
    above = ((probs[..., None, :] > probs[..., :, None]) * probs[..., None, :]).sum(-1)
    return logits.masked_fill(above >= p, NEG_INF)


def test_right_truncations_pass(capsys):
    check_top_k(top_k)
    check_top_p(top_p)
    check_top_p(top_p_as_stated)
    out = capsys.readouterr().out
    assert "check_top_k: all 8 cases passed" in out and out.count("check_top_p: all 8 cases passed") == 2


def top_k_returns_its_input(logits, k):
    if k >= logits.shape[-1]:
        return logits  # nothing to remove: hands back the caller's tensor
    return top_k(logits, k)


def top_k_row_by_row(logits, k):
    if logits.dim() == 1:
        return top_k_row_by_row(logits[None], k)[0]
    out = logits.clone()
    for i in range(out.shape[0]):  # a "row" of a 3-D batch is a matrix
        row = out[i]
        kth = torch.topk(row, min(k, row.shape[-1])).values[-1]
        out[i] = row.masked_fill(row < kth, NEG_INF)
    return out


def top_k_by_scatter(logits, k):
    values, index = torch.topk(logits, min(k, logits.shape[-1]), dim=-1)
    return torch.full_like(logits, NEG_INF).scatter(-1, index, values)  # exactly k: ties lost


def top_k_in_place(logits, k):
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    logits[logits < kth] = NEG_INF
    return logits


@pytest.mark.parametrize("fn, message", [
    (top_k_returns_its_input, "Case 4 of 8 \\(k larger than the vocabulary\\).*not a new tensor"),
    (top_k_row_by_row, "Case 8 of 8 \\(a three-dimensional batch\\)"),
    (top_k_by_scatter, "Case 5 of 8 \\(a tie at the k-th place\\)"),
    (top_k_in_place, "Case 1 of 8 .*changed the logits it was given"),
])
def test_check_top_k_explains_the_first_wrong_case(fn, message):
    with pytest.raises(CheckFailed, match=message):
        check_top_k(fn)


def top_p_strict(logits, p):
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    remove = torch.cumsum(probs, dim=-1) - probs > p  # > instead of >=: one token too many at exactly p
    remove[..., 0] = False
    return torch.empty_like(logits).scatter(-1, order, sorted_logits.masked_fill(remove, NEG_INF))


def top_p_left_sorted(logits, p):
    return top_p(logits, p).sort(dim=-1, descending=True).values


@pytest.mark.parametrize("fn, message", [
    (top_p_strict, "Case 2 of 8 \\(a prefix whose mass is exactly p\\)"),
    (top_p_left_sorted, "Case 5 of 8 \\(tiny p keeps only the top token\\).*keeps tokens \\[\\[0\\]\\]"),
])
def test_check_top_p_explains_the_first_wrong_case(fn, message):
    with pytest.raises(CheckFailed, match=message):
        check_top_p(fn)


# Chapter 13 ------------------------------------------------------------------------------------


def predicted(alpha, gamma, c, v):
    tokens = gamma + 1 if alpha == 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * c + v[gamma + 1])


def best_gamma(alpha, c, v, sizes=lambda v: sorted(n - 1 for n in v if n >= 2)):
    gammas = sizes(v)  # every gamma whose pass size gamma + 1 was measured
    best = max(predicted(alpha, g, c, v) for g in gammas)
    return next(g for g in gammas if predicted(alpha, g, c, v) >= best * (1 - 1e-12))


def truncation_distance(logits, kept_logits):
    return 0.5 * (torch.softmax(logits, -1) - torch.softmax(kept_logits, -1)).abs().sum(-1)


def test_right_chapter_13_answers_pass(capsys):
    check_best_gamma(best_gamma)
    check_truncation_distance(truncation_distance)
    out = capsys.readouterr().out
    assert "check_best_gamma: all 12 cases passed" in out and "check_truncation_distance: all 6 cases passed" in out


def longest_chain_when_always_right(alpha, c, v):
    return max(v) - 1 if alpha == 1 else best_gamma(alpha, c, v)


@pytest.mark.parametrize("fn, message", [
    (longest_chain_when_always_right, "a drafter that is always right but costs 0.8 of a step.*expected gamma = 1, got 6"),
    (lambda alpha, c, v: best_gamma(alpha, c, v, sizes=lambda v: range(1, max(v))),  # every gamma up to the largest
     "a row of measured sizes with gaps.*KeyError"),
    (lambda alpha, c, v: best_gamma(alpha, c, {n: v[n] for n in sorted(v)[:4]}),  # only the first four sizes
     "a good drafter on a machine where a pass costs one step.*expected gamma = 8, got 3"),
    (lambda alpha, c, v: best_gamma(alpha, c, {n + 1: cost for n, cost in v.items()}), "v\\[gamma \\+ 1\\]"),
])
def test_check_best_gamma_explains_the_first_wrong_case(fn, message):
    with pytest.raises(CheckFailed, match=message):
        check_best_gamma(fn)


def naive_softmax(x):
    e = x.exp()  # no maximum subtracted: exp(1000) is inf
    return e / e.sum(-1, keepdim=True)


@pytest.mark.parametrize("fn, message", [
    (lambda logits, kept: 0.5 * (naive_softmax(logits) - naive_softmax(kept)).abs().sum(-1),
     "Case very large logits.*exp\\(1000\\) overflows"),
    (lambda logits, kept: 0.5 * (torch.softmax(logits, -1) - torch.softmax(logits, -1).masked_fill(
        kept.isneginf(), 0)).abs().sum(-1), "Case one row, two tokens removed.*Renormalise"),
    (lambda logits, kept: (torch.softmax(logits, -1) - torch.softmax(kept, -1)).abs().sum(-1), "half the sum"),
    (lambda logits, kept: truncation_distance(logits, kept).sum(), "Case a batch of three rows.*one distance per row"),
])
def test_check_truncation_distance_explains_the_first_wrong_case(fn, message):
    with pytest.raises(CheckFailed, match=message):
        check_truncation_distance(fn)
