"""Drafting from a suffix automaton: drafts copied from the longest earlier match, no model at all.

Prompt lookup (``prompt_lookup``) searches the last few tokens again at every call, up to a fixed
n-gram length. A suffix automaton (Blumer et al. 1985) keeps that search done: the smallest
automaton of the sequence's suffixes, which read with every state accepting accepts exactly its
substrings, one state per set of end positions (below); it grows by one token in amortised
constant time, and it always knows the longest suffix of the sequence that occurred before, of
any length, and where that occurrence ended. What followed it there is the draft (the idea of
SAM-Decoding, Hu et al. 2024). Chapter 11's automata read a pattern; this one is built from the
text itself.

A state stands for a set of substrings that end at the same set of positions (their *end
positions*): a suffix of the sequence and its shorter suffixes, down to the length where the set
of end positions grows. ``link`` leads from a state to the longest shorter suffix with more end
positions, ``length`` is the longest string of the state, and ``first_end`` the earliest position
where its strings end. So the state the suffix link of the whole sequence leads to holds the
longest suffix that also ends earlier, and ``first_end`` says where.

``SuffixDrafter`` keeps one automaton per row over the prompt and the tokens kept so far, and
optionally one shared automaton over a corpus of earlier texts, matched token by token.
"""

from __future__ import annotations

import torch

from .._validate import check_int
from .drafter import Drafter, host_counts, padded_chains


class SuffixAutomaton:
    """The suffix automaton of a token sequence, built online: ``extend(token)`` appends one.

    ``SuffixAutomaton([1, 2, 1, 2])`` accepts 2,1 (a substring) and not 2,2. It has at most
    2n - 1 states for n >= 2 tokens; each state's transitions are a dict from token to state.
    """

    def __init__(self, tokens=()):
        self.tokens: list[int] = []
        self.next: list[dict[int, int]] = [{}]  # state 0 is the empty string
        self.link, self.length, self.first_end = [-1], [0], [-1]
        self.last = 0  # the state of the whole sequence
        for token in tokens:
            self.extend(token)

    def __len__(self) -> int:
        return len(self.next)

    def _state(self, length: int, first_end: int, transitions: dict) -> int:
        self.next.append(transitions)
        self.link.append(-1)
        self.length.append(length)
        self.first_end.append(first_end)
        return len(self.next) - 1

    def extend(self, token: int) -> None:
        """Append ``token``: a new state for the whole sequence, and transitions to it from every
        suffix that was not yet followed by ``token``; a state whose strings split in two (some now
        end here too, the longer ones do not) is cloned. Amortised O(1) per token."""
        end = len(self.tokens)
        self.tokens.append(token)
        new, p = self._state(self.length[self.last] + 1, end, {}), self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = new
            p = self.link[p]
        if p == -1:
            self.link[new] = 0
        else:
            q = self.next[p][token]
            if self.length[q] == self.length[p] + 1:
                self.link[new] = q
            else:  # q also holds longer strings that do not end here: split off the short ones
                clone = self._state(self.length[p] + 1, self.first_end[q], dict(self.next[q]))
                self.link[clone] = self.link[q]
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = self.link[new] = clone
        self.last = new

    def accepts(self, tokens) -> bool:
        """Whether ``tokens`` is a substring of the sequence."""
        state = 0
        for token in tokens:
            state = self.next[state].get(token)
            if state is None:
                return False
        return True

    def longest_repeat(self) -> tuple[int, int]:
        """``(length, end)``: the longest suffix of the sequence that also occurs earlier, and the
        position where its first occurrence ends; ``(0, -1)`` when no token has occurred before."""
        state = self.link[self.last] if self.last else 0
        return self.length[state], self.first_end[state]

    def follow(self, state: int, length: int, token: int) -> tuple[int, int]:
        """Matching another text against this sequence: from ``(state, length)``, the longest
        suffix of the other text found here, move on by its next ``token``. Shorter suffixes are
        tried through the suffix links, so a whole text is matched in amortised O(1) per token."""
        while state and token not in self.next[state]:
            state = self.link[state]
            length = self.length[state]
        if token in self.next[state]:
            return self.next[state][token], length + 1
        return 0, 0

    def continuation(self, state: int, count: int) -> list[int]:
        """Up to ``count`` tokens that follow the first occurrence of ``state``'s strings."""
        end = self.first_end[state]
        return self.tokens[end + 1: end + 1 + count] if state else []


SEPARATOR = -1  # between the texts of a corpus: no token matches it, so no match spans two texts


class SuffixDrafter(Drafter):
    """Proposals copied from the longest earlier match of the text's end, of any length.

    Each row's automaton holds its prompt and the tokens it has kept; ``corpus`` (a list of token
    lists: earlier outputs, documents) adds one shared automaton, matched as the row grows. The
    longer match of the two gives the draft (the row's own text when they tie, the other when it
    has nothing after it); a match shorter than ``min_match`` tokens proposes nothing. Rows
    propose the same number of tokens (the longest proposal), the shorter ones padded with their
    last token, as ``PromptLookupDrafter``. The proposals are deterministic: ``q`` is one-hot, so
    verification keeps the output exact.
    """

    def __init__(self, vocab_size: int, corpus=None, min_match: int = 1):
        self.vocab_size = check_int(vocab_size, "vocab_size", 1)
        self.min_match = check_int(min_match, "min_match", 1)
        self.corpus = None
        if corpus is not None:
            if not isinstance(corpus, (list, tuple)) or not all(isinstance(text, (list, tuple)) for text in corpus):
                raise ValueError("corpus must be a list of token-id lists (earlier texts)")
            self.corpus = SuffixAutomaton()
            for text in corpus:
                for token in list(text) + [SEPARATOR]:
                    self.corpus.extend(int(token))

    def start(self, input_ids, attention_mask, target=None, cache=None) -> None:
        self.rows = [SuffixAutomaton() for _ in range(len(input_ids))]
        self.matches = [(0, 0)] * len(input_ids)  # each row's (state, length) in the corpus
        for r, (row, mask) in enumerate(zip(input_ids, attention_mask)):
            for token in row[mask.bool()].tolist():
                self.append(r, token)

    def append(self, r: int, token: int) -> None:
        """Row ``r`` has kept ``token``: its automaton grows, and its match in the corpus moves on."""
        self.rows[r].extend(token)
        if self.corpus is not None:
            self.matches[r] = self.corpus.follow(*self.matches[r], token)

    def memory(self) -> int:
        """States kept, over every row's automaton and the corpus's: what this drafter stores."""
        return sum(len(a) for a in self.rows) + (len(self.corpus) if self.corpus is not None else 0)

    def propose(self, next_tokens, gamma, config, generator=None):
        return self.chain(self.grow(next_tokens, gamma), next_tokens.device)

    def grow(self, next_tokens, gamma: int) -> list[list[int]]:
        """Each row takes its pending token; returns each row's draft (``match``), maybe empty."""
        for r, token in enumerate(next_tokens.tolist()):
            self.append(r, token)
        return [self.match(r, gamma)[1] for r in range(len(self.rows))]

    def chain(self, found: list[list[int]], device):
        """The rows' drafts ``found`` as this call's proposal (``tokens, q``), remembered for ``rollback``."""
        self.proposed, tokens, q = padded_chains(found, [a.tokens[-1] for a in self.rows], self.vocab_size, device)
        return tokens, q

    def match(self, r: int, gamma: int) -> tuple[int, list[int]]:
        """Row ``r``'s longest match and up to ``gamma`` tokens that followed it: in the row's own
        text or the corpus, the longer match that has a continuation (the row's own on a tie);
        ``(0, [])`` when neither has one of at least ``min_match`` tokens."""
        own = self.rows[r]
        length, end = own.longest_repeat()
        candidates = [(length, own.tokens[end + 1: end + 1 + gamma])]
        if self.corpus is not None:
            state, corpus_length = self.matches[r]
            drafted = self.corpus.continuation(state, gamma)
            candidates.append((corpus_length, drafted[: drafted.index(SEPARATOR)] if SEPARATOR in drafted else drafted))
        usable = [c for c in candidates if c[0] >= self.min_match and c[1]]
        return max(usable, key=lambda c: c[0]) if usable else (0, [])

    def rollback(self, num_accepted: torch.Tensor, kept: list[int] | None = None) -> None:
        for r, (proposed, n) in enumerate(zip(self.proposed, host_counts(num_accepted, kept))):
            for token in proposed[:n]:
                self.append(r, token)

    def select_rows(self, keep: torch.Tensor) -> None:
        keep = keep.tolist()
        self.rows, self.matches = [self.rows[i] for i in keep], [self.matches[i] for i in keep]
