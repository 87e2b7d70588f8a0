"""The checks of chapter 8 (parallel speculative sampling): the parents lists of the training layout
and of the single-call layout."""

from __future__ import annotations

import copy

import torch

from ...speculative.pass_embeddings import single_call_layout, training_layout
from .common import CheckFailed, as_list, asks_for, call, case_generator, draw_int


@asks_for(training_layout)
def check_training_layout(fn) -> None:
    """Check ``fn(length, starts, k) -> parents`` (chapter 8) against
    :func:`logitlab.speculative.pass_embeddings.training_layout`: a sequence of ``length`` tokens as a chain, then
    ``k`` look-ahead slots in a chain after each context end ``t`` in ``starts``."""

    cases = [("one token, one slot", 1, [0], 1), ("the chapter's drawing", 5, [1, 3], 2),
             ("two groups after the same token", 4, [2, 2], 3), ("no groups", 3, [], 2),
             ("starts not in increasing order", 5, [3, 0], 2)]
    gen = case_generator(8)  # random layouts: the same in a notebook, unseen while grading
    random = []
    for _ in range(8):
        length = draw_int(gen, 1, 10)
        starts = torch.randint(0, length, (draw_int(gen, 0, 5),), generator=gen).tolist()
        random.append((length, starts, draw_int(gen, 1, 5)))
    hint = ("The tokens come first, each the child of the one before; then each group, in the order of starts "
            "(not sorted): its first slot hangs from token t, each later slot from the slot before it.")
    _compare_parents(fn, training_layout, [(f"Case {name} (length={length}, starts={starts}, k={k})",
                                            (length, starts, k)) for name, length, starts, k in cases], hint)
    _compare_parents(fn, training_layout, [
        (f"Random case {number} of {len(random)} (length={length}, starts={starts}, k={k})", (length, starts, k))
        for number, (length, starts, k) in enumerate(random, start=1)], hint)
    print(f"check_training_layout: all {len(cases)} cases passed, and {len(random)} random ones.")


@asks_for(single_call_layout)
def check_single_call_layout(fn) -> None:
    """Check ``fn(num_drafts, groups) -> parents`` (chapter 8) against
    :func:`logitlab.speculative.pass_embeddings.single_call_layout`: the pending token, the drafts as a chain, then a
    chain of ``groups[j]`` slots after each prefix length ``j`` (in increasing order of j)."""

    cases = [("no drafts, three slots", 0, {0: 3}), ("two drafts, slots after every prefix", 2, {0: 2, 1: 2, 2: 2}),
             ("slots after the full prefix only", 3, {3: 2}), ("groups given out of order", 2, {2: 1, 0: 1}),
             ("no slots at all", 2, {}), ("a prefix with no slots", 2, {0: 0, 1: 2})]
    gen = case_generator(9)  # random layouts: the same in a notebook, unseen while grading
    random = []
    for _ in range(8):
        num_drafts = draw_int(gen, 0, 6)
        prefixes = torch.randperm(num_drafts + 1, generator=gen).tolist()  # the dict's order is random too
        random.append((num_drafts, {j: draw_int(gen, 0, 4) for j in prefixes if draw_int(gen, 0, 2)}))
    hint = ("Node 0 is the pending token (parent -1), draft i is node i (parent i - 1); the group for prefix j "
            "starts at node j and groups come in increasing j; a group of 0 slots adds no node.")
    _compare_parents(fn, single_call_layout, [(f"Case {name} (num_drafts={m}, groups={groups})", (m, groups))
                                              for name, m, groups in cases], hint)
    _compare_parents(fn, single_call_layout, [
        (f"Random case {number} of {len(random)} (num_drafts={m}, groups={groups})", (m, groups))
        for number, (m, groups) in enumerate(random, start=1)], hint)
    print(f"check_single_call_layout: all {len(cases)} cases passed, and {len(random)} random ones.")


def _compare_parents(fn, reference, cases, hint: str) -> None:
    """``fn(*args)`` must give the parents list ``reference(*args)`` gives, for each ``(label, args)``."""
    for label, args in cases:
        got = as_list(call(fn, label, *copy.deepcopy(args)))  # a copy: the student may change them
        want = reference(*args)
        if got != want:
            raise CheckFailed(f"{label}: expected parents {want}, got {got}. {hint}")
