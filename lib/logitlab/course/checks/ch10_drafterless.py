"""The checks of chapter 10 (drafting without a drafter): a suffix automaton built token by token,
and the size of a Token Recycling tree chosen from a machine's pass costs."""

from __future__ import annotations

import itertools

import torch

from ...speculative.suffix_automaton import SuffixAutomaton
from ...speculative.token_recycling import best_size, template_chances, tree_template
from .common import CheckFailed, asks_for, call_unchanged, case_generator, draw_float, draw_int

# Sequences over small alphabets, each with a mistake it catches: repeats of one token (the
# state that must be cloned), the worst case for the number of states (a b b b ...), tokens that
# are large numbers (ids, not letters), and a sequence with nothing repeated.
AUTOMATON_CASES = [
    ([1], "one token: the empty string's state and the token's."),
    ([1, 1], "A token repeated: its state is reached from the empty string and from itself."),
    ([1, 2, 1], "The suffix 1 occurred before: the new state's suffix link leads to the state of 1."),
    ([1, 2, 2], "2 ends at two places and 1 2 at one: the state of 1 2 must be split (cloned)."),
    ([1, 2, 1, 2, 3], "A repeat of length 2, then a new token: its suffix link leads to the empty string."),
    ([1, 2, 2, 2, 2], ("The worst case: 2n - 1 states, one clone per repeated 2; a clone's "
                          "transitions are a copy of the original's (a new dict), not the same dict.")),
    ([5, 5, 5, 5], "Every suffix of a run is a repeat; no clone is needed."),
    ([7, 3, 7, 3, 7, 9, 7, 3], "A repeat that branches (7 3 7 9, then 7 3): a state is split after a clone."),
    ([49151, 0, 49151, 0, 17], "Token ids are vocabulary indices, not small letters."),
    ([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], "A longer sequence: every substring, and nothing else, must be accepted."),
]


def _reached(next_: list[dict], tokens: list[int]) -> dict[int, list[tuple]]:
    """Every substring of ``tokens`` walked from state 0: the state -> the strings that reach it,
    or a ``CheckFailed`` naming the first substring the automaton does not accept."""
    strings = {tuple(tokens[i:j]) for i in range(len(tokens) + 1) for j in range(i, len(tokens) + 1)}
    by_state: dict[int, list[tuple]] = {}
    for s in sorted(strings, key=lambda s: (len(s), s)):
        state = 0
        for token in s:
            state = next_[state].get(token) if 0 <= state < len(next_) else None
            if state is None:
                raise CheckFailed(f"the substring {list(s)} is not accepted (no transition on {token}).")
        by_state.setdefault(state, []).append(s)
    return by_state


def _rejects_the_rest(next_: list[dict], tokens: list[int]) -> None:
    """No string that is not a substring is accepted: every string over the sequence's tokens and
    one other, up to one token longer than the sequence (or 5 tokens), is walked."""
    alphabet = sorted(set(tokens)) + [max(tokens) + 1]
    longest = min(len(tokens) + 1, 5)
    text = list(tokens)
    for n in range(1, longest + 1):
        for s in itertools.product(alphabet, repeat=n):
            state = 0
            for token in s:
                state = next_[state].get(token)
                if state is None:
                    break
            found = any(text[i:i + n] == list(s) for i in range(len(text) - n + 1))
            if state is not None and not found:
                raise CheckFailed(f"{list(s)} is accepted but is not a substring: a transition leads too far.")


def _fewest_states(tokens: list[int]) -> int:
    """The states of the suffix automaton: one per distinct set of end positions (two substrings
    that end at the same places have the same futures). It accepts the substrings, and is the
    smallest automaton of the suffixes, though not always of the substrings: in 1 2 2, the
    substrings 2 and 1 2 have the same futures but end at different places."""
    n = len(tokens)
    ends = {tuple(tokens[i:j]): [] for i in range(n + 1) for j in range(i, n + 1)}
    for s in ends:
        ends[s] = tuple(j + len(s) - 1 for j in range(n - len(s) + 1) if tokens[j:j + len(s)] == list(s))
    return len(set(ends.values()))


def _check_one(fn, tokens: list[int], hint: str, label: str | None = None) -> None:
    label = label or f"Case {tokens}"
    got = call_unchanged(fn, label, list(tokens), what="tokens")
    if not (isinstance(got, tuple) and len(got) == 3):
        raise CheckFailed(f"{label}: return (next, link, length), three lists; got {type(got).__name__}.")
    next_, link, length = (list(x) for x in got)
    if not all(isinstance(d, dict) for d in next_):
        raise CheckFailed(f"{label}: next must be a list of dicts (token -> state), one per state.")
    try:
        by_state = _reached(next_, tokens)
        _rejects_the_rest(next_, tokens)
    except CheckFailed as failed:
        raise CheckFailed(f"{label}: {failed} {hint}") from None
    want = _fewest_states(tokens)
    if len(next_) != want:
        raise CheckFailed(f"{label}: expected {want} states (one per set of end positions), got {len(next_)}. "
                          f"{hint}")
    if len(link) != len(next_) or len(length) != len(next_):
        raise CheckFailed(f"{label}: link and length need one entry per state ({len(next_)}).")
    for state, strings in sorted(by_state.items()):
        longest, shortest = max(strings, key=len), min(len(s) for s in strings)
        if length[state] != len(longest):
            raise CheckFailed(f"{label}: state {state} holds {[list(s) for s in strings]}; its length is the "
                              f"longest, {len(longest)}, got {length[state]}. {hint}")
        if state == 0:
            if link[0] != -1:
                raise CheckFailed(f"{label}: the empty string's state has no suffix link (-1), got {link[0]}.")
            continue
        suffix = longest[len(longest) - shortest + 1:]  # the longest suffix not in this state
        target = 0
        for token in suffix:
            target = next_[target][token]
        if link[state] != target:
            raise CheckFailed(f"{label}: the suffix link of state {state} ({[list(s) for s in strings]}) must lead "
                              f"to the state of {list(suffix)}, {target}; got {link[state]}. {hint}")


@asks_for(SuffixAutomaton.extend)
def check_suffix_automaton(fn) -> None:
    """Check ``fn(tokens) -> (next, link, length)`` (chapter 10): the suffix automaton of the
    token list, built token by token. ``next[s]`` is state s's transitions (a dict token ->
    state), ``link[s]`` its suffix link (-1 for state 0, the empty string), ``length[s]`` the
    length of its longest string. Checked: it accepts every substring and nothing else, has one
    state per set of end positions (the suffix automaton's), and each state's length and link are
    right."""
    for tokens, hint in AUTOMATON_CASES:
        _check_one(fn, tokens, hint)
    random = list(_random_sequences())
    for number, tokens in enumerate(random, start=1):
        _check_one(fn, tokens, "Follow the suffix links from the last state; split (clone) a state reached by "
                   "a longer string than its length says.", f"Random case {number} of {len(random)}, {tokens}")
    print(f"check_suffix_automaton: all {len(AUTOMATON_CASES)} cases passed, and {len(random)} random ones.")


def _random_sequences(count: int = 8):
    """Token lists drawn from the case generator: up to 10 tokens over one to four random token
    ids, so that repeats (and clones) are common."""
    gen = case_generator(12)
    for _ in range(count):
        ids = torch.randint(0, 50_000, (draw_int(gen, 1, 5),), generator=gen)
        yield ids[torch.randint(0, len(ids), (draw_int(gen, 1, 11),), generator=gen)].tolist()


def _reference_size(costs: dict, rank_probs, overhead: float) -> int:
    """The size n (n + 1 in costs) with the most expected tokens per decode step; the smallest on a tie."""
    sizes = sorted(n - 1 for n in costs if n >= 2)
    rates = [(1 + sum(template_chances(*tree_template(n, rank_probs), rank_probs))) / (costs[n + 1] + overhead)
             for n in sizes]
    best = max(rates)
    return next(n for n, r in zip(sizes, rates) if r >= best * (1 - 1e-12))


@asks_for(best_size, allows=(template_chances, tree_template))  # the exercise gives both
def check_tree_size(fn) -> None:
    """Check ``fn(costs, rank_probs, overhead) -> int`` (chapter 10): the number of nodes of the
    Token Recycling tree that gives the most tokens per unit of time, among the sizes n >= 1 with
    ``n + 1`` in ``costs`` (a pass over the pending token and n nodes costs ``costs[n + 1]``
    decode steps, and the loop adds ``overhead`` steps per call); a tree of n nodes keeps
    ``1 + sum(template_chances(*tree_template(n, rank_probs), rank_probs))`` tokens, expected.
    The smallest n on a tie."""
    cpu = {1: 1.0, 2: 1.07, 3: 1.11, 4: 1.05, 5: 1.08, 7: 1.21, 9: 1.21, 13: 1.32, 17: 1.44, 25: 1.71, 33: 2.0}
    gpu = {n: 1.0 + 0.002 * n for n in (1, 2, 3, 5, 9, 17, 33, 65)}
    steep = {n: 1.0 + 0.25 * (n - 1) for n in range(1, 10)}
    paper = (0.45, 0.15, 0.08, 0.05, 0.04, 0.03, 0.02, 0.02)
    measured = (0.45, 0.07, 0.025, 0.02, 0.01, 0.007, 0.005, 0.005)
    cases = [
        ("this CPU's v(n)", cpu, paper, 0.0, "Tokens per call over the cost of the pass over n + 1 tokens."),
        ("a GPU, where a pass costs about one step up to 65 tokens", gpu, paper, 0.0,
         "Where a pass costs the same whatever its size, the largest tree pays."),
        ("a pass whose every token adds a quarter of a step", steep, paper, 0.0,
         "The pass over the pending token and n nodes costs costs[n + 1], not costs[n]."),
        ("this CPU, with rank chances measured on the book's prompts", cpu, measured, 0.0,
         "The template and its chances depend on rank_probs: pass them on."),
        ("this CPU with a loop that adds half a step per call", cpu, paper, 0.5,
         "The overhead is paid once per call, whatever the tree's size: add it to the pass's cost."),
        ("costs given out of order", dict(reversed(list(cpu.items()))), paper, 0.0,
         "Consider every size n with n + 1 in costs, whatever order the dict has; the smallest on a tie."),
        ("a single size", {1: 1.0, 3: 1.1}, paper, 0.0, "Only n = 2 has a cost: return it."),
    ]
    random = [(f"Random case {number} of 8", *machine, "Compare the expected tokens per unit of time, "
               "(1 + the sum of the template's chances) / (costs[n + 1] + overhead), of every size.")
              for number, machine in enumerate(_random_machines(8), start=1)]
    for name, costs, rank_probs, overhead, hint in [(f"Case {name}", *rest) for name, *rest in cases] + random:
        label = f"{name} (costs {costs}, rank_probs {rank_probs}, overhead {overhead})"
        got = call_unchanged(fn, label, dict(costs), tuple(rank_probs), overhead, what="costs")
        want = _reference_size(costs, rank_probs, overhead)
        if isinstance(got, bool) or not isinstance(got, int):
            raise CheckFailed(f"{label}: return an int, got {type(got).__name__}.")
        if got != want:
            raise CheckFailed(f"{label}: expected {want} nodes, got {got}. {hint}")
    print(f"check_tree_size: all {len(cases)} cases passed, and {len(random)} random ones.")


def _random_machines(count: int):
    """(costs, rank_probs, overhead) drawn from the case generator: pass costs that grow with the
    pass's size at a random rate (some sizes missing, in random order), falling rank chances that
    sum to less than 1, and an overhead of 0 or up to half a step."""
    gen = case_generator(13)
    for _ in range(count):
        sizes = [1] + [n for n in range(2, 34) if draw_int(gen, 0, 4) == 0]
        sizes = sizes if len(sizes) > 1 else sizes + [draw_int(gen, 2, 34)]
        rate = draw_float(gen, 0.0, 0.1, 3)
        order = torch.randperm(len(sizes), generator=gen).tolist()
        costs = {sizes[i]: round(1.0 + rate * (sizes[i] - 1) + draw_float(gen, 0.0, 0.05, 3), 3) for i in order}
        chances = torch.rand(draw_int(gen, 1, 9), generator=gen, dtype=torch.float64).sort(descending=True).values
        total = draw_float(gen, 0.3, 0.95, 2)
        rank_probs = tuple(round(float(c), 3) for c in chances / chances.sum() * total)
        yield costs, rank_probs, draw_float(gen, 0.0, 0.5, 2) if draw_int(gen, 0, 2) else 0.0
