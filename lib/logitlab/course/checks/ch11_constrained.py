"""The checks of chapter 11 (constrained decoding): a range of code points as UTF-8 byte
ranges, the subset construction, the tokens a state of the byte automaton allows, and the fewest
tokens that still complete a match."""

from __future__ import annotations

import math

import torch

from ...constrained.index import build_index, fewest_tokens
from ...constrained.regex import determinize, utf8_ranges
from .common import CheckFailed, as_list, asks_for, call, call_unchanged, case_generator, draw_int


@asks_for(build_index)
def check_allowed_tokens(fn) -> None:
    """Check ``fn(table, vocab, state) -> {token: next_state}`` (chapter 11) against
    :func:`logitlab.constrained.index.build_index`. ``table`` is a pruned byte automaton's move table
    as nested lists (``table[s][byte]``, -1 for no move), ``vocab`` the bytes of every token
    (``None`` for a special token): the tokens whose every byte has a move from ``state`` on,
    each with the state it ends in."""
    from ...constrained.regex import compile_regex

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
        if state is None:  # the accepting state reached after the whole pattern
            state = int(dfa.accepting.nonzero()[0])
        _compare_allowed(fn, f"Case {name} (pattern {pattern!r}, vocab {vocab}, state {state})", dfa, vocab, state)
    random = list(_random_vocabularies([pattern for _, pattern, _, _ in cases], compile_regex))
    for number, (pattern, dfa, vocab, state) in enumerate(random, start=1):
        label = f"Random case {number} of {len(random)} (pattern {pattern!r}, vocab {vocab}, state {state})"
        _compare_allowed(fn, label, dfa, vocab, state)
    print(f"check_allowed_tokens: all {len(cases)} cases passed, and {len(random)} random ones.")


def _random_vocabularies(patterns: list[str], compile_regex, count: int = 6):
    """(pattern, automaton, vocab, state) drawn from the case generator: one of the hand cases'
    patterns, a vocabulary of short tokens over the pattern's bytes and one byte it never uses
    (and now and then a special token, None), and any state of the automaton."""
    gen = case_generator(14)
    for _ in range(count):
        pattern = patterns[draw_int(gen, 0, len(patterns))]
        dfa = compile_regex(pattern)
        alphabet = sorted(set(pattern.encode()) - set(b"()+?*|")) + [ord("x")]
        vocab = []
        while not any(vocab):  # at least one token with bytes (build_index needs one)
            vocab = [None if draw_int(gen, 0, 10) == 0 else
                     bytes(alphabet[draw_int(gen, 0, len(alphabet))] for _ in range(draw_int(gen, 0, 4)))
                     for _ in range(draw_int(gen, 4, 11))]
        yield pattern, dfa, vocab, draw_int(gen, 0, dfa.num_states)


def _compare_allowed(fn, label: str, dfa, vocab: list, state: int) -> None:
    index = build_index(dfa, vocab)
    span = slice(int(index.offsets[state]), int(index.offsets[state + 1]))
    want = dict(zip(index.tokens[span].tolist(), index.targets[span].tolist()))
    got = call_unchanged(fn, label, dfa.table.tolist(), list(vocab), state, what="the table or the vocabulary")
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


@asks_for(fewest_tokens)
def check_fewest_tokens(fn) -> None:
    """Check ``fn(moves, accepting) -> list`` (chapter 11) against
    :func:`logitlab.constrained.index.fewest_tokens`: ``moves[s]`` lists the states one token leads to
    from state ``s``, ``accepting[s]`` says whether ``s`` completes a match; the answer gives,
    for every state, the fewest tokens that reach an accepting state (0 if it is one), or
    ``None`` where none can be reached."""

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
        _compare_fewest(fn, f"Case {name} (moves={moves}, accepting={accepting})", moves, accepting)
    gen = case_generator(15)  # random automata: the same in a notebook, unseen while grading
    random = []
    for _ in range(8):
        n = draw_int(gen, 1, 9)
        moves = [sorted({draw_int(gen, 0, n) for _ in range(draw_int(gen, 0, 4))}) for _ in range(n)]
        random.append((moves, [draw_int(gen, 0, 4) == 0 for _ in range(n)]))
    for number, (moves, accepting) in enumerate(random, start=1):
        _compare_fewest(fn, f"Random case {number} of {len(random)} (moves={moves}, accepting={accepting})",
                        moves, accepting)
    print(f"check_fewest_tokens: all {len(cases)} cases passed, and {len(random)} random ones.")


def _compare_fewest(fn, label: str, moves: list, accepting: list) -> None:
    sources = torch.tensor([s for s, targets in enumerate(moves) for _ in targets], dtype=torch.long)
    targets = torch.tensor([t for targets in moves for t in targets], dtype=torch.long)
    far = torch.iinfo(torch.long).max // 2
    want = [None if d >= far else d for d in fewest_tokens(torch.tensor(accepting), sources, targets).tolist()]
    got = as_list(call_unchanged(fn, label, [list(m) for m in moves], list(accepting), what="moves or accepting"))
    if not isinstance(got, list) or len(got) != len(moves):
        raise CheckFailed(f"{label}: return a list with one entry per state, got {got!r}.")
    got = [None if g is None or g == float("inf") else int(g) for g in got]
    if got != want:
        first = next(s for s in range(len(want)) if got[s] != want[s])
        raise CheckFailed(f"{label}: expected {want}, got {got}; state {first} differs. Work backwards from the "
                          "accepting states (breadth first, starting from all of them at once): a state is one token "
                          "further than the nearest state it moves to; a state from which no accepting state is "
                          "reached gets None.")


@asks_for(utf8_ranges)
def check_utf8_ranges(fn) -> None:
    """Check ``fn(lo, hi) -> [[(byte_lo, byte_hi), ...], ...]`` (chapter 11) against
    :func:`logitlab.constrained.regex.utf8_ranges`: the byte strings the sequences match (one
    byte from each range, in order) must be exactly the UTF-8 encodings of the code points
    ``lo..hi``, each matched once, in no more sequences than the library needs."""


    cases = [
        ("one code point", 0xE9, 0xE9),
        ("ASCII letters", 0x61, 0x7A),
        ("across the one/two-byte boundary", 0x70, 0x90),
        ("across the one/two-byte boundary, on 64-boundaries", 0x40, 0xBF),
        ("every two-byte code point", 0x80, 0x7FF),
        ("two bytes, not aligned to a lead byte", 0x3A5, 0x4C2),
        ("across the two/three-byte boundary", 0x7F0, 0x820),
        ("three bytes, not aligned", 0x20AC, 0x3001),
        ("across the three/four-byte boundary", 0xFFF0, 0x10010),
    ]
    random = [(f"Random case {number} of 8", lo, hi) for number, (lo, hi) in enumerate(_random_code_ranges(8), 1)]
    for name, lo, hi in [(f"Case {name}", lo, hi) for name, lo, hi in cases] + random:
        label = f"{name} (lo=0x{lo:X}, hi=0x{hi:X})"
        got = call(fn, label, lo, hi)
        try:
            got = [[(int(a), int(b)) for a, b in sequence] for sequence in got]
        except (TypeError, ValueError):
            raise CheckFailed(f"{label}: return a list of sequences, each a list of (low byte, high byte) pairs; "
                              f"got {got!r}.") from None
        bad = [pair for sequence in got for pair in sequence if not 0 <= pair[0] <= pair[1] <= 255]
        if bad or any(not sequence for sequence in got):
            raise CheckFailed(f"{label}: every sequence needs at least one range, and each range is (low, high) with "
                              f"0 <= low <= high <= 255; got {bad[:3] or 'an empty sequence'}.")
        wanted = {chr(c).encode(): c for c in range(lo, hi + 1)}
        matched = _matched_bytes(label, got, len(wanted))
        extra = [m for m in matched if m not in wanted]
        if extra:
            raise CheckFailed(f"{label}: your sequences match {extra[0].hex(' ')}, which is not the UTF-8 encoding of a "
                              "code point in the range. Split the range where the encodings change length, and where a "
                              "lower-order byte does not run through all of 80-bf.")
        distinct = set(matched)  # built once: the range can hold thousands of code points
        if len(matched) != len(distinct):
            twice = next(m for m in matched if matched.count(m) > 1)
            raise CheckFailed(f"{label}: {twice.hex(' ')} is matched by two sequences; the pieces must not overlap.")
        missing = [c for data, c in wanted.items() if data not in distinct]
        if missing:
            raise CheckFailed(f"{label}: U+{missing[0]:04X} ({chr(missing[0]).encode().hex(' ')}) is matched by no "
                              f"sequence ({len(missing)} code points are missing).")
        least = len(utf8_ranges(lo, hi))
        if len(got) > least:
            raise CheckFailed(f"{label}: right bytes, but {len(got)} sequences where {least} suffice: a run of code "
                              "points whose lower-order bytes go through all of 80-bf is one sequence.")
    print(f"check_utf8_ranges: all {len(cases)} cases passed, and {len(random)} random ones.")


def _random_code_ranges(count: int):
    """(lo, hi) drawn from the case generator: up to 1,500 code points starting a little below a
    boundary where the encodings change length (80, 800, 10000) or anywhere, never touching the
    surrogates D800-DFFF (no UTF-8 encoding)."""
    gen = case_generator(16)
    while count:
        boundary = [0x80, 0x800, 0x10000, draw_int(gen, 0, 0x110000)][draw_int(gen, 0, 4)]
        lo = max(0, boundary - draw_int(gen, 0, 300))
        hi = min(0x10FFFF, lo + draw_int(gen, 0, 1500))
        if hi < 0xD800 or lo > 0xDFFF:  # else draw again
            count -= 1
            yield lo, hi


def _matched_bytes(label: str, sequences, count: int) -> list[bytes]:
    """Every byte string the sequences match, in order (with repeats); fails, before listing
    them, when there are far more than the ``count`` code points of the range."""
    import itertools

    size = sum(math.prod(b - a + 1 for a, b in sequence) for sequence in sequences)
    if size > 4 * count:
        raise CheckFailed(f"{label}: your sequences match {size} byte strings, but there are only {count} "
                          "code points: a range of a lower-order byte covers more than it should.")
    return [bytes(s) for sequence in sequences for s in itertools.product(*(range(a, b + 1) for a, b in sequence))]


@asks_for(determinize)
def check_subset_construction(fn) -> None:
    """Check ``fn(symbols, moves, empty, start, accepting) -> (table, final)`` (chapter 11)
    against :func:`logitlab.constrained.regex.determinize`. The automaton has states ``0..n-1``;
    ``moves[s]`` lists its labelled moves ``(symbol, next)`` with ``0 <= symbol < symbols``,
    ``empty[s]`` its empty moves; ``accepting`` is a list of states. The answer numbers its
    states from 0 (the start's closure), ``table[d][symbol]`` is the next state or -1 (the empty
    set), ``final[d]`` whether ``d`` accepts: one state per reachable non-empty set."""
    from ...constrained.regex import ByteNFA

    cases = [
        ("a then b", 2, [[(0, 1)], [(1, 2)], []], [[], [], []], 0, [2]),
        ("no move on a symbol: -1, not a state", 2, [[(0, 1)], []], [[], []], 0, [1]),
        ("empty moves from the start", 2, [[], [(0, 3)], [(1, 3)], []], [[1, 2], [], [], []], 0, [3]),
        ("a guess: (a|b)*ab", 2, [[(0, 0), (1, 0), (0, 1)], [(1, 2)], []], [[], [], []], 0, [2]),
        ("empty moves after a symbol: a*b*", 2, [[(0, 0)], [(1, 1)]], [[1], []], 0, [1]),
        ("accepting through an empty move", 2, [[(0, 1)], [], []], [[], [2], []], 0, [2]),
        ("a loop of empty moves", 3, [[], [(0, 2)], [(2, 0)]], [[1], [0], [0]], 0, [2]),
        ("two accepting states", 2, [[(0, 1), (1, 2)], [(0, 1)], []], [[], [], []], 0, [1, 2]),
    ]
    random = [(f"Random case {number} of 8", *automaton) for number, automaton in enumerate(_random_nfas(8), 1)]
    for name, symbols, moves, empty, start, accepting in [(f"Case {name}", *rest) for name, *rest in cases] + random:
        nfa = ByteNFA()
        for _ in range(len(moves) + 1):
            nfa.state()
        end = len(moves)  # one accepting state for the library, reached by empty moves
        for s in range(len(moves)):
            nfa.moves[s] = [(a, a, t) for a, t in moves[s]]
            nfa.empty[s] = list(empty[s]) + ([end] if s in accepting else [])
        reference = determinize(nfa, start, end)
        label = f"{name} (symbols={symbols}, moves={moves}, empty={empty}, start={start}, accepting={accepting})"
        got = call_unchanged(fn, label, symbols, [list(m) for m in moves], [list(e) for e in empty], start,
                             list(accepting), what="the automaton")
        try:
            table, final = got
            table = [[int(x) for x in row] for row in as_list(table)]
            final = [bool(f) for f in as_list(final)]
        except (TypeError, ValueError):
            raise CheckFailed(f"{label}: return (table, final): table[d][symbol] the next state or -1, "
                              f"final[d] True or False; got {got!r}.") from None
        if len(final) != len(table) or any(len(row) != symbols for row in table) or any(
                not -1 <= x < len(table) for row in table for x in row):
            raise CheckFailed(f"{label}: table needs one row per state, each with {symbols} entries, each a state "
                              f"number or -1, and final one entry per state; got table={table}, final={final}.")
        shortest = _first_difference(table, final, reference, symbols, depth=6)
        if shortest is not None:
            text, want = shortest
            raise CheckFailed(f"{label}: the symbols {text} are {'' if want else 'not '}accepted by the automaton, "
                              f"but {'not ' if want else ''}by yours. A set of states must include everything its "
                              "empty moves reach: take the closure of the start, and again after every symbol.")
        if len(table) != reference.num_states:
            raise CheckFailed(f"{label}: the right strings are accepted, but with {len(table)} states where the subset "
                              f"construction gives {reference.num_states}: one state per reachable non-empty set of "
                              "states, each numbered once (a dict from frozenset to number), none merged or repeated.")
    print(f"check_subset_construction: all {len(cases)} cases passed, and {len(random)} random ones.")


def _random_nfas(count: int):
    """(symbols, moves, empty, start, accepting) drawn from the case generator: two to five states
    over two or three symbols, each with up to two labelled moves and now and then an empty one."""
    gen = case_generator(17)
    for _ in range(count):
        n, symbols = draw_int(gen, 2, 6), draw_int(gen, 2, 4)
        moves = [[(draw_int(gen, 0, symbols), draw_int(gen, 0, n)) for _ in range(draw_int(gen, 0, 3))]
                 for _ in range(n)]
        empty = [[t for t in [draw_int(gen, 0, n)] if t != s and draw_int(gen, 0, 3) == 0] for s in range(n)]
        accepting = sorted({draw_int(gen, 0, n) for _ in range(draw_int(gen, 1, 3))})
        yield symbols, moves, empty, 0, accepting


def _first_difference(table, final, reference, symbols: int, depth: int):
    """The shortest symbol string (up to ``depth``) that one automaton accepts and the other
    does not, with whether the reference accepts it; None if they agree on all of them."""
    import itertools

    for length in range(depth + 1):
        for text in itertools.product(range(symbols), repeat=length):
            state = 0
            for symbol in text:
                state = table[state][symbol] if state >= 0 else -1
            mine = state >= 0 and final[state]
            want = reference.matches(bytes(text))
            if mine != want:
                return list(text), want
    return None
