"""Token Recycling (Luo et al. 2024): drafts from the target's own earlier guesses, no model at all.

Every verification pass computes the target's distribution after every token it was fed, and the
loop keeps one token of it. Token Recycling keeps more: for every token t, the ``k`` tokens the
target ranked highest the last time it was fed t (an adjacency table ``[V, k]``, read from passes
the loop makes anyway). Each call's draft is a tree grown from the pending token breadth-first
through that table on a fixed template: the child of rank r of a node holding token t holds
``table[t, r]``.

The output stays exact at every temperature: the tree is a function of what the target said in
earlier passes, fixed before this call's verification draws anything, so each node is a point
mass (``q`` None) and recursive rejection sampling keeps the target's distribution. That the
table learns from the target changes which guesses are made, never how they are checked.

The template is chosen by size: ``tree_template(n, rank_probs)`` keeps the ``n`` nodes a walk
through the table is most likely to reach, if a child of rank r is kept with probability
``rank_probs[r]``. How large a tree pays depends on what a pass over n tokens costs on the
machine (the v(n) of chapter 6's cost model): small on a CPU, large on a GPU; ``best_size``
weighs the two.
"""

from __future__ import annotations

import heapq

import torch

from .._validate import check_int
from ..decoding.tree_shape import depths
from .drafter import Drafter, DraftTree

# How often the target kept the child of each rank (1st, 2nd, ...), used to shape the template:
# the rank-1 guess is the target's own top token after the same token last time.
RANK_PROBS = (0.45, 0.15, 0.08, 0.05, 0.04, 0.03, 0.02, 0.02)


def tree_template(size: int, rank_probs=RANK_PROBS) -> tuple[list[int], list[int]]:
    """``(parents, ranks)`` of the ``size`` nodes with the highest chance to be reached, taking the
    child of rank r as kept with probability ``rank_probs[r]``, independently (a rank never kept
    may have 0: its nodes come last): the chance of a node is the product along its path, which
    only falls from parent to child, so the best ``size`` nodes form a tree. ``parents[i]`` is an earlier node's index or -1 (a child of the root)."""
    size = check_int(size, "size", 1)
    if not rank_probs or not all(0 <= p <= 1 for p in rank_probs) or not any(rank_probs):
        raise ValueError(f"rank_probs must be a non-empty sequence of probabilities in [0, 1], not all 0, "
                         f"got {rank_probs!r}")
    frontier = [(-p, -1, r) for r, p in enumerate(rank_probs)]  # (minus the chance, parent, rank)
    heapq.heapify(frontier)
    parents, ranks = [], []
    while len(parents) < size:
        chance, parent, rank = heapq.heappop(frontier)
        parents.append(parent)
        ranks.append(rank)
        for r, p in enumerate(rank_probs):
            heapq.heappush(frontier, (chance * p, len(parents) - 1, r))
    return parents, ranks


def template_chances(parents: list[int], ranks: list[int], rank_probs=RANK_PROBS) -> list[float]:
    """Each node's chance to be kept, in the model of ``tree_template``: the product of
    ``rank_probs`` along its path. Their sum is the expected number of drafts a call keeps."""
    chances = []
    for parent, rank in zip(parents, ranks):
        chances.append(rank_probs[rank] * (chances[parent] if parent >= 0 else 1.0))
    return chances


def best_size(costs: dict, rank_probs=RANK_PROBS, overhead: float = 0.0) -> int:
    """The template size with the most tokens per unit of time on this machine: a call of ``n``
    nodes yields ``1 + sum(template_chances)`` tokens, expected, and costs a pass over ``n + 1``
    tokens (``costs[n + 1]`` decode steps, as ``logitlab.measure.timing.pass_costs`` measures
    them) and ``overhead`` steps of the loop's own work. Sizes ``n`` with ``n + 1`` in ``costs``;
    the smallest on a tie."""
    sizes = sorted(n - 1 for n in costs if n >= 2)
    if not sizes or not all(costs[n + 1] > 0 for n in sizes):
        raise ValueError(f"costs must map pass sizes >= 2 to their cost in decode steps (> 0), got {costs!r}")

    def rate(n):
        return (1 + sum(template_chances(*tree_template(n, rank_probs), rank_probs))) / (costs[n + 1] + overhead)

    return max(sizes, key=rate)


def check_table(table, vocab_size: int, k: int) -> None:
    """A table to start from: None, or token ids in ``[0, vocab_size)`` of shape ``[vocab_size, k]``."""
    if table is None:
        return
    if not (isinstance(table, torch.Tensor) and table.shape == (vocab_size, k) and table.dtype != torch.bool
            and not table.is_floating_point() and not table.is_complex()):
        raise ValueError(f"table must be None or an integer tensor of shape ({vocab_size}, {k}) (vocab_size, k), "
                         f"got {table!r:.80}")
    if not bool(((table >= 0) & (table < vocab_size)).all()):
        raise ValueError(f"table must hold token ids in [0, {vocab_size}), got values outside it")


class TokenRecycler(Drafter):
    """A tree of drafts read from the table of the target's earlier top-``k`` guesses.

    ``nodes`` is the tree's size (``tree_template``'s), ``k`` the guesses kept per token (at least
    the largest rank the template uses). The table starts empty (every entry token 0, which the
    target rejects) and fills as the loop runs; it is kept between calls of
    ``ll.speculative_generate``, so a drafter used again starts with what it learnt. ``table``: a
    ``[vocab_size, k]`` table to start from instead (copied, never changed), e.g. another
    drafter's ``table`` after the target answered other prompts: a warm start, still no training.
    """

    reads_logits = True

    def __init__(self, vocab_size: int, nodes: int = 12, k: int = 8, rank_probs=RANK_PROBS, table=None):
        self.vocab_size = check_int(vocab_size, "vocab_size", 1)
        self.k = check_int(k, "k", 1)
        self.parents, self.ranks = tree_template(nodes, tuple(rank_probs)[:self.k])
        self.depths = depths(self.parents)  # a child of the root: 1
        check_table(table, self.vocab_size, self.k)
        self.table = None if table is None else table.to(torch.long, copy=True)
        # Per rank: how often a node of that rank was the target's top token after its parent,
        # counted on the device (no read) from the passes over this drafter's trees.
        self.rank_hits = self.rank_counts = None
        self.last_tree = None  # (parents, ranks) of the last tree proposed, until its pass is seen

    def memory(self) -> int:
        """Entries of the table: what this drafter keeps (``vocab_size * k`` token ids)."""
        return self.vocab_size * self.k

    def _table_on(self, device) -> torch.Tensor:
        """The table, made empty (every guess token 0) the first time, on ``device``."""
        if self.table is None:
            self.table = torch.zeros(self.vocab_size, self.k, dtype=torch.long, device=device)
        elif self.table.device != device:  # a table given on another device keeps what it holds
            self.table = self.table.to(device)
        return self.table

    def observe_logits(self, tokens: torch.Tensor, logits: torch.Tensor) -> None:
        table = self._table_on(logits.device)
        top = logits.topk(self.k, dim=-1).indices
        if self.last_tree is not None and tokens.shape[1] == len(self.last_tree[0]) + 1:
            self._count_ranks(tokens, top[..., 0], *self.last_tree)
        self.last_tree = None
        # A token fed twice in one pass keeps one of its rows (which one does not matter).
        table[tokens.flatten()] = top.flatten(0, 1)

    def _count_ranks(self, tokens, best, parents, ranks) -> None:
        """``tokens`` ``[B, n + 1]``: the pending token then the tree; ``best``: the target's top
        token after each. A node is a hit when it is the top token after its parent."""
        if self.rank_counts is None or self.rank_counts.device != tokens.device:
            self.rank_hits = torch.zeros(self.k, device=tokens.device)
            self.rank_counts = torch.zeros(self.k, device=tokens.device)
        above = torch.tensor([p + 1 for p in parents], device=tokens.device)  # the root is column 0
        rank = torch.tensor(ranks, device=tokens.device).expand(len(tokens), -1)
        self.rank_hits.index_add_(0, rank.flatten(), (tokens[:, 1:] == best[:, above]).float().flatten())
        self.rank_counts.index_add_(0, rank.flatten(), torch.ones(rank.numel(), device=tokens.device))

    def measured_rank_probs(self) -> list[float]:
        """How often a child of each rank was the target's top token after its parent, over the
        trees verified so far: at temperature 0, the chance that it is kept when its parent is.
        Only the ranks up to the highest the trees used: a rank never drafted has nothing to
        measure. ``tree_template`` and ``best_size`` take it as ``rank_probs``."""
        if self.rank_counts is None:
            raise ValueError("no tree of this drafter has been verified yet")
        drafted = int((self.rank_counts > 0).nonzero().max()) + 1
        return (self.rank_hits[:drafted] / self.rank_counts[:drafted].clamp_min(1)).tolist()

    def propose(self, next_tokens, gamma, config, generator=None):
        table = self._table_on(next_tokens.device)
        keep = [i for i, d in enumerate(self.depths) if d <= gamma]  # no deeper than gamma levels
        index = {old: new for new, old in enumerate(keep)}
        parents = [index[self.parents[i]] if self.parents[i] >= 0 else -1 for i in keep]
        tokens = next_tokens.new_zeros(len(next_tokens), len(keep))
        for depth in range(1, max(self.depths[i] for i in keep) + 1):  # breadth-first: a level at a time
            level = [j for j, i in enumerate(keep) if self.depths[i] == depth]
            above = torch.stack([next_tokens if parents[j] < 0 else tokens[:, parents[j]] for j in level], dim=1)
            ranks = torch.tensor([self.ranks[keep[j]] for j in level], device=tokens.device)
            tokens[:, level] = table[above, ranks]
        self.last_tree = (parents, [self.ranks[i] for i in keep])
        return DraftTree(tokens, parents)
