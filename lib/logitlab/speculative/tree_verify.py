"""Verifying a tree of drafts: which path the target keeps, and the token after it.

Chapter 9 ("Drafting from the target's features") explains this module; chapter 7 uses it for
Medusa's trees. The proof that ``verify_tree`` is exact is on the book's proofs page.

A drafter that proposes a *tree* offers several candidates for the same place: the children of
a node are alternatives for the token after it. The target scores the whole tree in one pass
(``decoding.tree_shape``'s attention mask), which gives its distribution ``p`` after every node. A tree
is written as in ``logitlab.search.trees``, plus a root: node 0 is the token the target has just chosen
(not a draft), ``parents[0] = -1``, and every other node's parent comes before it.

Three ways to keep a path, one per acceptance rule of the book:

* ``greedy_tree``: at temperature 0 a node passes when it is the target's most likely token
  after its parent; the output is greedy decoding's.
* ``verify_tree``: *exact* at any temperature (recursive rejection sampling, as in SpecInfer,
  Miao et al., 2024). At a node, the children are tried in order; a child is accepted with
  probability ``min(1, r(t) / q(t))``, where ``r`` is what is left of the target's distribution
  after the siblings tried before, and each rejection leaves the residual ``max(0, r - q)``
  (normalised) for the next sibling. An accepted child becomes the node whose children are tried
  next; when every child of a node is rejected, the next token is drawn from the residual.
  ``q`` must be the distribution each child was *drawn from*, given everything drafted before
  it: a point mass for a child chosen deterministically (a drafter's top-k), the drafter's
  distribution for a sampled one. Giving a deterministic child the drafter's soft ``q`` is the
  tempting mistake that makes the output wrong; the tests show it.
* ``typical_tree``: Medusa's typical acceptance applied to each node (not exact).

Each returns ``(path, next_token)``: the node indices from the root to the deepest kept node
(``[0]`` when nothing is kept) and the target's token after that node.
"""

from __future__ import annotations

import torch

from .._validate import check_generator, check_probs, checking_values
from ..decoding.tree_shape import ancestors, depths
from ..devices import exact_dtype
from ..sampling.draw import inverse_transform


def children_lists(parents: list[int]) -> list[list[int]]:
    """``children[i]``: the children of node ``i``, in node order (the order they are tried)."""
    children = [[] for _ in parents]
    for i, parent in enumerate(parents[1:], start=1):
        children[parent].append(i)
    return children


def deepest_path(parents: list[int], passes: list[bool]) -> list[int]:
    """The path to the deepest node that passes and whose ancestors all pass (the first in node
    order on a tie); ``passes[0]``, the root's, is ignored: the root is always kept."""
    ok = [True] * len(parents)
    for i in range(1, len(parents)):  # a parent comes before its children
        ok[i] = ok[parents[i]] and passes[i]
    depth = depths(parents)
    best = max((i for i in range(len(parents)) if ok[i]), key=lambda i: (depth[i], -i))
    return ancestors(parents, best)


def greedy_tree(parents, tokens: torch.Tensor, logits: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """Temperature 0: keep the deepest path of nodes that are the target's most likely token after
    their parents. ``logits`` ``[n, V]`` (or probabilities): the target's scores after each node."""
    parents = check_tree(parents, tokens, logits)
    best = logits.argmax(dim=-1)  # [n]
    passes = [True] + (tokens[1:] == best[parents[1:]]).tolist()
    path = deepest_path(parents, passes)
    return path, best[path[-1]]


@torch.inference_mode()
def verify_tree(parents, tokens: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor,
                generator: torch.Generator | None = None) -> tuple[list[int], torch.Tensor]:
    """Exact verification of one tree by recursive rejection sampling (see the module's text).

    ``tokens`` ``[n]`` (node 0 is the root: the token the target chose last), ``p`` ``[n, V]`` the
    target's processed distribution after each node, and ``q`` ``[n, V]`` the distribution each
    node was drawn from given the tree drafted before it (row 0 is not used), or ``None`` when
    every node was chosen deterministically (each ``q`` a point mass on its own token). Returns
    ``(path, next_token)``; the path's tokens followed by ``next_token`` are distributed exactly
    as the target's own continuation.
    """
    parents = check_tree(parents, tokens, p, "p")
    check_probs(p, "p")
    if q is not None:
        if not isinstance(q, torch.Tensor) or q.shape != p.shape:
            raise ValueError(f"q must be None (deterministic children) or a tensor of p's shape {tuple(p.shape)}")
        check_probs(q[1:], "q")  # the root's row is not used
    check_generator(generator, p.device)
    exact = exact_dtype(p.device)
    children = children_lists(parents)
    u = torch.rand(len(parents), generator=generator, device=p.device, dtype=exact).tolist()
    path, residual = [0], p[0].to(exact)
    while True:
        for child in children[path[-1]]:
            token = int(tokens[child])
            drawn_from = None if q is None else q[child].to(exact)
            q_token = 1.0 if drawn_from is None else float(drawn_from[token])
            mass = float(residual.sum())  # the residual is kept unnormalised
            # Accept with probability min(1, r(t) / q(t)), r the residual normalised.
            if u[child] * q_token * mass < float(residual[token]):
                path.append(child)
                residual = p[child].to(exact)
                break
            residual = after_rejection(residual, token, drawn_from)
        else:  # every child rejected (or a leaf): the next token comes from what is left
            cumulative = residual.cumsum(dim=-1)
            draw = torch.rand(1, generator=generator, device=p.device, dtype=exact)
            return path, inverse_transform(cumulative[None], draw[None] * cumulative[-1:])[0]


def after_rejection(r: torch.Tensor, token: int, q: torch.Tensor | None = None) -> torch.Tensor:
    """What is left of ``r`` (a distribution ``[V]``, normalised or not) for the next sibling once
    the candidate ``token``, drawn from ``q``, was rejected: ``max(0, r - q)``, not normalised.
    ``q=None`` means the candidate was chosen, not sampled (a point mass): ``token`` is removed and
    the rest is unchanged."""
    if q is None:
        left = r.clone()
        left[token] = 0
    else:
        left = (r / r.sum() - q.to(r.dtype)).clamp_min(0)
    # Nothing left means r = q wherever r > 0, where rejection has probability 0; rounding can
    # still get there, and then r itself is the right distribution.
    return left if float(left.sum()) > 0 else r


def check_tree(parents, tokens, scores, name: str = "logits") -> list[int]:
    """A tree with a root: ``parents[0] == -1`` and every other parent earlier in the list;
    ``tokens`` ``[n]`` token ids and ``scores`` ``[n, V]``, one row per node."""
    if isinstance(parents, torch.Tensor):
        parents = parents.tolist()
    n = len(parents) if isinstance(parents, (list, tuple)) else 0
    if n == 0 or parents[0] != -1 or any(
            isinstance(a, bool) or not isinstance(a, int) or not 0 <= a < i for i, a in enumerate(parents[1:], 1)):
        raise ValueError("parents must be a list with parents[0] == -1 (the root: the target's last token) "
                         f"and every other entry an earlier node's index, got {parents!r}")
    if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long or tokens.shape != (n,):
        raise ValueError(f"tokens must be a LongTensor of shape [{n}], one token per node")
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2 or scores.shape[0] != n:
        raise ValueError(f"{name} must be a tensor [{n}, V]: the target's scores after each node")
    # Token ids are values on the device: checked when called directly, not inside the loops
    # (``trusted()``), which take a tree's tokens as they take a chain's.
    if checking_values() and ((tokens < 0).any() or (tokens >= scores.shape[1]).any()):
        raise ValueError(f"tokens must be token ids in [0, {scores.shape[1]})")
    return list(parents)
