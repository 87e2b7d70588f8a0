"""Verifying a tree of drafts (logitlab.speculative.tree_verify): exact cases by hand, and chi-square tests
that recursive rejection sampling reproduces the target's distribution for trees whose children
were chosen deterministically, sampled with replacement and sampled without replacement, while
the tempting wrong rule (the drafter's soft q for deterministic children) fails the same test.

The world of these tests is a bigram one: the target's next-token distribution after a token is a
row of a table, the drafter's a row of another, so the exact distribution of any continuation is a
product of table entries. Each test draws a tree from the drafter, verifies it against the target,
and completes the emitted tokens to a fixed length with exact draws from the target's table: the
completed sequences follow the target's distribution if and only if verification is exact.
P-values below 1e-4 reject (the false-positive rate of each test when the code is right).
"""

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from logitlab.search.trees import gumbel_top_k
from logitlab.speculative.tree_verify import children_lists, deepest_path, greedy_tree, verify_tree

P_MIN = 1e-4
VOCAB, LENGTH, ROOT = 4, 3, 1


def tables(seed=0):
    gen = torch.Generator().manual_seed(seed)
    target = torch.softmax(2.0 * torch.randn(VOCAB, VOCAB, generator=gen), dim=-1).double()
    drafter = torch.softmax(2.0 * torch.randn(VOCAB, VOCAB, generator=gen), dim=-1).double()
    return target, drafter


def draft_tree(drafter, branching, how, gen):
    """A tree under ROOT: ``branching[d]`` children per node of depth d, chosen from the drafter's
    row of the parent's token as ``how`` says; returns parents, tokens and the q of each node."""
    parents, tokens, q = [-1], [ROOT], [torch.zeros(VOCAB, dtype=torch.float64)]
    level = [0]
    for k in branching:
        nxt = []
        for node in level:
            row = drafter[tokens[node]]
            if how == "top-k":
                chosen, dists = row.topk(k).indices.tolist(), [row] * k  # soft q: only the wrong rule uses it
            elif how == "with replacement":
                chosen, dists = torch.multinomial(row, k, replacement=True, generator=gen).tolist(), [row] * k
            else:  # without replacement: each child is drawn from what the siblings before it left
                chosen = gumbel_top_k(row.log()[None], k, gen)[0].tolist()
                dists, left = [], row.clone()
                for t in chosen:
                    dists.append(left / left.sum())
                    left[t] = 0
            for t, d in zip(chosen, dists):
                parents.append(node)
                tokens.append(t)
                q.append(d)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents, torch.tensor(tokens), torch.stack(q)


def completed_samples(how, branching, rule_q, runs, seed):
    """``rule_q``: the q verification is given: "point" (None: point masses), "soft" (the q of
    ``draft_tree``) or "row" (the drafter's whole row at the parent, whatever was drawn before)."""
    target, drafter = tables()
    gen = torch.Generator().manual_seed(seed)
    samples = Counter()
    for _ in range(runs):
        parents, tokens, q = draft_tree(drafter, branching, how, gen)
        p = target[tokens]  # the target's distribution after each node's token
        if rule_q == "row":
            q = torch.stack([q[0]] + [drafter[tokens[a]] for a in parents[1:]])
        path, nxt = verify_tree(parents, tokens, None if rule_q == "point" else q, p, gen)
        seq = tokens[path[1:]].tolist() + [int(nxt)]
        while len(seq) < LENGTH:  # complete with exact draws from the target
            seq.append(int(torch.multinomial(target[seq[-1]], 1, generator=gen)))
        samples[tuple(seq[:LENGTH])] += 1
    return samples, target


def chi_square(samples, target):
    keys, expected = [], []
    for a in range(VOCAB):
        for b in range(VOCAB):
            for c in range(VOCAB):
                keys.append((a, b, c))
                expected.append(float(target[ROOT, a] * target[a, b] * target[b, c]))
    n, total = sum(samples.values()), sum(expected)
    return chisquare([samples.get(k, 0) for k in keys], [n * e / total for e in expected]).pvalue


@pytest.mark.statistical
@pytest.mark.parametrize("how, rule_q", [("top-k", "point"), ("with replacement", "soft"),
                                         ("without replacement", "soft")])
def test_recursive_rejection_over_a_tree_is_exact(how, rule_q):
    samples, target = completed_samples(how, (2, 2), rule_q, runs=6000, seed=1)
    assert chi_square(samples, target) > P_MIN


@pytest.mark.parametrize("how, rule_q", [("top-k", "soft"), ("without replacement", "row")])
def test_the_test_detects_a_q_that_is_not_what_the_children_were_drawn_from(how, rule_q):
    # The tempting wrong rule: children are the drafter's top-2, but verification is given the
    # drafter's soft distribution as if they had been sampled from it. And a subtler one: children
    # drawn without replacement, each verified with the drafter's whole row (the q of a draw *with*
    # replacement) instead of the row without the siblings drawn before it. Both make the output
    # wrong, and the test says so (p = 0.0 in both cases at 4000 runs).
    samples, target = completed_samples(how, (2, 2), rule_q, runs=4000, seed=1)
    assert chi_square(samples, target) < P_MIN


def test_a_chain_of_point_masses_is_verified_like_the_chain_rule():
    # One child, chosen deterministically: it is accepted with probability p(t), and the next
    # token after a rejection comes from p without t, renormalised. Checked against those numbers.
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.1, 0.7]], dtype=torch.float64)
    parents, tokens = [-1, 0], torch.tensor([3, 0])
    gen = torch.Generator().manual_seed(0)
    runs = 8000
    kept, after_rejection = 0, Counter()
    for _ in range(runs):
        path, nxt = verify_tree(parents, tokens, None, p, gen)
        if len(path) == 2:
            kept += 1
        else:
            after_rejection[int(nxt)] += 1
    assert abs(kept / runs - 0.5) < 4 * (0.25 / runs) ** 0.5
    assert after_rejection[0] == 0 and after_rejection[3] == 0  # the rejected token, and p = 0
    rejected = runs - kept
    assert chisquare([after_rejection[1], after_rejection[2]], [rejected * 0.6, rejected * 0.4]).pvalue > P_MIN


def test_certain_children_are_always_accepted_and_impossible_ones_never():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
    parents, tokens = [-1, 0, 0, 1], torch.tensor([0, 0, 1, 2])  # node 1 impossible, node 2 certain
    for seed in range(20):
        path, nxt = verify_tree(parents, tokens, None, p, torch.Generator().manual_seed(seed))
        assert path == [0, 2] and int(nxt) == 0
    # With a sampled q that put no mass where the target does, the next token still follows p.
    q = torch.tensor([[0.0, 0.0, 1.0]] * 4)
    path, nxt = verify_tree([-1, 0], torch.tensor([0, 2]), q[:2], p[[0, 2]], torch.Generator().manual_seed(0))
    assert path == [0] and int(nxt) == 1


def test_greedy_tree_keeps_the_deepest_path_of_argmax_matches():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 5.0], [0.0, 4.0, 0.0], [1.0, 0.0, 0.0]])
    # root -> 1 (token 2: not the argmax 1) and 2 (token 1: the argmax); 2 -> 3 (token 2: argmax), 1 -> 4
    parents, tokens = [-1, 0, 0, 2, 1], torch.tensor([0, 2, 1, 2, 0])
    path, nxt = greedy_tree(parents, tokens, logits)
    assert path == [0, 2, 3] and int(nxt) == 1
    assert children_lists(parents) == [[1, 2], [4], [3], [], []]
    assert deepest_path(parents, [True, True, True, False, True]) == [0, 1, 4]


def test_bad_trees_raise():
    p = torch.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match="parents"):
        verify_tree([0, 0], torch.tensor([0, 1]), None, p)
    with pytest.raises(ValueError, match="parents"):
        verify_tree([-1, 1], torch.tensor([0, 1]), None, p)
    with pytest.raises(ValueError, match="tokens"):
        verify_tree([-1, 0], torch.tensor([0, 3]), None, p)
    with pytest.raises(ValueError, match="tokens"):
        verify_tree([-1, 0], torch.tensor([0]), None, p)
    with pytest.raises(ValueError, match="q must be"):
        verify_tree([-1, 0], torch.tensor([0, 1]), torch.ones(3), p)
    with pytest.raises(ValueError, match="p"):
        verify_tree([-1, 0], torch.tensor([0, 1]), None, torch.full((2, 3), 0.5))
    with pytest.raises(ValueError, match="logits"):
        greedy_tree([-1, 0], torch.tensor([0, 1]), torch.zeros(3, 3))
