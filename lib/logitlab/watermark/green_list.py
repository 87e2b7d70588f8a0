"""The green-list watermark (Kirchenbauer et al. 2023): a keyed nudge towards half the vocabulary.

Before each token, the previous token and a secret key seed a permutation of the vocabulary; its
first ``gamma * V`` tokens are *green* for this step, and ``delta`` is added to their logits. The
text still reads as the model's, only slightly more often green than chance. A detector with the
key counts the green tokens: without the watermark each is green with probability ``gamma``, so a
count far above ``gamma * n`` is evidence: its p-value is the exact binomial tail (the z-score,
Hugging Face's statistic, is kept for display; its normal tail understates p at short lengths).

The permutation is Hugging Face's (``WatermarkLogitsProcessor``, seeding scheme ``"lefthash"``,
one token of context): ``torch.randperm`` seeded with ``key * previous``, so the same key marks
and detects in both libraries. It is always drawn on the CPU, whose generator is the same on
every machine, so text marked on a GPU is detected on a laptop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._validate import check_flag, check_int, check_logits, check_number
from ..sampling.hf_processor import Processor

KEY = 15485863  # Hugging Face's default key (the millionth prime); a real deployment keeps its own secret


def check_key(key) -> int:
    return check_int(key, "key", 1, "a positive integer (the secret that seeds the green lists)")


def check_gamma(gamma) -> float:
    return check_number(gamma, "gamma", "a number in (0, 1) (the green share of the vocabulary)", lambda v: 0 < v < 1)


def green_ids(previous: int, vocab_size: int, gamma: float = 0.25, key: int = KEY) -> torch.Tensor:
    """The green tokens after token ``previous``: the first ``int(gamma * vocab_size)`` of a
    permutation of the vocabulary seeded by ``key * previous`` (on the CPU)."""
    generator = torch.Generator(device="cpu").manual_seed((key * previous) % (2**64 - 1))
    return torch.randperm(vocab_size, generator=generator)[: int(vocab_size * gamma)]


def green_mask(previous: int, vocab_size: int, gamma: float = 0.25, key: int = KEY) -> torch.Tensor:
    """``green_ids`` as a ``[vocab_size]`` boolean mask."""
    return torch.zeros(vocab_size, dtype=torch.bool).index_fill_(0, green_ids(previous, vocab_size, gamma, key), True)


class GreenList(Processor):
    """The watermark as a logits processor (``ll.generate(..., logits_processor=[GreenList(V)])``
    or Hugging Face's ``generate``): ``delta`` added to the green tokens' logits of each row, the
    green list seeded by the row's last token. Rows with no token yet are left as they are."""

    def __init__(self, vocab_size: int, gamma: float = 0.25, delta: float = 2.0, key: int = KEY):
        self.vocab_size = check_int(vocab_size, "vocab_size", 2)
        self.gamma = check_gamma(gamma)
        self.delta = check_number(delta, "delta", "a finite number >= 0 (the logit bias)", lambda v: 0 <= v < math.inf)
        self.key = check_key(key)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        if scores.shape[-1] != self.vocab_size:
            raise ValueError(f"scores must have vocab_size = {self.vocab_size} columns, got {scores.shape[-1]}")
        if input_ids.shape[-1] == 0:
            return scores
        masks = torch.stack([green_mask(int(last), self.vocab_size, self.gamma, self.key) for last in input_ids[:, -1]])
        return scores + self.delta * masks.to(scores.device, scores.dtype)


def price(logits: torch.Tensor, green: torch.Tensor, delta: float) -> torch.Tensor:
    """What the nudge costs each step, exactly: ``KL(p_delta || p)`` in nats, one value per row of
    ``logits`` ``[..., V]`` (the model's, at the temperature it samples at), where ``p`` is their
    softmax and ``p_delta`` the softmax after adding ``delta`` to the step's green tokens
    (``green``, a boolean mask of the same shape). Tokens already at ``-inf`` stay out of both."""
    check_logits(logits, "logits")
    if not isinstance(green, torch.Tensor) or green.dtype != torch.bool or green.shape != logits.shape:
        raise ValueError(f"green must be a boolean tensor of the logits' shape {tuple(logits.shape)}")
    delta = check_number(delta, "delta", "a finite number >= 0 (the logit bias)", lambda v: 0 <= v < math.inf)
    logp = torch.log_softmax(logits.float(), dim=-1)
    marked = torch.log_softmax(logp + delta * green, dim=-1)
    # Where p is 0 so is p_delta, and the term is 0 (not 0 * (-inf - -inf) = NaN).
    return torch.where(marked.isfinite(), marked.exp() * (marked - logp), 0.0).sum(dim=-1)


@dataclass
class Detection:
    """What the detector found in one text: ``scored`` tokens looked at, ``green`` of them green,
    the z-score of that count, and its p-value: the chance of a count at least this high in text
    written without the key, ``P(G >= green)`` for ``G ~ Binomial(scored, share)``, ``share`` the
    green list's exact share of the vocabulary (``int(gamma * V) / V``)."""

    scored: int
    green: int
    z: float
    p_value: float


def detect(tokens, vocab_size: int, gamma: float = 0.25, key: int = KEY, *, unique_pairs: bool = True) -> Detection:
    """Score a text (token ids, the prompt left out) for the green list: every token after the
    first is green or not, given the token before it. ``unique_pairs`` counts each (previous,
    token) pair once: text that repeats a phrase repeats its colours, and counting the repeats
    as fresh evidence makes the test claim more than it has (Hugging Face's
    ``ignore_repeated_ngrams``; its default counts them all). The z-score is Hugging Face's; the
    p-value is exact, where Hugging Face's is the normal tail of z."""
    from scipy.stats import binom

    tokens = [int(t) for t in (tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens)]
    vocab_size, gamma, key = check_int(vocab_size, "vocab_size", 2), check_gamma(gamma), check_key(key)
    unique_pairs = check_flag(unique_pairs, "unique_pairs")
    if len(tokens) < 2 or not all(0 <= t < vocab_size for t in tokens):
        raise ValueError(f"tokens must be at least 2 token ids in [0, {vocab_size}), got {tokens[:8]!r}")
    pairs = list(zip(tokens, tokens[1:]))
    if unique_pairs:
        pairs = list(dict.fromkeys(pairs))
    green = sum(bool(green_mask(previous, vocab_size, gamma, key)[token]) for previous, token in pairs)
    n = len(pairs)
    z = (green - gamma * n) / math.sqrt(n * gamma * (1 - gamma))
    share = int(vocab_size * gamma) / vocab_size  # green_ids' exact share: gamma itself for the book's vocabulary
    return Detection(n, green, z, float(binom.sf(green - 1, n, share)))
