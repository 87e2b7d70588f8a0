"""Copy where the text repeats itself, recycle the target's guesses where it does not (chapter 10).

The two training-free drafters of chapter 10 are good at different things: the suffix automaton
(``suffix_automaton``) copies long runs where the answer repeats its prompt or itself, and
proposes nothing useful elsewhere; Token Recycling (``token_recycling``) guesses a little
everywhere. SAM-Decoding (Hu et al.) pairs its automaton with another drafter and picks by the
match: a match of at least ``min_match`` tokens is copied as a chain, a shorter one leaves the
call to the other drafter. ``CopyOrRecycle`` does that with Token Recycling as the other, so
neither part needs training, and its table keeps learning from every pass, copied or not.

Both parts' proposals are fixed by the past (point masses), so the output stays exact.
"""

from __future__ import annotations

from .drafter import Drafter
from .suffix_automaton import SuffixDrafter
from .token_recycling import TokenRecycler


class CopyOrRecycle(Drafter):
    """A chain copied from the longest earlier match when every row has one of at least
    ``min_match`` tokens; otherwise Token Recycling's tree of ``nodes`` nodes (``k`` guesses kept
    per token). ``corpus``: earlier texts for the automaton, as in ``SuffixDrafter``."""

    reads_logits = True

    def __init__(self, vocab_size: int, min_match: int = 2, nodes: int = 8, k: int = 8, corpus=None):
        self.copy = SuffixDrafter(vocab_size, corpus=corpus, min_match=min_match)
        self.recycle = TokenRecycler(vocab_size, nodes=nodes, k=k)
        self.vocab_size = self.copy.vocab_size
        self.tree = None  # the last proposal when it was a tree
        self.copied = self.recycled = 0  # calls of each kind, for the reader

    def start(self, input_ids, attention_mask, target=None, cache=None) -> None:
        self.copy.start(input_ids, attention_mask)

    def observe_logits(self, tokens, logits) -> None:
        self.recycle.observe_logits(tokens, logits)

    def propose(self, next_tokens, gamma, config, generator=None):
        found = self.copy.grow(next_tokens, gamma)
        if all(found):
            self.tree, self.recycle.last_tree = None, None  # no tree whose ranks to count
            self.copied += 1
            return self.copy.chain(found, next_tokens.device)
        self.recycled += 1
        self.tree = self.recycle.propose(next_tokens, gamma, config, generator)
        return self.tree

    def kept_path(self, paths) -> None:
        tokens = self.tree.tokens.tolist()
        for r, path in enumerate(paths):
            for node in path[1:]:  # node 0 is the pending token, already appended
                self.copy.append(r, tokens[r][node - 1])

    def rollback(self, num_accepted, kept: list[int] | None = None) -> None:
        if self.tree is None:  # a copied chain: the automaton takes its kept prefix
            self.copy.rollback(num_accepted, kept)

    def select_rows(self, keep) -> None:
        self.copy.select_rows(keep)
