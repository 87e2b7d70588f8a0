"""The checks of chapter 10 (constrained decoding): the tokens a state of the byte automaton
allows, and the fewest tokens that still complete a match."""

from __future__ import annotations

import torch

from .common import CheckFailed, as_list, asks_for, call_unchanged


@asks_for("logitlab.constrained.build_index")
def check_allowed_tokens(fn) -> None:
    """Check ``fn(table, vocab, state) -> {token: next_state}`` (chapter 10) against
    :func:`logitlab.constrained.build_index`. ``table`` is a pruned byte automaton's move table
    as nested lists (``table[s][byte]``, -1 for no move), ``vocab`` the bytes of every token
    (``None`` for a special token): the tokens whose every byte has a move from ``state`` on,
    each with the state it ends in."""
    from ..constrained import build_index
    from ..regex_automaton import compile_regex

    e_acute = "é".encode()
    cases = [
        ("a token spanning two moves", "ab", [b"a", b"b", b"ab", b"ba", b"abb"], 0),
        ("a special token (None) and an empty token", "(ab)+", [b"ab", None, b"", b"a", b"b"], 0),
        ("a token that passes an accepting state and goes on", "a(bc)?", [b"a", b"ab", b"abc", b"b", b"bc"], 0),
        ("a character split across tokens", "é+", [e_acute[:1], e_acute[1:], e_acute, b"e", "è".encode()], 0),
        ("inside a character", "é+", [e_acute[:1], e_acute[1:], e_acute, b"e", "è".encode()], 1),
        ("a state where only the end is left", "ab", [b"a", b"b", b"ab"], None),
    ]
    for name, pattern, vocab, state in cases:
        dfa = compile_regex(pattern)
        index = build_index(dfa, vocab)
        if state is None:  # the accepting state reached after the whole pattern
            state = int(dfa.accepting.nonzero()[0])
        span = slice(int(index.offsets[state]), int(index.offsets[state + 1]))
        want = dict(zip(index.tokens[span].tolist(), index.targets[span].tolist()))
        table = dfa.table.tolist()
        label = f"Case {name} (pattern {pattern!r}, vocab {vocab}, state {state})"
        got = call_unchanged(fn, label, table, list(vocab), state, what="the table or the vocabulary")
        if not isinstance(got, dict):
            raise CheckFailed(f"{label}: return a dict {{token id: next state}}, got {type(got).__name__}.")
        got = {int(k): int(v) for k, v in got.items()}
        if set(got) != set(want):
            extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
            hint = ("A token is allowed only if *every* one of its bytes has a move: stop at the first -1. "
                    if extra else "A token may end anywhere inside the pattern, even inside a character. ")
            if any(vocab[t] in (None, b"") for t in extra):
                hint = "Special tokens (None) and empty tokens are never allowed: they add no text. "
            raise CheckFailed(f"{label}: expected the tokens {sorted(want)}, got {sorted(got)} (extra {extra}, "
                              f"missing {missing}). {hint}")
        wrong = {t: (got[t], want[t]) for t in want if got[t] != want[t]}
        if wrong:
            raise CheckFailed(f"{label}: the tokens are right, but these lead elsewhere (yours, expected): {wrong}. "
                              "The next state is the one after the token's last byte.")
    print(f"check_allowed_tokens: all {len(cases)} cases passed.")


@asks_for("logitlab.constrained.fewest_tokens")
def check_fewest_tokens(fn) -> None:
    """Check ``fn(moves, accepting) -> list`` (chapter 10) against
    :func:`logitlab.constrained.fewest_tokens`: ``moves[s]`` lists the states one token leads to
    from state ``s``, ``accepting[s]`` says whether ``s`` completes a match; the answer gives,
    for every state, the fewest tokens that reach an accepting state (0 if it is one), or
    ``None`` where none can be reached."""
    from ..constrained import fewest_tokens

    cases = [
        ("a chain", [[1], [2], []], [False, False, True]),
        ("a short cut", [[1, 3], [2], [3], []], [False, False, False, True]),
        ("a loop", [[0, 1], [1, 2], []], [False, False, True]),
        ("an accepting start", [[1], []], [True, True]),
        ("a state that cannot finish", [[1, 2], [1], []], [False, False, True]),
        ("longer first, shorter later", [[1, 4], [2], [3], [], [3]], [False, False, False, True, False]),
        ("two accepting states, each with its own way in", [[1], [], [3], []], [False, True, False, True]),
    ]
    for name, moves, accepting in cases:
        sources = torch.tensor([s for s, targets in enumerate(moves) for _ in targets], dtype=torch.long)
        targets = torch.tensor([t for targets in moves for t in targets], dtype=torch.long)
        far = torch.iinfo(torch.long).max // 2
        want = [None if d >= far else d for d in fewest_tokens(torch.tensor(accepting), sources, targets).tolist()]
        label = f"Case {name} (moves={moves}, accepting={accepting})"
        got = as_list(call_unchanged(fn, label, [list(m) for m in moves], list(accepting),
                                     what="moves or accepting"))
        if not isinstance(got, list) or len(got) != len(moves):
            raise CheckFailed(f"{label}: return a list with one entry per state, got {got!r}.")
        got = [None if g is None or g == float("inf") else int(g) for g in got]
        if got != want:
            first = next(s for s in range(len(want)) if got[s] != want[s])
            raise CheckFailed(f"{label}: expected {want}, got {got}; state {first} differs. Work backwards from the "
                              "accepting states (breadth first, starting from all of them at once): a state is one token "
                              "further than the nearest state it moves to; a state from which no accepting state is "
                              "reached gets None.")
    print(f"check_fewest_tokens: all {len(cases)} cases passed.")
