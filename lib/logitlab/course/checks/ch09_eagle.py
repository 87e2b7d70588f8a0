"""The checks of chapter 9 (feature-level drafting): what a rejected sibling leaves for the next
one, and keeping the best nodes of a dynamic draft tree."""

from __future__ import annotations

import copy

import torch

from ...speculative.eagle import rerank
from ...speculative.tree_verify import after_rejection
from .common import CheckFailed, as_list, asks_for, call, call_unchanged, case_generator, draw_int, show


@asks_for(rerank)
def check_keep_best(fn) -> None:
    """Check ``fn(scores, parents, budget) -> (kept, new_parents)`` (chapter 9) against
    :func:`logitlab.speculative.eagle.rerank`: the ``budget`` candidates with the highest cumulative scores,
    as their indices in increasing order, and each kept node's parent renumbered among the kept
    ones (-1 for the root)."""

    cases = [
        ("a chain", [-0.1, -0.5, -0.9], [-1, 0, 1], 2),
        ("two levels of two", [-0.2, -1.0, -0.5, -0.7, -1.5, -1.6], [-1, -1, 0, 0, 1, 1], 4),
        ("a budget larger than the tree", [-0.3, -0.4], [-1, -1], 5),
        ("a deep node beats a shallow one", [-0.1, -3.0, -0.2, -0.3, -3.5], [-1, -1, 0, 2, 1], 3),
        ("a budget of one", [-2.0, -0.5, -0.6], [-1, -1, 1], 1),
    ]
    for name, scores, parents, budget in cases:
        _compare_kept(fn, f"Case {name} (scores={scores}, parents={parents}, budget={budget})", scores, parents, budget)
    random = list(_random_draft_trees())
    for number, (scores, parents, budget) in enumerate(random, start=1):
        label = f"Random case {number} of {len(random)} (scores={scores}, parents={parents}, budget={budget})"
        _compare_kept(fn, label, scores, parents, budget)
    print(f"check_keep_best: all {len(cases)} cases passed, and {len(random)} random ones.")


def _random_draft_trees(count: int = 8):
    """(scores, parents, budget) drawn from the case generator: a random tree (each node's parent an
    earlier node or -1) whose cumulative scores fall along every path, as log-probabilities do. The
    scores are 3-decimal numbers at least 0.002 apart, so that no tie decides which are kept."""
    gen = case_generator(10)
    while count:
        n = draw_int(gen, 1, 11)
        parents = [draw_int(gen, -1, i) for i in range(n)]
        steps = (0.05 + 2 * torch.rand(n, generator=gen, dtype=torch.float64)).tolist()  # -log p of each node
        scores = []
        for parent, step in zip(parents, steps):
            scores.append(round((scores[parent] if parent >= 0 else 0.0) - step, 3))
        ordered = sorted(scores)
        if all(b - a > 0.0015 for a, b in zip(ordered, ordered[1:])):  # else draw again
            count -= 1
            yield scores, parents, draw_int(gen, 1, n + 2)


def _compare_kept(fn, label: str, scores: list, parents: list, budget: int) -> None:
    got = call(fn, label, copy.deepcopy(scores), copy.deepcopy(parents), budget)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise CheckFailed(f"{label}: return a pair (kept indices, new parents), got {got!r}.")
    tree = rerank(torch.arange(len(scores))[None], torch.tensor([scores]), torch.tensor([parents]), budget)
    want_kept, want_parents = tree.tokens[0].tolist(), tree.parents[0].tolist()
    kept, new_parents = as_list(got[0]), as_list(got[1])
    if kept != want_kept:
        raise CheckFailed(f"{label}: expected the nodes {want_kept} to be kept, got {kept}. Keep the "
                          f"{budget} highest scores, and list their indices in increasing order.")
    if new_parents != want_parents:
        raise CheckFailed(f"{label}: kept {kept} rightly, but expected their parents {want_parents}, got "
                          f"{new_parents}. A parent is given by its place among the kept nodes, not by its "
                          f"index among the candidates; -1 stays -1.")


@asks_for(after_rejection)
def check_after_rejection(fn) -> None:
    """Check ``fn(r, token, q) -> left`` (chapter 9) against
    :func:`logitlab.speculative.tree_verify.after_rejection`: the target's distribution left for the next
    sibling after ``token``, drawn from ``q`` (``None``: chosen, a point mass), was rejected. Both
    are compared normalised, so ``fn`` may normalise or not."""

    t = torch.tensor
    cases = [
        ("a chosen candidate (q=None)", t([0.5, 0.3, 0.2]), 0, None),
        ("a sampled candidate", t([0.5, 0.3, 0.2]), 1, t([0.2, 0.6, 0.2])),
        ("r not normalised, chosen candidate", t([0.2, 0.2, 0.0, 0.1]), 3, None),
        ("r not normalised, sampled candidate", t([0.1, 0.3, 0.1]), 0, t([0.4, 0.4, 0.2])),
        ("q equal to r: nothing would be left", t([0.5, 0.5]), 0, t([0.5, 0.5])),
        ("a chosen candidate the target gives no probability", t([0.0, 0.7, 0.3]), 0, None),
        ("a chosen candidate that held all of r: nothing would be left", t([0.0, 1.0, 0.0]), 1, None),
        ("r not normalised, equal to q once normalised: nothing would be left", t([1.0, 1.0]), 0, t([0.5, 0.5])),
    ]
    for name, r, token, q in cases:
        _compare_left(fn, f"Case {name}", r, token, q)
    random = list(_random_rejections())
    for number, (r, token, q) in enumerate(random, start=1):
        _compare_left(fn, f"Random case {number} of {len(random)}", r, token, q)
    print(f"check_after_rejection: all {len(cases)} cases passed, and {len(random)} random ones.")


def _random_rejections(count: int = 8):
    """(r, token, q) drawn from the case generator: r not normalised, with some zeros; the candidate
    chosen (q None) or sampled from a q that gives every token a positive probability."""
    gen = case_generator(11)
    for _ in range(count):
        vocab = draw_int(gen, 2, 9)
        r = torch.rand(vocab, generator=gen) * (torch.rand(vocab, generator=gen) < 0.8)
        r[draw_int(gen, 0, vocab)] += 0.1  # never all zero
        r = r * draw_int(gen, 1, 4)
        q = None if draw_int(gen, 0, 2) else torch.softmax(torch.randn(vocab, generator=gen), dim=-1)
        yield r, draw_int(gen, 0, vocab), q


def _compare_left(fn, label: str, r: torch.Tensor, token: int, q) -> None:
    label = f"{label} (r={show(r)}, token={token}, q={None if q is None else show(q)})"
    got = call_unchanged(fn, label, r, token, q, what="r (work on a copy: r is the target's distribution)")
    want = after_rejection(r, token, q)
    want = want / want.sum()
    if not isinstance(got, torch.Tensor) or got.shape != r.shape:
        raise CheckFailed(f"{label}: expected a tensor of r's shape {tuple(r.shape)}, got {got!r}.")
    total = float(got.sum())
    if not (total > 0 and torch.isfinite(got).all() and (got >= 0).all()):
        raise CheckFailed(f"{label}: expected {show(want)}, got {show(got)}: what is left must be "
                          "non-negative with a positive sum. When nothing is left (max(0, r - q) with r "
                          "normalised, or r without a chosen token, is zero everywhere), rejection could "
                          "not happen: return r itself.")
    if not torch.allclose(got.float() / total, want, atol=1e-5):
        hint = ("A chosen candidate is a point mass: remove its token, keep the rest." if q is None else
                "Normalise r before subtracting q, then keep max(0, r - q).")
        raise CheckFailed(f"{label}: expected {show(want)} (normalised), got {show(got.float() / total)}. {hint}")
