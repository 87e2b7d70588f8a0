"""The checkers of chapter 10's exercises accept right answers and reject typical mistakes."""

from collections import deque

import pytest

import logitlab as ll
from logitlab.checks import CheckFailed


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
