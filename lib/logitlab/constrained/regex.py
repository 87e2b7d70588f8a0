"""From a regular expression to a deterministic automaton over bytes.

Chapter 11 ("When the output must match a pattern") explains this module.

A tokenizer with byte-level BPE cuts text into *bytes*, not characters: ``é`` is two bytes
(``c3 a9``) and a token may end between them. So the automaton that checks an output reads
bytes. Three steps, each a function here:

1. ``parse``: the pattern becomes a tree of four kinds of node: a set of characters, a sequence,
   an alternative and a repetition.
2. ``ByteNFA``: each node becomes a small automaton with empty moves (Thompson's construction);
   a set of characters becomes the UTF-8 byte sequences of its characters (``utf8_ranges``).
3. ``determinize``: the subsets of NFA states reachable on each byte become the states of a
   deterministic automaton (the subset construction); states from which no accepting state
   can be reached are pruned (``ByteDFA.prune``), so "still live" means "still completable",
   and equivalent states are merged (``minimize``).

The supported syntax is the regular core of Python's ``re``: characters and escapes, ``.``,
classes ``[a-z]`` and ``[^...]``, ``\\d \\w \\s`` and their negations ``\\D \\W \\S``, groups
``(...)`` and ``(?:...)``, ``|``, and ``* + ? {m} {m,} {m,n}`` (lazy forms accepted: they match
the same strings). Anchors, backreferences and lookarounds raise ``ValueError``: the pattern
always has to match the whole output, and the last two are not regular.

``\\d``, ``\\w`` and ``\\s`` are the ASCII classes ``[0-9]``, ``[a-zA-Z0-9_]`` and
``[ \\t\\n\\r\\f\\v]``, as Python's ``re`` reads them with the ``re.ASCII`` flag. Without that
flag ``re`` reads them as Unicode classes for a str pattern (``'٣'`` and ``'３'`` are digits there,
``'é'`` a word character, ``'\\u00a0'`` a space); here they are not, and ``\\D \\W \\S`` take
them in instead. So the automaton accepts a string exactly when
``re.fullmatch(pattern, string, flags=re.ASCII)`` does. Write a Unicode class out where one is
meant, e.g. ``[0-9\\u0660-\\u0669]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)  # not characters: UTF-8 cannot encode them
# \d \w \s as Python's re.ASCII reads them (not re's default Unicode classes); see above.
CLASS_ESCAPES = {
    "d": [(48, 57)],
    "w": [(48, 57), (65, 90), (95, 95), (97, 122)],
    "s": [(9, 13), (32, 32)],
}
CHARACTER_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
MAX_REPEAT = 1000  # {m,n} is unrolled into copies; this bounds the automaton's size


# -- 1. Parsing ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Node:
    """One node of the parsed pattern: ``kind`` is "set" (``ranges`` of code points),
    "seq" or "alt" (``children``), or "repeat" (one child, ``low`` to ``high`` times; ``high``
    None means unbounded)."""
    kind: str
    ranges: tuple = ()
    children: tuple = ()
    low: int = 0
    high: int | None = 0


def normalise(ranges) -> tuple:
    """Sorted, merged code-point ranges without the surrogates."""
    cut = []
    for lo, hi in ranges:
        if lo <= SURROGATES[1] and hi >= SURROGATES[0]:
            cut += [(lo, SURROGATES[0] - 1), (SURROGATES[1] + 1, hi)]
        else:
            cut.append((lo, hi))
    merged = []
    for lo, hi in sorted(r for r in cut if r[0] <= r[1]):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def complement(ranges) -> tuple:
    """Every character not in ``ranges``."""
    out, start = [], 0
    for lo, hi in normalise(ranges):
        out.append((start, lo - 1))
        start = hi + 1
    out.append((start, MAX_CODE_POINT))
    return normalise(out)


def parse(pattern: str) -> Node:
    """The tree of ``pattern``; ``ValueError`` (with the position) if it is not a supported
    regular expression (the syntax above; ``\\d \\w \\s`` are ASCII classes, as with ``re.ASCII``)."""
    if not isinstance(pattern, str):
        raise ValueError(f"pattern must be a str, got {type(pattern).__name__}")
    parser = _Parser(pattern)
    node = parser.alternation()
    if parser.pos < len(pattern):
        parser.fail("unbalanced ')'")
    return node


class _Parser:
    """A recursive-descent parser: alternation > sequence > repeated atom."""

    def __init__(self, pattern: str):
        self.text, self.pos = pattern, 0

    def fail(self, why: str):
        raise ValueError(f"pattern {self.text!r}: {why} at position {self.pos}")

    def peek(self) -> str | None:
        return self.text[self.pos] if self.pos < len(self.text) else None

    def take(self) -> str:
        if self.pos >= len(self.text):
            self.fail("unexpected end")
        self.pos += 1
        return self.text[self.pos - 1]

    def alternation(self) -> Node:
        options = [self.sequence()]
        while self.peek() == "|":
            self.take()
            options.append(self.sequence())
        return options[0] if len(options) == 1 else Node("alt", children=tuple(options))

    def sequence(self) -> Node:
        items = []
        while self.peek() not in (None, "|", ")"):
            items.append(self.repeated(self.atom()))
        return items[0] if len(items) == 1 else Node("seq", children=tuple(items))

    def repeated(self, node: Node) -> Node:
        while self.peek() in ("*", "+", "?", "{"):
            if self.peek() == "{" and not self.counted_ahead():
                break
            low, high = self.quantifier()
            if self.peek() == "?":  # lazy: same set of strings, so the same automaton
                self.take()
            node = Node("repeat", children=(node,), low=low, high=high)
        return node

    def counted_ahead(self) -> bool:
        end = self.text.find("}", self.pos)
        inside = self.text[self.pos + 1:end] if end > 0 else ""
        parts = inside.split(",", 1)
        return all(part.isdigit() or part == "" for part in parts) and any(part.isdigit() for part in parts)

    def quantifier(self) -> tuple[int, int | None]:
        symbol = self.take()
        if symbol != "{":
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[symbol]
        end = self.text.index("}", self.pos)
        inside, self.pos = self.text[self.pos:end], end + 1
        low, _, high = inside.partition(",")
        bounds = (int(low or 0), None if "," in inside and not high else int(high or low))
        if bounds[1] is not None and bounds[1] < bounds[0]:
            self.fail(f"{{{inside}}} has its maximum below its minimum")
        if max(b for b in bounds if b is not None) > MAX_REPEAT:
            self.fail(f"counts above {MAX_REPEAT} are not supported")
        return bounds

    def atom(self) -> Node:
        char = self.take()
        if char == "(":
            if self.text.startswith("?:", self.pos):
                self.pos += 2
            elif self.peek() == "?":
                self.fail("lookarounds, named groups and flags are not supported")
            node = self.alternation()
            if self.peek() != ")":
                self.fail("missing ')'")
            self.take()
            return node
        if char in "*+?{":
            if char == "{" and not self.counted_ahead_from(self.pos - 1):
                return Node("set", ranges=((ord(char), ord(char)),))
            self.fail(f"nothing to repeat before {char!r}")
        if char in "^$":
            self.fail("anchors are not supported: the pattern always matches the whole output")
        if char == ".":
            return Node("set", ranges=complement([(10, 10)]))
        if char == "[":
            return Node("set", ranges=self.character_class())
        if char == "\\":
            return Node("set", ranges=self.escape(in_class=False))
        return Node("set", ranges=((ord(char), ord(char)),))

    def counted_ahead_from(self, position: int) -> bool:
        self.pos, saved = position, self.pos
        try:
            return self.counted_ahead()
        finally:
            self.pos = saved

    def escape(self, in_class: bool) -> tuple:
        char = self.take()
        if char.lower() in CLASS_ESCAPES:
            ranges = normalise(CLASS_ESCAPES[char.lower()])
            return complement(ranges) if char.isupper() else ranges
        if char == "0" and self.peek() is not None and self.peek() in "01234567":
            self.fail("octal escapes are not supported (write \\x01 for \\01)")
        if char in CHARACTER_ESCAPES:
            code = ord(CHARACTER_ESCAPES[char])
        elif char in "xu":
            digits = self.text[self.pos:self.pos + (2 if char == "x" else 4)]
            if len(digits) != (2 if char == "x" else 4) or any(d not in "0123456789abcdefABCDEF" for d in digits):
                self.fail(f"\\{char} needs {2 if char == 'x' else 4} hexadecimal digits")
            self.pos += len(digits)
            code = int(digits, 16)
        elif char.isalnum():
            kind = "backreferences" if char.isdigit() else f"the escape \\{char}"
            self.fail(f"{kind} {'are' if char.isdigit() else 'is'} not supported")
        else:
            code = ord(char)
        return normalise([(code, code)])

    def character_class(self) -> tuple:
        negate = self.peek() == "^"
        if negate:
            self.take()
        ranges, first = [], True
        while self.peek() != "]" or first:
            first = False
            char = self.take()
            if char == "\\":
                part = self.escape(in_class=True)
            else:
                part = ((ord(char), ord(char)),)
            if len(part) == 1 and part[0][0] == part[0][1] and self.peek() == "-" \
                    and self.text[self.pos + 1:self.pos + 2] not in ("]", ""):
                self.take()
                end = self.take()
                high = self.escape(in_class=True) if end == "\\" else ((ord(end), ord(end)),)
                if len(high) != 1 or high[0][0] != high[0][1] or high[0][0] < part[0][0]:
                    self.fail("bad character range")
                part = ((part[0][0], high[0][0]),)
            ranges.extend(part)
        self.take()
        ranges = normalise(ranges)
        return complement(ranges) if negate else ranges


# -- 2. UTF-8 and Thompson's construction -----------------------------------------------------

def utf8_ranges(lo: int, hi: int) -> list[list[tuple[int, int]]]:
    """The code points ``lo..hi`` as UTF-8 byte sequences, each a list of byte ranges.

    A range of code points whose encodings share a length and whose lower-order bytes run
    through all their values is one such list: ``U+0080..U+07FF`` is ``[c2-df][80-bf]``. Other
    ranges are split until every piece is of that shape.
    """
    for limit in (0x7F, 0x7FF, 0xFFFF):  # the last code point of 1, 2 and 3 bytes
        if lo <= limit < hi:
            return utf8_ranges(lo, limit) + utf8_ranges(limit + 1, hi)
    for i in range(1, 4):
        low_bits = (1 << (6 * i)) - 1  # the bits that the last i bytes hold
        if lo & ~low_bits != hi & ~low_bits:
            if lo & low_bits:
                return utf8_ranges(lo, lo | low_bits) + utf8_ranges((lo | low_bits) + 1, hi)
            if hi & low_bits != low_bits:
                return utf8_ranges(lo, (hi & ~low_bits) - 1) + utf8_ranges(hi & ~low_bits, hi)
    return [list(zip(chr(lo).encode(), chr(hi).encode()))]


class ByteNFA:
    """An automaton with empty moves whose labelled moves read one byte from a range."""

    def __init__(self):
        self.moves: list[list[tuple[int, int, int]]] = []  # state -> [(lo, hi, next)]
        self.empty: list[list[int]] = []                   # state -> [next]

    def state(self) -> int:
        self.moves.append([])
        self.empty.append([])
        return len(self.moves) - 1

    def build(self, node: Node) -> tuple[int, int]:
        """A fragment for ``node``: its start and end state (Thompson's construction)."""
        start, end = self.state(), self.state()
        if node.kind == "set":
            for lo, hi in node.ranges:
                for sequence in utf8_ranges(lo, hi):
                    here = start
                    for k, (a, b) in enumerate(sequence):
                        there = end if k == len(sequence) - 1 else self.state()
                        self.moves[here].append((a, b, there))
                        here = there
        elif node.kind == "seq":
            here = start
            for child in node.children:
                first, last = self.build(child)
                self.empty[here].append(first)
                here = last
            self.empty[here].append(end)
        elif node.kind == "alt":
            for child in node.children:
                first, last = self.build(child)
                self.empty[start].append(first)
                self.empty[last].append(end)
        else:
            self.repeat(node, start, end)
        return start, end

    def repeat(self, node: Node, start: int, end: int) -> None:
        """``low`` copies in a row, then ``high - low`` optional ones (or a loop)."""
        here = start
        for _ in range(node.low):
            first, last = self.build(node.children[0])
            self.empty[here].append(first)
            here = last
        if node.high is None:
            first, last = self.build(node.children[0])
            self.empty[here] += [first, end]
            self.empty[last] += [first, end]
            return
        for _ in range(node.high - node.low):
            first, last = self.build(node.children[0])
            self.empty[here] += [first, end]
            here = last
        self.empty[here].append(end)

    def closure(self, states) -> frozenset:
        """``states`` and every state their empty moves reach."""
        seen, todo = set(states), list(states)
        while todo:
            for nxt in self.empty[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return frozenset(seen)


# -- 3. The subset construction and pruning ---------------------------------------------------

@dataclass
class ByteDFA:
    """A deterministic automaton over bytes: ``table[state, byte]`` is the next state or -1
    (no way on), ``accepting[state]`` says whether the bytes so far match. State 0 starts."""
    table: torch.Tensor      # [states, 256] int32
    accepting: torch.Tensor  # [states] bool

    @property
    def num_states(self) -> int:
        return self.table.shape[0]

    def matches(self, data: bytes) -> bool:
        state = 0
        for byte in data:
            state = int(self.table[state, byte])
            if state < 0:
                return False
        return bool(self.accepting[state])

    def prune(self) -> "ByteDFA":
        """Only the states from which an accepting state can be reached, renumbered; moves to
        the others become -1. ``ValueError`` if the pattern matches nothing."""
        live = self.accepting.clone()
        while True:  # live: accepting, or one byte away from a live state
            targets = self.table.clamp_min(0).long()
            grown = live | ((self.table >= 0) & live[targets]).any(dim=1)
            if torch.equal(grown, live):
                break
            live = grown
        if not live[0]:
            raise ValueError("the pattern matches no string")
        number = torch.full((self.num_states + 1,), -1, dtype=torch.int32)
        number[:-1][live] = torch.arange(int(live.sum()), dtype=torch.int32)
        table = number[self.table[live].long()]  # -1 indexes the last entry, which is -1
        return ByteDFA(table, self.accepting[live])


def minimize(dfa: ByteDFA) -> ByteDFA:
    """The smallest equivalent automaton (Moore's partition refinement): states start in two
    groups, accepting or not, and a group splits while its states move to different groups
    on some byte. The groups that remain are the states. Expects a pruned automaton."""
    _, group = torch.unique(dfa.accepting.long(), return_inverse=True)
    while True:
        moved = torch.where(dfa.table >= 0, group[dfa.table.clamp_min(0).long()], -1)
        _, refined = torch.unique(torch.cat([group[:, None], moved], dim=1), dim=0, return_inverse=True)
        if refined.max() == group.max():  # groups only ever split: no new one means stable
            break
        group = refined
    # Number the groups in order of their first state, so that the start state stays 0.
    firsts = torch.full((int(group.max()) + 1,), dfa.num_states, dtype=torch.long)
    firsts.scatter_reduce_(0, group, torch.arange(dfa.num_states), reduce="amin")
    rank = torch.empty_like(firsts)
    rank[firsts.argsort()] = torch.arange(len(firsts))
    number = torch.cat([rank[group], torch.tensor([-1])]).to(torch.int32)
    representative = firsts.sort().values
    return ByteDFA(number[dfa.table[representative].long()], dfa.accepting[representative])


def determinize(nfa: ByteNFA, start: int, end: int) -> ByteDFA:
    """The subset construction: a DFA state is the set of NFA states the bytes so far can
    reach. Each state's bytes are taken in runs that every NFA move treats alike."""
    first = nfa.closure([start])
    number, order, rows = {first: 0}, [first], []
    while len(rows) < len(order):
        members = order[len(rows)]
        moves = [move for state in members for move in nfa.moves[state]]
        cuts = sorted({0, 256} | {lo for lo, _, _ in moves} | {hi + 1 for _, hi, _ in moves})
        row = [-1] * 256
        for a, b in zip(cuts, cuts[1:]):
            targets = nfa.closure([nxt for lo, hi, nxt in moves if lo <= a and b - 1 <= hi])
            if not targets:
                continue
            if targets not in number:
                number[targets] = len(order)
                order.append(targets)
            row[a:b] = [number[targets]] * (b - a)
        rows.append(row)
    table = torch.tensor(rows, dtype=torch.int32)
    accepting = torch.tensor([end in members for members in order])
    return ByteDFA(table, accepting)


def compile_regex(pattern: str) -> ByteDFA:
    """``pattern`` as a pruned, minimal deterministic automaton over UTF-8 bytes: it accepts the
    encoding of a string exactly when ``re.fullmatch(pattern, string, flags=re.ASCII)`` matches
    (the syntax above; ``\\d \\w \\s`` are ASCII classes)."""
    nfa = ByteNFA()
    start, end = nfa.build(parse(pattern))
    return minimize(determinize(nfa, start, end).prune())
