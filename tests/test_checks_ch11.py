"""The checkers of chapter 11's exercises accept right answers and reject typical mistakes."""

from collections import deque

import pytest

import logitlab as ll
from logitlab.course.checks import CheckFailed


def allowed_tokens(table, vocab, state, skip_empty=True, whole_token=True, end_state=True):
    allowed = {}
    for token, data in enumerate(vocab):
        if data is None or (skip_empty and data == b""):
            continue
        here, last = state, state
        for byte in data:
            last, here = here, table[here][byte]
            if here < 0:
                break
            if not whole_token:  # wrong: stops after the first byte
                break
        if here >= 0:
            allowed[token] = here if end_state else last
    return allowed


def test_check_allowed_tokens(capsys):
    ll.checks.check_allowed_tokens(allowed_tokens)
    assert "check_allowed_tokens: all 6 cases passed" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="empty tokens are never allowed"):
        ll.checks.check_allowed_tokens(lambda t, v, s: allowed_tokens(t, v, s, skip_empty=False))
    with pytest.raises(CheckFailed, match="one of its bytes has a move"):
        ll.checks.check_allowed_tokens(lambda t, v, s: allowed_tokens(t, v, s, whole_token=False))
    with pytest.raises(CheckFailed, match="lead elsewhere"):
        ll.checks.check_allowed_tokens(lambda t, v, s: allowed_tokens(t, v, s, end_state=False))
    with pytest.raises(CheckFailed, match="return a dict"):
        ll.checks.check_allowed_tokens(lambda t, v, s: list(allowed_tokens(t, v, s)))


def fewest_tokens(moves, accepting, backwards=True, every_start=True):
    if not backwards:  # wrong: counts the moves to the first accepting state in list order
        return [0 if a else next((1 for t in m if accepting[t]), None) for m, a in zip(moves, accepting)]
    into = [[] for _ in moves]
    for s, targets in enumerate(moves):
        for t in targets:
            into[t].append(s)
    best = [0 if a else None for a in accepting]
    # every_start=False is wrong: the search starts from the first accepting state only
    queue = deque(s for s, a in enumerate(accepting) if a) if every_start else deque([accepting.index(True)])
    while queue:
        t = queue.popleft()
        for s in into[t]:
            if best[s] is None:
                best[s] = best[t] + 1
                queue.append(s)
    return best


def test_check_fewest_tokens(capsys):
    ll.checks.check_fewest_tokens(fewest_tokens)
    assert "check_fewest_tokens: all 7 cases passed" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="Work backwards"):
        ll.checks.check_fewest_tokens(lambda m, a: fewest_tokens(m, a, backwards=False))
    with pytest.raises(CheckFailed, match="Work backwards"):  # infinity where None is expected is accepted,
        ll.checks.check_fewest_tokens(lambda m, a: [0 if x else 99 for x in a])  # a wrong count is not
    inf = [d if d is not None else float("inf") for d in fewest_tokens([[1, 2], [1], []], [False, False, True])]
    assert inf[1] == float("inf")
    ll.checks.check_fewest_tokens(lambda m, a: [d if d is not None else float("inf") for d in fewest_tokens(m, a)])
    with pytest.raises(CheckFailed, match="one entry per state"):
        ll.checks.check_fewest_tokens(lambda m, a: fewest_tokens(m, a)[:-1])


def test_check_fewest_tokens_starts_from_every_accepting_state():
    with pytest.raises(CheckFailed, match="Case two accepting states, each with its own way in.*state 2 differs"):
        ll.checks.check_fewest_tokens(lambda m, a: fewest_tokens(m, a, every_start=False))


def utf8_ranges(lo, hi, split_lengths=True, merge=True):
    """Split lo..hi where the encoding's length changes, then where a trailing byte does not
    run through all of 80-bf; each piece is one sequence of ranges."""
    limits = (0x7F, 0x7FF, 0xFFFF) if split_lengths else ()
    for limit in limits:
        if lo <= limit < hi:
            return utf8_ranges(lo, limit, merge=merge) + utf8_ranges(limit + 1, hi, merge=merge)
    if not merge:  # right bytes, one sequence per code point: too many pieces
        return [[(b, b) for b in chr(c).encode()] for c in range(lo, hi + 1)]
    for i in (1, 2, 3):
        low = (1 << (6 * i)) - 1
        if lo & ~low != hi & ~low:
            if lo & low:
                return utf8_ranges(lo, lo | low, split_lengths) + utf8_ranges((lo | low) + 1, hi, split_lengths)
            if hi & low != low:
                return utf8_ranges(lo, (hi & ~low) - 1, split_lengths) + utf8_ranges(hi & ~low, hi, split_lengths)
    return [list(zip(chr(lo).encode(), chr(hi).encode()))]


def test_check_utf8_ranges(capsys):
    ll.checks.check_utf8_ranges(utf8_ranges)
    assert "check_utf8_ranges: all 9 cases passed" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="Case across the one/two-byte boundary, on 64-boundaries.*(not the UTF-8|no sequence)"):
        ll.checks.check_utf8_ranges(lambda lo, hi: utf8_ranges(lo, hi, split_lengths=False))
    with pytest.raises(CheckFailed, match="sequences where .* suffice"):
        ll.checks.check_utf8_ranges(lambda lo, hi: utf8_ranges(lo, hi, merge=False))
    # the naive pairing of the two ends' bytes matches bytes outside the range
    with pytest.raises(CheckFailed, match="two bytes, not aligned.*(not the UTF-8 encoding|match .* byte strings|low <= high)"):
        ll.checks.check_utf8_ranges(lambda lo, hi: [list(zip(chr(lo).encode(), chr(hi).encode()))]
                                    if len(chr(lo).encode()) == len(chr(hi).encode()) else utf8_ranges(lo, hi))
    with pytest.raises(CheckFailed, match="matched by two sequences"):
        ll.checks.check_utf8_ranges(lambda lo, hi: utf8_ranges(lo, hi) * 2 if lo != hi else utf8_ranges(lo, hi))
    with pytest.raises(CheckFailed, match="is matched by no sequence"):
        ll.checks.check_utf8_ranges(lambda lo, hi: utf8_ranges(lo, hi)[:-1] if lo != hi else utf8_ranges(lo, hi))
    with pytest.raises(CheckFailed, match="list of sequences"):
        ll.checks.check_utf8_ranges(lambda lo, hi: 3)


def subset_construction(symbols, moves, empty, start, accepting, close_after=True, reuse=True):
    def closure(states):
        seen, todo = set(states), list(states)
        while todo:
            for t in empty[todo.pop()]:
                if t not in seen:
                    seen.add(t)
                    todo.append(t)
        return frozenset(seen)

    first = closure([start])
    number, order, table = {first: 0}, [first], []
    while len(table) < len(order):
        members, row = order[len(table)], []
        for a in range(symbols):
            reached = {t for s in members for b, t in moves[s] if b == a}
            target = closure(reached) if close_after else frozenset(reached)
            if not target:
                row.append(-1)
                continue
            if target not in number or not reuse:  # reuse=False: wrong, a set gets a new state each time
                if not reuse and len(order) > 40:
                    row.append(number[target])
                    continue
                number[target] = len(order)
                order.append(target)
            row.append(number[target])
        table.append(row)
    return table, [bool(set(members) & set(accepting)) for members in order]


def test_check_subset_construction(capsys):
    ll.checks.check_subset_construction(subset_construction)
    assert "check_subset_construction: all 8 cases passed" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="Case empty moves after a symbol.*closure"):
        ll.checks.check_subset_construction(lambda *a: subset_construction(*a, close_after=False))
    with pytest.raises(CheckFailed, match="states where the subset construction gives"):
        ll.checks.check_subset_construction(lambda *a: subset_construction(*a, reuse=False))
    with pytest.raises(CheckFailed, match="one row per state"):
        ll.checks.check_subset_construction(lambda *a: ([[0]], [True]))
    with pytest.raises(CheckFailed, match="return \\(table, final\\)"):
        ll.checks.check_subset_construction(lambda *a: None)
