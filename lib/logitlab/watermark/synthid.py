"""Tournament sampling (SynthID-Text, Dathathri et al. 2024): a keyed tournament among samples.

Each of ``layers`` rounds has its own keyed function ``g_l(context, token)``, 0 or 1, as if by a
fair coin. Draw ``2 ** layers`` candidates from ``p``; in round ``l`` pair them up and keep, of
each pair, the one with the larger ``g_l`` (a fair coin on a tie); the last one standing is the
token. Winners tend to have ``g = 1`` in every round, which is what the detector looks for: in
text written without the key, the mean of the ``g`` values is 1/2.

The tournament need not be run: one round turns ``p`` into ``p(x) (1 + g(x) - E_p[g])`` (a
candidate wins against a partner drawn from ``p``: always when its ``g`` is higher, half the time
on a tie), and the rounds compose. The token is then one draw from the last of these
distributions. Averaged over keys (each ``g`` a fair coin), every round leaves ``p`` unchanged:
over keys, the output is the model's distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import check_int, check_logits
from ..sampling.hf_processor import Processor
from .green_list import KEY, check_key
from .gumbel import context_seed, last_tokens, scored_pairs, seen_before


def g_values(context, vocab_size: int, layers: int, key: int = KEY) -> torch.Tensor:
    """``[layers, vocab_size]`` bits (float32, CPU): ``g_l(context, token)`` for every round and token,
    one row of keyed uniforms per round (one seeded stream for all rounds: seven times faster
    than a stream per round)."""
    generator = torch.Generator(device="cpu").manual_seed(context_seed(context, key))
    return (torch.rand(layers, vocab_size, generator=generator) < 0.5).float()


def tournament_probs(probs: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """The winner's distribution: ``probs`` ``[..., V]`` through one round per row of ``g``
    ``[layers, V]``: ``p(x) (1 + g(x) - E_p[g])`` each."""
    for row in g.to(probs.device, probs.dtype):
        # 1 + g(x) - E_p[g] >= 0 exactly; rounding can take it a hair below 0 (E_p[g] a hair above 1
        # when g(x) = 0), which would give a negative probability and a NaN log-probability.
        probs = probs * (1 + row - (probs * row).sum(dim=-1, keepdim=True)).clamp_min(0)
    return probs


class TournamentWatermark(Processor):
    """The watermark as a logits processor: each row's distribution (``softmax(scores)``; put
    the temperature and truncation in processors before it) becomes the tournament's winner's,
    seeded by its last ``context_width`` tokens; returned as log-probabilities, to be sampled at
    temperature 1. Where that context already occurred in the row (``gumbel.seen_before``: its
    g-values would tilt a second draw the same way), the row's distribution is left as it is."""

    def __init__(self, vocab_size: int, key: int = KEY, layers: int = 30, context_width: int = 4):
        self.vocab_size = check_int(vocab_size, "vocab_size", 2)
        self.key = check_key(key)
        self.layers = check_int(layers, "layers", 1)
        self.context_width = check_int(context_width, "context_width", 1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        if scores.shape[-1] != self.vocab_size:
            raise ValueError(f"scores must have vocab_size = {self.vocab_size} columns, got {scores.shape[-1]}")
        probs = torch.softmax(scores.float(), dim=-1)
        out = torch.stack([p if seen_before(ids, self.context_width) else
                           tournament_probs(p, g_values(last_tokens(ids, self.context_width), self.vocab_size,
                                                        self.layers, self.key))
                           for p, ids in zip(probs, input_ids.tolist())])
        return out.log().to(scores.dtype)


@dataclass
class TournamentDetection:
    """``scored`` (context, token) pairs, the ``mean`` of their g-values over every round, and
    the one-sided p-value of that many ones among ``scored * layers`` fair coins."""

    scored: int
    mean: float
    p_value: float


def detect(tokens, vocab_size: int, key: int = KEY, layers: int = 30, context_width: int = 4,
           prompt=()) -> TournamentDetection:
    """The mean score of ``tokens`` (after ``prompt``), each context's first occurrence counted
    (``gumbel.scored_pairs``)."""
    from scipy.stats import binom

    vocab_size, key, layers = check_int(vocab_size, "vocab_size", 2), check_key(key), check_int(layers, "layers", 1)
    pairs = scored_pairs(tokens, vocab_size, context_width, prompt)
    ones = sum(int(g_values(context, vocab_size, layers, key)[:, token].sum()) for context, token in pairs)
    bits = len(pairs) * layers
    return TournamentDetection(len(pairs), ones / bits, float(binom.sf(ones - 1, bits, 0.5)))
