"""Prompt lookup (chapter 6): drafts copied from the text so far, no model at all. The last few
tokens are searched for earlier in the prompt and the output; what followed them there is the draft.
"""

from __future__ import annotations

import torch

from .._validate import check_int
from .drafter import Drafter, host_counts, padded_chains


class PromptLookupDrafter(Drafter):
    """Proposals copied from the context: what followed an earlier match of its last n tokens.

    ``max_ngram`` down to ``min_ngram`` tokens are tried, longest first. ``match`` says which
    earlier occurrence is copied when there are several: ``"earliest"`` (the default, as Hugging
    Face's prompt lookup does; measured faster on prompts whose answer copies them, where the
    first occurrence is usually in the prompt itself) or ``"latest"``. Rows without a match
    propose fewer tokens; all rows propose the same number (the longest proposal), the shorter
    ones padded with their last token (any proposal is allowed: a bad one is just rejected).
    """

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1, match: str = "earliest"):
        vocab_size = check_int(vocab_size, "vocab_size", 1)
        if not (isinstance(min_ngram, int) and isinstance(max_ngram, int) and 1 <= min_ngram <= max_ngram):
            raise ValueError(f"need integers 1 <= min_ngram <= max_ngram, got {min_ngram!r}, {max_ngram!r}")
        if match not in ("earliest", "latest"):
            raise ValueError(f"match must be 'earliest' or 'latest', got {match!r}")
        self.vocab_size, self.max_ngram, self.min_ngram, self.match = vocab_size, max_ngram, min_ngram, match

    def start(self, input_ids, attention_mask, target=None, cache=None) -> None:
        self.history = [row[m.bool()].tolist() for row, m in zip(input_ids, attention_mask)]

    def propose(self, next_tokens, gamma, config, generator=None):
        for row, t in zip(self.history, next_tokens.tolist()):
            row.append(t)
        found = [self._lookup(row, gamma) for row in self.history]
        self.proposed, tokens, q = padded_chains(found, [row[-1] for row in self.history], self.vocab_size,
                                                 next_tokens.device)
        return tokens, q

    def _lookup(self, row: list[int], gamma: int) -> list[int]:
        for n in range(min(self.max_ngram, len(row) - 1), self.min_ngram - 1, -1):
            tail = row[-n:]
            starts = range(len(row) - n)  # every earlier occurrence, not the tail itself
            for start in (starts if self.match == "earliest" else reversed(starts)):
                if row[start:start + n] == tail:
                    return row[start + n:start + n + gamma]
        return []

    def rollback(self, num_accepted: torch.Tensor, kept: list[int] | None = None) -> None:
        for row, proposed, n in zip(self.history, self.proposed, host_counts(num_accepted, kept)):
            row.extend(proposed[:n])

    def select_rows(self, keep: torch.Tensor) -> None:
        self.history = [self.history[i] for i in keep.tolist()]
