"""The shape of a token tree: who attends to whom, at which position, and the tree's own algebra.

A tree after a prompt is the list ``parents`` (``parents[i]`` is node i's parent, ``-1`` the
root), with every parent before its children. Scoring it in one forward pass needs each node to
see only its ancestors (``tree_attention_mask``) at the position it has in its own path
(``tree_position_ids``). Chapter 5 samples and scores trees with them (``search.trees``); the
speculative loops of chapters 6-9 verify draft trees with them. ``cartesian_tree``,
``ancestors``, ``leaves`` and ``depths`` are the bookkeeping both need.
"""

from __future__ import annotations

import torch

from .._validate import check_int, check_parents


def tree_attention_mask(parents) -> torch.Tensor:
    """``[n, n]`` booleans: entry ``[i, j]`` is True iff node ``j`` is node ``i`` or one of its ancestors.

    Row i is what node i may attend to among the tree's nodes (it also sees the whole prompt).
    A causal mask would let each node see every earlier node, its siblings and cousins too.

    >>> tree_attention_mask([-1, 0, -1]).int()
    tensor([[1, 0, 0],
            [1, 1, 0],
            [0, 0, 1]], dtype=torch.int32)
    """
    parents = check_parents(parents)
    mask = torch.eye(len(parents), dtype=torch.bool, device="cpu")  # small: built on the CPU, moved when used
    for i, p in enumerate(parents):
        if p >= 0:
            # The parent's row is complete (it comes earlier): its ancestors are ours too.
            mask[i] |= mask[p]
    return mask


def tree_position_ids(parents, offset: int = 0) -> torch.Tensor:
    """``[n]``: the position of each node in its own path after a prompt of ``offset`` tokens,
    ``offset + depth - 1``. Siblings share a position: they are alternatives for one place."""
    parents = check_parents(parents)
    offset = check_int(offset, "offset", 0, "an integer >= 0 (the prompt's length)")
    return offset + torch.tensor(depths(parents), dtype=torch.long, device="cpu") - 1


def cartesian_tree(branching) -> list[int]:
    """Parents of the tree with a root (the pending token) and ``branching[d]`` children under
    every node of depth d + 1: the top tokens of head d + 1 under each path of the heads before."""
    if (not isinstance(branching, (tuple, list))
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in branching)):
        raise ValueError(f"branching must be a tuple of integers >= 1, got {branching!r}")
    parents, level = [-1], [0]  # () gives the root alone
    for b in branching:
        nxt = []
        for node in level:
            for _ in range(b):
                parents.append(node)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


def ancestors(parents: list[int], i: int) -> list[int]:
    """The path from the root's first child down to node ``i``, ``i`` included (root first)."""
    path = []
    while i != -1:
        path.append(i)
        i = parents[i]
    return path[::-1]


def leaves(parents: list[int]) -> list[int]:
    """The nodes without children, in list order."""
    has_child = set(parents)
    return [i for i in range(len(parents)) if i not in has_child]


def depths(parents: list[int]) -> list[int]:
    """Each node's depth: 1 for a child of the root, one more than its parent's otherwise."""
    result = []
    for p in parents:
        result.append(1 if p == -1 else result[p] + 1)
    return result
