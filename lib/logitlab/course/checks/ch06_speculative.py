"""The checks of chapter 6 (speculative sampling): the verification step and the expected tokens per
target call."""

from __future__ import annotations

import torch

from ...speculative.acceptance import verify
from ...speculative.theory import expected_tokens, speedup
from .common import CheckFailed, asks_for, call, case_generator, draw_float, draw_int, show


def _as_ints(got, label):
    """A verification step's answer as (num_accepted, next_token)."""
    if not isinstance(got, tuple) or len(got) != 2:
        raise CheckFailed(f"{label}: return a tuple (num_accepted, next_token).")
    return int(got[0]), int(got[1])


def _verify_hand_cases():
    """(name, draft_tokens, q, p, expected (num_accepted, next_token), hint): one-hot q and p, so the
    answer does not depend on the random numbers."""
    hand = []
    drafts = torch.tensor([1, 4, 5])
    p = torch.zeros(4, 10)
    p[0, 1] = p[1, 4] = p[2, 8] = p[3, 0] = 1.0
    hand.append(("the target agrees twice, then wants token 8", drafts, torch.eye(10)[drafts], p, (2, 8),
                 "Accept while p/q allows it; at the first rejection draw from max(0, p - q), normalised."))
    p = torch.zeros(3, 6)
    p[0, 2] = p[1, 3] = p[2, 5] = 1.0
    hand.append(("every draft is what the target wants: the bonus token comes from the last row of p",
                 torch.tensor([2, 3]), torch.eye(6)[[2, 3]], p, (2, 5),
                 "After accepting all g drafts, draw the next token from p[g]."))
    p = torch.zeros(3, 6)
    p[0, 1] = 1.0
    p[1:, 0] = 1.0
    hand.append(("the first draft has target probability 0", torch.tensor([2, 0]), torch.eye(6)[[2, 0]], p, (0, 1),
                 "A draft the target gives probability 0 is always rejected, even if later ones would match."))
    return hand


def _verify_random_cases(count: int = 8):
    """(draft_tokens, q, p, generator, expected) drawn from the case generator: the target is sure of
    one token at each position (p one-hot) and agrees with a random number of drafts, q is any
    distribution that gives the drafts a positive probability. The answer is then certain: a draft
    the target is sure of is accepted (p/q >= 1), the first other one is rejected (p = 0), and the
    residual max(0, p - q) holds the target's token only."""
    gen = case_generator(6)
    for _ in range(count):
        g, vocab = draw_int(gen, 1, 6), draw_int(gen, 2, 12)
        drafts = torch.randint(0, vocab, (g,), generator=gen)
        wanted = torch.randint(0, vocab, (g + 1,), generator=gen)  # the target's token at each position
        agree = draw_int(gen, 0, g + 1)  # the target wants the first `agree` drafts
        wanted[:agree] = drafts[:agree]
        if agree < g:
            wanted[agree] = (drafts[agree] + draw_int(gen, 1, vocab)) % vocab  # any token but the draft
        q = torch.softmax(2 * torch.randn(g, vocab, generator=gen), dim=-1)
        generator = torch.Generator(device="cpu").manual_seed(draw_int(gen, 0, 2**62))
        yield drafts, q, torch.eye(vocab)[wanted], generator, (agree, int(wanted[agree]))


def _verify_counts(fn, q, p, gen, trials: int, label: str):
    """Call ``fn`` ``trials`` times on drafts drawn from ``q`` (g = 2); count the first output token,
    and the second when the first draft was accepted."""
    vocab = p.shape[-1]
    first, second = torch.zeros(vocab), torch.zeros(vocab)
    for _ in range(trials):
        d = torch.stack([torch.multinomial(q[i], 1, generator=gen)[0] for i in range(2)])
        num, nxt = _as_ints(call(fn, label, d, q, p, gen), label)
        if not 0 <= num <= 2:
            raise CheckFailed(f"{label}: num_accepted must be between 0 and g = 2, got {num}.")
        out = d[:num].tolist() + [nxt]
        first[out[0]] += 1
        if num >= 1:
            second[out[1]] += 1
    return first, second


def _check_same_seed(fn, q, p, calls: int = 100) -> None:
    """Two runs of ``calls`` calls, each run with a generator seeded alike, must give the same answers."""
    label = "The reproducibility case (the same seed twice)"
    drafts = torch.tensor([1, 0])
    runs = []
    for _ in range(2):
        gen = torch.Generator(device="cpu").manual_seed(1)
        runs.append([_as_ints(call(fn, label, drafts.clone(), q.clone(), p.clone(), gen), label) for _ in range(calls)])
    if runs[0] != runs[1]:
        call_number = next(i for i, (a, b) in enumerate(zip(*runs)) if a != b)
        raise CheckFailed(
            f"{label}: with drafts {drafts.tolist()}, {calls} calls with a generator seeded 1 and {calls} more "
            f"with a fresh generator seeded 1 differ at call {call_number + 1}: {runs[0][call_number]} then "
            f"{runs[1][call_number]}. Take every random number from the generator you are given "
            "(torch.rand(..., generator=generator), torch.multinomial(..., generator=generator)).")


@asks_for(verify)
def check_verify(fn, trials: int = 20_000) -> None:
    """Check ``fn(draft_tokens, q, p, generator) -> (num_accepted, next_token)`` for one sequence
    (chapter 6): hand cases first, random cases whose answer is certain (drawn from the case
    generator, so unseen while grading), then that the same seed gives the same answers, then a
    statistical test of the tokens it outputs. The hand cases and the statistical test share a
    generator with a fixed seed, also while grading: a correct answer fails the test by chance
    on a fixed seed or never.

    ``draft_tokens`` is ``[g]``, ``q`` ``[g, V]``, ``p`` ``[g + 1, V]``. The statistical part draws
    drafts from ``q``, calls ``fn`` ``trials`` times, and checks with chi-square tests (each
    failing by chance with probability 1e-4) that the first output token follows ``p[0]`` and,
    when the first draft was accepted, the second follows ``p[1]``.
    """
    from scipy.stats import chisquare

    gen = torch.Generator(device="cpu").manual_seed(0)  # fixed, also while grading: see the docstring
    hand = _verify_hand_cases()
    for number, (name, d, q, p, expected, hint) in enumerate(hand, start=1):
        label = f"Hand case {number} of {len(hand)} ({name})"
        got = _as_ints(call(fn, label, d.clone(), q.clone(), p.clone(), gen), label)
        if got != expected:
            raise CheckFailed(f"{label}: expected (num_accepted, next_token) = {expected}, got {got}. {hint}")
    random = list(_verify_random_cases())
    for number, (d, q, p, generator, expected) in enumerate(random, start=1):
        label = f"Random case {number} of {len(random)} (g = {len(d)}, V = {q.shape[-1]})"
        got = _as_ints(call(fn, label, d.clone(), q.clone(), p.clone(), generator), label)
        if got != expected:
            raise CheckFailed(
                f"{label}: with drafts {d.tolist()}, a target sure of the tokens {p.argmax(dim=-1).tolist()} "
                f"(p one-hot) and q {show(q)}, expected (num_accepted, next_token) = {expected}, got {got}. "
                "A draft the target is sure of is accepted (p/q >= 1); the first draft it gives probability 0 "
                "is rejected, and max(0, p - q) then holds only the target's token.")

    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.2, 0.5, 0.05, 0.25], [0.4, 0.3, 0.2, 0.1]])
    _check_same_seed(fn, q, p)
    label = "The statistical test"
    first, second = _verify_counts(fn, q, p, gen, trials, label)
    for what, counts, target, hint in [
        ("the first output token", first, p[0], "Check the acceptance test u < p(d) / q(d) and the residual "
         "max(0, p - q) at the first rejection."),
        ("the second output token, after an accepted first draft", second, p[1], "After an accepted draft, the "
         "next position uses the next rows of p and q."),
    ]:
        expected = counts.sum() * target.double() / target.double().sum()
        pvalue = chisquare(counts.double(), expected).pvalue
        if pvalue < 1e-4:
            raise CheckFailed(
                f"{label}: over {int(counts.sum())} draws, {what} came out with frequencies "
                f"{show(counts / counts.sum())}, but it must follow the target's {show(target)} "
                f"(chi-square p-value {pvalue:.1e}). {hint}")
    print(f"check_verify: all {len(hand)} hand cases, {len(random)} random cases, the reproducibility case and "
          f"the statistical test ({trials} calls) passed.")


@asks_for(expected_tokens, speedup)
def check_expected_tokens(fn) -> None:
    """Check ``fn(alpha, gamma) -> float``, the expected tokens per target call (chapter 6)."""
    cases = [(0.0, 3, 1.0, "alpha = 0: every first draft is rejected, the call yields its one replacement token"),
             (0.5, 1, 1.5, "gamma = 1: 1 + alpha"),
             (0.6, 4, (1 - 0.6 ** 5) / 0.4, "the general case"),
             (0.9, 10, (1 - 0.9 ** 11) / 0.1, "a long draft"),
             (1.0, 4, 5.0, "alpha = 1: all gamma drafts and the bonus token (the closed form is 0/0 here)")]
    gen = case_generator(7)  # random alphas and gammas: the same in a notebook, unseen while grading
    random = [(draw_float(gen, 0.0, 0.98, 4), draw_int(gen, 1, 13)) for _ in range(8)]
    cases += [(alpha, gamma, expected_tokens(alpha, gamma), f"random case {number} of {len(random)}")
              for number, (alpha, gamma) in enumerate(random, start=1)]
    for alpha, gamma, expected, name in cases:
        label = f"expected_tokens({alpha}, {gamma}) ({name})"
        got = call(fn, label, alpha, gamma)
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise CheckFailed(f"{label}: return a number, got {type(got).__name__}.") from None
        if not abs(got - expected) <= 1e-9 * max(1.0, expected):
            raise CheckFailed(f"{label}: expected {expected:.6f}, got {got:.6f}.")
    print(f"check_expected_tokens: all {len(cases) - len(random)} cases passed, and {len(random)} random ones.")
