"""The checks of chapter 5 (parallel sampling): the tree attention mask and the tree's position ids."""

from __future__ import annotations

import torch

from ...decoding.tree_shape import ancestors, tree_attention_mask, tree_position_ids
from .common import CheckFailed, asks_for, call, call_unchanged, case_generator, show


def _tree_cases():
    """(name, parents, hint) for check_tree_mask: small shapes first, then the book's tree, then random ones."""
    ancestors_only = "A node attends to itself and its ancestors only, not to its siblings or cousins."
    yield "a single node", [-1], "A node must attend to itself: the diagonal is True."
    yield "a chain (one path)", [-1, 0, 1, 2, 3], (
        "In a chain every earlier node is an ancestor: the mask is the causal (lower-triangular) one."
    )
    yield "a star (children of the root only)", [-1, -1, -1, -1], (
        "Children of the root are siblings: each sees only itself (and the prompt)."
    )
    yield "two branches", [-1, 0, 0, 1, 2], ancestors_only
    yield "ancestors two levels up", [-1, -1, 0, 1, 2, 3, 2], (
        "A node sees its parent, its parent's parent, and so on up to the root, not just its parent."
    )
    yield "nodes not in level order", [-1, 0, -1, 1, 2, 0], (
        "Parents come before their children, but the levels may interleave: follow the parents, not the positions."
    )
    parents, level = [], [-1]  # the (4, 4, 2) tree of the chapter: 52 nodes
    for k in (4, 4, 2):
        first = len(parents)
        parents += [p for p in level for _ in range(k)]
        level = list(range(first, len(parents)))
    yield "the (4, 4, 2) tree", parents, ancestors_only
    gen = case_generator(0)  # the random trees: the same in a notebook, unseen while grading
    for n in (7, 12, 30):
        parents = [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(n)]
        yield f"a random tree of {n} nodes", parents, ancestors_only


@asks_for(tree_attention_mask, ancestors)
def check_tree_mask(fn) -> None:
    """Check ``fn(parents)`` against :func:`logitlab.decoding.tree_shape.tree_attention_mask` (chapter 5).

    ``parents`` is a list: ``parents[i]`` is node i's parent, -1 for a child of the root. The
    answer is an ``[n, n]`` tensor, True (or 1) at ``[i, j]`` when node j is node i or one of
    its ancestors.
    """

    cases = list(_tree_cases())
    for number, (name, parents, hint) in enumerate(cases, start=1):
        label = f"Case {number} of {len(cases)} ({name})"
        got = call_unchanged(fn, label, list(parents), what="the parents list it was given")
        expected = tree_attention_mask(parents)
        n = len(parents)
        where = f"With parents {parents}" if n <= 12 else f"With parents of {n} nodes"
        if not isinstance(got, torch.Tensor) or got.shape != (n, n):
            shown = f"shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else f"a {type(got).__name__}"
            raise CheckFailed(f"{label}: {where}, expected a tensor of shape ({n}, {n}), got {shown}.")
        if got.dtype != torch.bool and not bool(((got == 0) | (got == 1)).all()):
            raise CheckFailed(f"{label}: {where}, return True/False (or 1/0) entries, not other values.")
        got = got.bool().cpu()  # a student's answer may be on another device
        if not torch.equal(got, expected):
            i, j = (got != expected).nonzero()[0].tolist()
            path = ancestors(parents, i)  # the root-to-node path, node included
            if expected[i, j]:
                why = f"node {j} is node {i} itself" if i == j else f"node {j} is an ancestor of node {i}"
            else:
                why = f"node {j} is not node {i} nor one of its ancestors"
            causal = torch.ones(n, n, dtype=torch.bool, device=got.device).tril()
            if torch.equal(got, causal):
                hint = ("This is a plain causal mask: it lets each node see every earlier node, siblings and "
                        "cousins too. " + hint)
            raise CheckFailed(
                f"{label}: {where}, entry [{i}, {j}] is {bool(got[i, j])} but should be {bool(expected[i, j])}: "
                f"{why} (the path from the root to node {i} is {path}). {hint}"
            )
    print(f"check_tree_mask: all {len(cases)} cases passed.")


@asks_for(tree_position_ids)
def check_tree_positions(fn) -> None:
    """Check ``fn(parents, offset)`` against :func:`logitlab.decoding.tree_shape.tree_position_ids` (chapter 5)."""

    cases = [(name, parents, offset) for (name, parents, _) in _tree_cases() for offset in (0, 7)]
    for number, (name, parents, offset) in enumerate(cases, start=1):
        label = f"Case {number} of {len(cases)} ({name}, offset {offset})"
        got = call(fn, label, list(parents), offset)
        expected = tree_position_ids(parents, offset)
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape or not torch.equal(got.long().cpu(), expected):
            shown = show(got) if isinstance(got, torch.Tensor) else repr(got)
            raise CheckFailed(
                f"{label}: with parents {parents} after a prompt of {offset} tokens, expected the positions "
                f"{expected.tolist()}, got {shown}. A node sits one place after its parent; the children "
                f"of the prompt sit at position {offset}, and siblings share a position.")
    print(f"check_tree_positions: all {len(cases)} cases passed.")
