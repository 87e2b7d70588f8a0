"""The checks of chapter 7 (typical acceptance): the match probability and the typical-acceptance test."""

from __future__ import annotations

import torch

from ...speculative.typical import match_probability, typical_accept
from .common import CheckFailed, asks_for, call, case_generator, draw_int, show


@asks_for(match_probability)
def check_match_probability(fn) -> None:
    """Check ``fn(p) -> [...]``: the probability that two independent draws from ``p`` ``[..., V]``
    are the same token (chapter 7)."""
    cases = [("one certain token", torch.tensor([0.0, 1.0, 0.0]), 1.0),
             ("four equally likely tokens", torch.full((4,), 0.25), 0.25),
             ("the hand case of the chapter", torch.tensor([0.5, 0.3, 0.2]), 0.38),
             ("two rows at once", torch.tensor([[0.9, 0.1], [0.5, 0.5]]), [0.82, 0.5]),
             ("a three-dimensional batch, one row per group", torch.tensor([[[0.9, 0.1]], [[0.5, 0.5]]]),
              [[0.82], [0.5]])]
    for name, p, expected in cases:
        _compare_match(fn, f"Case {name}", p, torch.tensor(expected, dtype=torch.float64))
    random = list(_random_distributions())
    for number, p in enumerate(random, start=1):
        _compare_match(fn, f"Random case {number} of {len(random)} (p of shape {tuple(p.shape)})", p,
                       match_probability(p).double())
    print(f"check_match_probability: all {len(cases)} cases passed, and {len(random)} random ones.")


def _random_distributions(count: int = 8):
    """Distributions ``[..., V]`` drawn from the case generator: one to three dimensions of random
    sizes, flat or peaked rows."""
    gen = case_generator(7)
    for _ in range(count):
        shape = [draw_int(gen, 1, 4) for _ in range(draw_int(gen, 0, 3))] + [draw_int(gen, 2, 20)]
        yield torch.softmax(draw_int(gen, 1, 5) * torch.randn(shape, generator=gen), dim=-1)


def _compare_match(fn, label: str, p: torch.Tensor, want: torch.Tensor) -> None:
    got = call(fn, label, p.clone())
    if isinstance(got, torch.Tensor):
        got = got.cpu()  # a student's answer may be on another device
    try:
        got = torch.as_tensor(got, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        raise CheckFailed(f"{label}: return a tensor (one number per row of p), got {type(got).__name__}.") from None
    if got.shape != want.shape:
        raise CheckFailed(f"{label}: expected shape {tuple(want.shape)} (one number per row of p), "
                          f"got {tuple(got.shape)}. p has shape [..., V]: sum over dim=-1 only and keep "
                          "every other dimension (squeeze() without a dim also drops the ones of size 1).")
    if not torch.allclose(got, want, atol=1e-6):
        raise CheckFailed(f"{label}: with p {show(p)}, expected {show(want)}, got {show(got)}. Both draws give "
                          "token x with probability p(x) * p(x); add over x.")


@asks_for(typical_accept)
def check_typical_accept(fn) -> None:
    """Check ``fn(draft_tokens, p, epsilon, delta) -> num_accepted`` for one sequence (chapter 7)
    against :func:`logitlab.speculative.typical.typical_accept`: ``draft_tokens`` ``[g]``, ``p``
    ``[g, V]``."""

    sure, flat = [0.97, 0.01, 0.01, 0.01], [0.25, 0.25, 0.25, 0.25]
    cases = [("a sure target agrees, then a flat one: both pass", [0, 3], [sure, flat], 0.09, 0.3,
              "Under a flat p the bar is delta * exp(-H) = 0.3 / 4, below 0.25."),
             ("the first draft fails: nothing after it counts", [1, 0], [sure, sure], 0.09, 0.3,
              "Keep drafts only up to the first one that fails."),
             ("0.05 against epsilon = 0.04 and then 0.09", [2], [[0.5, 0.45, 0.05, 0.0]], 0.04, 0.3,
              "The bar is min(epsilon, delta * exp(-H)), H the entropy of p in nats."),
             ("the same with epsilon 0.09", [2], [[0.5, 0.45, 0.05, 0.0]], 0.09, 0.3,
              "The bar is min(epsilon, delta * exp(-H)), H the entropy of p in nats."),
             ("a draft of probability 0 never passes", [3, 0], [[0.5, 0.45, 0.05, 0.0], sure], 0.09, 0.3,
              "A token the target gives probability 0 is below any bar."),
             ("zero entries in p: 0.28 against a bar of 0.276", [1], [[0.72, 0.28, 0.0, 0.0]], 0.3, 0.5,
              "Entropy: 0 * log 0 counts as 0 (torch.xlogy does that); a NaN entropy breaks the bar."),
             ("a draft exactly at the bar fails", [1, 0], [flat, flat], 0.25, 10.0,
              "The test is strict: a draft passes when p(d) > min(epsilon, delta * exp(-H)), so p(d) = 0.25 "
              "against a bar of epsilon = 0.25 fails (use >, not >=)."),
             ]
    gen = case_generator(0)  # the random cases: the same in a notebook, unseen while grading
    for i in range(12):  # random cases of every length
        g, vocab = 1 + i % 4, 3 + i % 5
        p = torch.softmax(3 * torch.randn(g, vocab, generator=gen), dim=-1)
        d = torch.multinomial(p, 1, generator=gen).squeeze(-1)
        eps = [0.05, 0.09, 0.3][i % 3]
        cases.append((f"random case {i + 1} (g = {g}, V = {vocab})", d.tolist(), p.tolist(), eps, eps ** 0.5,
                      "Compare your threshold with min(epsilon, delta * exp(-H)) position by position."))
    for name, d, p, eps, delta, hint in cases:
        label = f"Case {name}"
        d, p = torch.tensor(d), torch.tensor(p, dtype=torch.float32)
        expected = int(typical_accept(d[None], p[None], eps, delta)[0])
        got = call(fn, label, d.clone(), p.clone(), eps, delta)
        try:
            got = int(got)
        except (TypeError, ValueError):
            raise CheckFailed(f"{label}: return the number of accepted drafts, an int; got {type(got).__name__}.") from None
        if got != expected:
            raise CheckFailed(f"{label}: expected {expected} accepted drafts, got {got}. {hint}")
    print(f"check_typical_accept: all {len(cases)} cases passed.")
