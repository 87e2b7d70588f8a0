"""Cheap measures of generated text: diversity and repetition (chapters 2 and 3).

They work on token ids, not on words: what they count is what the model chose. Each is a
proxy, not a judgement of quality; the chapters pair them with the model's own
log-probability of the text.
"""

from __future__ import annotations

import torch

from .._validate import check_int


def ngrams(tokens, n: int) -> list[tuple[int, ...]]:
    """The n-grams of one sequence of token ids, in order."""
    ids = tokens.tolist() if isinstance(tokens, torch.Tensor) else list(tokens)
    _check_n(n)
    return [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]


def distinct_n(sequences, n: int = 2) -> float:
    """Distinct n-grams divided by all n-grams, pooled over ``sequences`` (Li et al., 2016).

    1.0 when no n-gram repeats anywhere; close to 0 when the sequences say the same thing
    over and over, within one sequence or across them. Returns NaN when there is no n-gram.
    """
    grams = [g for seq in sequences for g in ngrams(seq, n)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def repetition_rate(tokens, n: int = 3) -> float:
    """The fraction of a sequence's n-grams that already occurred earlier in it.

    0.0 for a sequence that never repeats an n-gram; close to 1 for a loop. Returns NaN for a
    sequence shorter than ``n``.
    """
    grams = ngrams(tokens, n)
    if not grams:
        return float("nan")
    seen, repeated = set(), 0
    for g in grams:
        repeated += g in seen
        seen.add(g)
    return repeated / len(grams)


def _check_n(n) -> None:
    n = check_int(n, "n", 1)
