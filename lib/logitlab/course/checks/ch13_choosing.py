"""The checks of chapter 13 (choosing a decoder): the best number of drafts for a machine's
costs, and how far a truncation rule moves the distribution."""

from __future__ import annotations

import math

import torch

from ...probs import tv_distance
from ...speculative.theory import expected_tokens, speedup
from .common import CheckFailed, asks_for, call_unchanged, case_generator, draw_float, draw_int, show


def _reference_gamma(alpha: float, c: float, v: dict) -> int:
    """The gamma, among those whose pass size gamma + 1 is in v, with the highest predicted
    speedup; the smallest on a tie."""

    gammas = sorted(n - 1 for n in v if n >= 2)
    scores = [speedup(alpha, g, c, v[g + 1]) for g in gammas]
    best = max(scores)
    return next(g for g, s in zip(gammas, scores) if s >= best * (1 - 1e-12))


@asks_for(speedup, expected_tokens)
def check_best_gamma(fn) -> None:
    """Check ``fn(alpha, c, v) -> int`` (chapter 13): the number of drafts per call, among the
    gamma >= 1 whose pass size gamma + 1 is in ``v``, that the cost model predicts to be fastest, where a call costs ``gamma * c``
    decode steps of drafting and ``v[gamma + 1]`` for the target's pass (``v`` maps a pass size
    to its cost in decode steps); the smallest such gamma on a tie."""
    flat = {n: 1.0 for n in range(1, 10)}
    cpu = {1: 1.0, 2: 1.08, 3: 1.15, 4: 1.22, 5: 1.31, 6: 1.42, 7: 1.55, 8: 1.7, 9: 1.9}
    steep = {1: 1.0, 2: 1.3, 3: 1.6, 4: 1.9, 5: 2.2, 6: 2.5, 7: 2.8}  # every token adds 0.3 of a step
    cases = [
        ("a good drafter on a machine where a pass costs one step whatever its size", 0.8, 0.05, flat,
         "With v = 1 and a cheap drafter, longer chains pay until alpha ** gamma is small."),
        ("the same drafter where scoring more tokens costs more (a CPU)", 0.8, 0.05, cpu,
         "The drafting costs gamma * c steps too, not only the target's pass."),
        ("a pass that costs 0.3 of a step more per token", 0.8, 0.05, steep,
         "Use v[gamma + 1], the pass over the drafts and the bonus position, not v[gamma]."),
        ("a fair drafter on the same machine", 0.7, 0.05, cpu,
         "Use v[gamma + 1], the pass over the drafts and the bonus position, not v[gamma]."),
        ("a poor drafter", 0.3, 0.05, cpu, "With a low alpha one draft is already the best bet."),
        ("a free drafter that is never right", 0.0, 0.0, flat,
         "alpha = 0: every call yields one token, whatever gamma; on a tie keep the smallest gamma."),
        ("a free drafter that is always right", 1.0, 0.0, flat,
         "alpha = 1 and c = 0: every draft is kept for free, so the longest chain allowed."),
        ("an expensive drafter", 0.7, 0.4, cpu, "c is the price of one draft, paid gamma times per call."),
        ("only gamma = 1 allowed", 0.9, 0.01, {1: 1.0, 2: 1.1}, "gamma + 1 must be a pass size in v."),
        ("a row of measured sizes with gaps", 0.8, 0.05, {1: 1.0, 2: 1.1, 4: 1.3, 8: 1.6, 16: 2.4}, (
            "v holds only the measured sizes (here 2, 4, 8, 16): the candidates are gamma = 1, 3, 7, 15, "
            "each gamma + 1 a key of v."
        )),
        ("a drafter that is always right but costs 0.8 of a step", 1.0, 0.8, steep, (
            "alpha = 1 does not mean the longest chain: each draft still costs c, and here a draft and "
            "its place in the pass cost more than the token it brings. Compare the speedups."
        )),
        ("v without the cost of a one-token pass", 0.8, 0.05, {2: 1.08, 3: 1.15, 4: 1.22, 5: 1.31}, (
            "Only v(gamma + 1) is used, so v need not hold n = 1: the candidates are n - 1 for every "
            "size n >= 2 in v."
        )),
    ]
    random = [(f"Random case {number} of 8", *machine, "Compare the predicted speedups "
               "expected_tokens(alpha, gamma) / (gamma * c + v[gamma + 1]) of every gamma whose gamma + 1 is in v.")
              for number, machine in enumerate(_random_machines(8), start=1)]
    for name, alpha, c, v, hint in [(f"Case {name}", *rest) for name, *rest in cases] + random:
        label = f"{name} (alpha {alpha}, c {c}, v {v})"
        got = call_unchanged(fn, label, alpha, c, dict(v), what="v")
        want = _reference_gamma(alpha, c, v)
        if isinstance(got, bool) or not isinstance(got, int) and not (isinstance(got, torch.Tensor) and got.numel() == 1):
            raise CheckFailed(f"{label}: return an int, got {type(got).__name__}.")
        if int(got) != want:
            raise CheckFailed(f"{label}: expected gamma = {want}, got {int(got)}. {hint}")
    print(f"check_best_gamma: all {len(cases)} cases passed, and {len(random)} random ones.")


def _random_machines(count: int):
    """(alpha, c, v) drawn from the case generator: any acceptance rate, a drafter costing up to
    half a step per draft, and pass costs v[n] that grow with n by random steps, for n from 1 (or
    now and then 2) to 3..10."""
    gen = case_generator(13)
    for _ in range(count):
        alpha, c = draw_float(gen, 0.0, 1.0, 3), draw_float(gen, 0.0, 0.5, 3)
        v, cost = {}, 1.0
        for n in range(draw_int(gen, 1, 3), draw_int(gen, 4, 11)):
            v[n] = cost
            cost = round(cost + draw_float(gen, 0.0, 0.3, 3), 3)
        yield alpha, c, v


@asks_for(tv_distance)
def check_truncation_distance(fn) -> None:
    """Check ``fn(logits, kept_logits) -> tensor [...]`` (chapter 13): the total-variation distance,
    per row, between the softmax of ``logits`` and the softmax of ``kept_logits``, the same logits
    with the removed tokens at -inf."""

    gen = case_generator(11)  # the random rows: the same in a notebook, unseen while grading
    wide = torch.randn(3, 50, generator=gen) * 2
    some_gone = wide.clone()
    some_gone[wide < 0] = -math.inf
    cases = [
        ("one row, two tokens removed", torch.tensor([2.0, 1.0, 0.0, -1.0]),
         torch.tensor([2.0, 1.0, -math.inf, -math.inf])),
        ("nothing removed: distance 0", torch.tensor([0.5, 0.1, -0.3]), torch.tensor([0.5, 0.1, -0.3])),
        ("a batch of three rows", wide, some_gone),
        ("logits already at -inf before the rule", torch.tensor([[1.0, -math.inf, 0.0, 0.5]]),
         torch.tensor([[1.0, -math.inf, -math.inf, 0.5]])),
        ("only the favourite kept", torch.tensor([3.0, 2.9, 2.8]), torch.tensor([3.0, -math.inf, -math.inf])),
        ("very large logits", torch.tensor([[1000.0, 999.0, 998.0]]), torch.tensor([[1000.0, 999.0, -math.inf]])),
    ]
    for name, logits, kept in cases:
        label = f"Case {name} (logits {show(logits)}, kept {show(kept)})"
        got = call_unchanged(fn, label, logits, kept, what="the logits")
        want = tv_distance(torch.softmax(logits, -1), torch.softmax(kept, -1))
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            raise CheckFailed(f"{label}: return a tensor of shape {tuple(want.shape)} (one distance per row), "
                              f"got {getattr(got, 'shape', type(got).__name__)}.")
        if not torch.allclose(got.float(), want, atol=1e-5):
            hint = ("exp(1000) overflows: use torch.softmax, or subtract the row maximum before exp." if
                    not bool(torch.isfinite(got).all()) else
                    "Renormalise the kept tokens: softmax of the kept logits, not the model's probabilities "
                    "with the removed ones set to 0." if bool((got < want).any()) else
                    "The total-variation distance is half the sum of the absolute differences.")
            raise CheckFailed(f"{label}: expected {show(want)}, got {show(got)}. {hint}")
    print(f"check_truncation_distance: all {len(cases)} cases passed.")
