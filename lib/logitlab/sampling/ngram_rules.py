"""Rules that read the sequence so far as n-grams (chapter 3): no repeated n-grams, banned
words, sequence bias, and DRY.

The penalties of ``logitlab.sampling.penalties`` look at single tokens: has this token occurred? These
rules look at runs of tokens:

* **no repeated n-grams** (Hugging Face's ``no_repeat_ngram_size``) removes every token that
  would complete an n-gram already present in the sequence;
* **sequence bias** (Hugging Face's ``sequence_bias``) adds a bias to the last token of a given
  token sequence when the sequence so far ends with the rest of it (a one-token sequence is
  biased at every step);
* **banned words** (Hugging Face's ``bad_words_ids``) is sequence bias with a bias of ``-inf``:
  a banned sequence can never be completed;
* **DRY** ("don't repeat yourself", the penalty of text-generation-webui and llama.cpp) subtracts
  ``multiplier * base ** (m - allowed_length)`` from a token that would extend a repeat whose
  repeated part is already ``m >= allowed_length`` tokens long, so the penalty grows
  exponentially with the length of the loop the text is in, and short, natural repeats (a name,
  "of the") go free.

Each is a pure function of ``(logits [batch, vocab], tokens [batch, seq])`` that returns new
logits, and a class that is a Hugging Face ``LogitsProcessor``, for ``ll.generate`` and
``ll.beam_search`` (``logits_processor=``). ``tokens`` holds each row's whole sequence so far,
prompt included, as Hugging Face passes it; negative entries are padding and never match.
The rules loop over each row's tokens in Python: they are written to be read, and a few hundred
tokens cost well under a decode step.
"""

from __future__ import annotations

import math

import torch

from .._validate import check_int, check_logits, check_number
from .hf_processor import Processor

_NEG_INF = float("-inf")


def no_repeat_ngram(logits: torch.Tensor, tokens: torch.Tensor, n: int) -> torch.Tensor:
    """Remove (``-inf``) every token that would complete an ``n``-gram already in the row.

    >>> no_repeat_ngram(torch.zeros(1, 5), torch.tensor([[1, 2, 3, 1]]), 2)  # 1 was followed by 2
    tensor([[0., 0., -inf, 0., 0.]])
    """
    tokens = _check(logits, tokens)
    n = check_int(n, "n", minimum=1)
    banned = torch.zeros_like(logits, dtype=torch.bool)
    for row, seq in enumerate(tokens.tolist()):
        if len(seq) + 1 < n:
            continue
        last = seq[len(seq) - n + 1:] if n > 1 else []
        for start in range(len(seq) - n + 1):
            if seq[start:start + n - 1] == last and seq[start + n - 1] >= 0:
                banned[row, seq[start + n - 1]] = True
    return logits.masked_fill(banned, _NEG_INF)


def sequence_bias(logits: torch.Tensor, tokens: torch.Tensor, biases: dict) -> torch.Tensor:
    """Add ``biases[seq]`` to the logit of ``seq[-1]`` in each row whose tokens end with
    ``seq[:-1]``, for every token sequence ``seq`` (a tuple of ids) in ``biases``. Biases of
    sequences that end in the same token add up.

    >>> sequence_bias(torch.zeros(1, 4), torch.tensor([[0, 1]]), {(1, 2): -5.0, (3,): 2.0})
    tensor([[ 0.,  0., -5.,  2.]])
    """
    tokens = _check(logits, tokens)
    biases = _check_biases(biases, logits.shape[-1])
    added = torch.zeros_like(logits)
    for row, seq in enumerate(tokens.tolist()):
        for key, bias in biases.items():
            prefix = list(key[:-1])
            if len(prefix) <= len(seq) and seq[len(seq) - len(prefix):] == prefix:
                added[row, key[-1]] += bias
    return logits + added


def ban_words(logits: torch.Tensor, tokens: torch.Tensor, words) -> torch.Tensor:
    """Remove the last token of each banned token sequence in ``words`` (a list of id lists)
    wherever the row ends with the rest of it: ``sequence_bias`` with a bias of ``-inf``."""
    return sequence_bias(logits, tokens, _banned(words))


def dry_penalty(logits: torch.Tensor, tokens: torch.Tensor, multiplier: float, base: float = 1.75,
                allowed_length: int = 2, breakers=(), window: int | None = None) -> torch.Tensor:
    """DRY: for each token ``t`` that followed an earlier occurrence of the row's last ``m``
    tokens, with ``m`` the longest such repeat, subtract ``multiplier * base ** (m -
    allowed_length)`` from ``t``'s logit when ``m >= allowed_length``.

    ``breakers`` are token ids that a repeat may not contain (a newline, a quote...): a match
    stops at one, and no token is penalised after one. ``window`` counts only the last
    ``window`` tokens (None: all). Repeats longer than 50 tokens count as 50, as in the
    original, so that the penalty stays finite.

    >>> dry_penalty(torch.zeros(1, 5), torch.tensor([[1, 2, 3, 1, 2]]), 1.0)  # "1 2" repeats: 3 next?
    tensor([[ 0.,  0.,  0., -1.,  0.]])
    """
    tokens = _check(logits, tokens)
    multiplier, base, allowed_length, breakers, window = _check_dry(multiplier, base, allowed_length, breakers,
                                                                     window)
    penalties = torch.zeros_like(logits)
    for row, seq in enumerate(tokens.tolist()):
        seq = [t for t in seq if t >= 0]
        seq = seq[-window:] if window else seq
        for token, m in repeat_lengths(seq, breakers).items():
            if m >= allowed_length:
                penalties[row, token] = multiplier * base ** (m - allowed_length)
    return logits - penalties


# A repeat counts as at most this long, so that base ** (m - allowed_length) stays finite.
DRY_MAX_REPEAT = 50


def repeat_lengths(seq: list[int], breakers: set) -> dict[int, int]:
    """For each token that followed an earlier copy of the end of ``seq``: the length of the
    longest such copy (at most ``DRY_MAX_REPEAT``, never across a breaker)."""
    if not seq or seq[-1] in breakers:
        return {}
    lengths = {}
    last = len(seq) - 1
    for i in range(last):  # seq[i] is where an earlier copy of the end would end
        if seq[i] != seq[last] or seq[i + 1] in breakers:
            continue
        m = 1
        while m < DRY_MAX_REPEAT and i - m >= 0 and seq[i - m] == seq[last - m] and seq[last - m] not in breakers:
            m += 1
        lengths[seq[i + 1]] = max(m, lengths.get(seq[i + 1], 0))
    return lengths


def _check(logits, tokens) -> torch.Tensor:
    check_logits(logits)
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape [batch, vocab], got {tuple(logits.shape)}")
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.is_floating_point() \
            or tokens.shape[0] != logits.shape[0]:
        raise ValueError(f"tokens must be an integer tensor [batch, seq] with the logits' batch "
                         f"({logits.shape[0]}), got {getattr(tokens, 'shape', type(tokens).__name__)}")
    if bool((tokens >= logits.shape[-1]).any()):
        raise ValueError(f"tokens must be ids below the vocabulary size {logits.shape[-1]} (negative: padding)")
    return tokens


def _check_biases(biases, vocab: int | None) -> dict:
    if not isinstance(biases, dict):
        raise ValueError(f"biases must be a dict from token-id tuples to numbers, got {type(biases).__name__}")
    out = {}
    for key, bias in biases.items():
        limit = math.inf if vocab is None else vocab
        if not isinstance(key, tuple) or not key or not all(isinstance(t, int) and 0 <= t < limit for t in key):
            raise ValueError(f"biases: each key must be a non-empty tuple of token ids in [0, {limit}), got {key!r}")
        out[key] = check_number(bias, f"biases[{key!r}]", "a number (-inf bans)", lambda v: v < math.inf)
    return out


def _banned(words) -> dict:
    if not isinstance(words, (list, tuple)) or not all(isinstance(w, (list, tuple)) and w for w in words):
        raise ValueError(f"words must be a list of non-empty token-id lists, got {words!r}")
    return {tuple(w): _NEG_INF for w in words}


def _check_dry(multiplier, base, allowed_length, breakers, window):
    multiplier = check_number(multiplier, "multiplier", "a finite number >= 0", lambda v: 0 <= v < math.inf)
    base = check_number(base, "base", "a finite number > 1", lambda v: 1 < v < math.inf)
    allowed_length = check_int(allowed_length, "allowed_length", minimum=1)
    if window is not None:
        window = check_int(window, "window", minimum=1, allowed="None or an integer >= 1")
    if not all(isinstance(t, int) for t in breakers):
        raise ValueError(f"breakers must be token ids, got {breakers!r}")
    return multiplier, base, allowed_length, set(breakers), window


class NoRepeatNGram(Processor):
    """``no_repeat_ngram`` as a logits processor: ``NoRepeatNGram(3)``."""

    def __init__(self, n: int):
        self.n = check_int(n, "n", minimum=1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        return no_repeat_ngram(scores, input_ids, self.n)


class SequenceBias(Processor):
    """``sequence_bias`` as a logits processor: ``SequenceBias({(1, 2): -5.0})``."""

    def __init__(self, biases: dict):
        self.biases = _check_biases(biases, None)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        return sequence_bias(scores, input_ids, self.biases)


class BanWords(SequenceBias):
    """``ban_words`` as a logits processor: ``BanWords([[42], [7, 8]])``."""

    def __init__(self, words):
        self.biases = _banned(words)


class DRY(Processor):
    """``dry_penalty`` as a logits processor: ``DRY(0.8, breakers=newline_ids)``."""

    def __init__(self, multiplier: float, base: float = 1.75, allowed_length: int = 2, breakers=(),
                 window: int | None = None):
        checked = _check_dry(multiplier, base, allowed_length, breakers, window)
        self.multiplier, self.base, self.allowed_length, self.breakers, self.window = checked

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        return dry_penalty(scores, input_ids, self.multiplier, self.base, self.allowed_length,
                           sorted(self.breakers), self.window)
