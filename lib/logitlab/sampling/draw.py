"""Drawing one token from logits: multinomial sampling, Gumbel-max and greedy.

Chapter 1 ("Logits and temperature") explains ``sample``, ``gumbel_max`` and ``greedy``;
chapters 2 and 3 add the settings and the rules applied before the draw (``pipeline``).

All functions take logits ``[..., vocab]`` and return token ids ``[...]`` (dtype ``long``).
Every random function takes an optional ``torch.Generator``: the same seed on the same device
gives the same tokens, which is what makes an experiment reproducible.
"""

from __future__ import annotations

import torch

from .._validate import check_generator, check_logits, check_temperature
from ..devices import exact_dtype
from ..probs import apply_temperature


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The most likely token of each row (ties go to the lowest token id).

    >>> greedy(torch.tensor([[0.1, 2.0, -1.0], [5.0, 0.0, 5.0]]))
    tensor([1, 0])
    """
    check_logits(logits)
    return logits.argmax(dim=-1)


def _scaled(logits, temperature, generator) -> torch.Tensor | None:
    """``logits / temperature`` after checking the three arguments, or None at temperature 0.

    Half-precision logits are divided in float32, for accuracy; float64 logits stay float64
    (in float32, 1e39 would become +inf)."""
    check_logits(logits)
    temperature = check_temperature(temperature)
    check_generator(generator, logits.device)
    if temperature == 0.0:
        return None
    return apply_temperature(logits.to(torch.promote_types(logits.dtype, torch.float32)), temperature)


def sample(
    logits: torch.Tensor, temperature: float = 1.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Draw one token per row from ``softmax(logits / temperature)`` (multinomial sampling).

    This is inverse transform sampling: token ``i`` owns an interval of length ``p_i`` in
    ``[0, 1)``, one uniform number picks a point, and a binary search finds whose interval it
    is. ``temperature=0`` is greedy decoding and draws no random number.
    """
    scaled = _scaled(logits, temperature, generator)
    if scaled is None:
        return greedy(logits)
    # Unnormalised probabilities: the cumulative sum's last entry is the total, so dividing
    # every weight by it (the softmax's denominator) is not needed.
    weights = torch.exp(scaled - scaled.amax(dim=-1, keepdim=True))
    # The cumulative sum runs in float64, where adding 49,152 terms keeps even the rarest
    # tokens' intervals (float32 would blur those below about 1e-7). MPS has no float64.
    dtype = exact_dtype(weights.device)
    cumulative = weights.to(dtype).cumsum(dim=-1)
    u = torch.rand(weights.shape[:-1] + (1,), generator=generator, device=weights.device, dtype=dtype)
    return inverse_transform(cumulative, u * cumulative[..., -1:])


def inverse_transform(cumulative: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token whose interval ``[cumulative[i-1], cumulative[i])`` contains ``u`` ``[..., 1]``.

    A token of probability 0 has an empty interval, so it is never returned.
    """
    tokens = torch.searchsorted(cumulative, u, right=True).squeeze(-1)
    # u equal to the total, which only rounding can produce, would fall past the end: such a row
    # takes the last token whose interval is not empty. Every other row's token comes before it,
    # so a minimum does this without asking the device which rows fell past the end.
    last = (cumulative < cumulative[..., -1:]).sum(dim=-1)
    return torch.minimum(tokens, last)


def gumbel_max(
    logits: torch.Tensor, temperature: float = 1.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Draw one token per row by the Gumbel-max trick: ``argmax(logits / T + G)``.

    ``G`` holds independent standard Gumbel noise, ``G = -log(-log U)`` with ``U`` uniform on
    (0, 1). The argmax of the perturbed logits is distributed exactly as
    ``softmax(logits / T)``: a sample with no normalisation and no cumulative sum, which is why
    the trick reappears later in the book (sampling without replacement, Gumbel-top-k).
    """
    scaled = _scaled(logits, temperature, generator)
    if scaled is None:
        return greedy(logits)
    return add_gumbel_noise(scaled, generator).argmax(dim=-1)


def add_gumbel_noise(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """``logits`` (at least float32) plus independent standard Gumbel noise ``-log(-log U)``,
    measured from each row's maximum. The argmax of the result is a sample from
    ``softmax(logits)``; its top k, a sample of k tokens without replacement (``gumbel_top_k``)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=torch.float32)
    # rand draws from [0, 1): keep u away from 0 so that -log(u) stays finite.
    u = u.clamp_min(torch.finfo(torch.float32).tiny)
    # The noise is of order 1: added to a large logit it would be lost to rounding (1e8 + 1 is
    # 1e8 in float32) and ties would always go to the lowest id. Measured from the row's
    # maximum, the logits that matter are small.
    return logits - logits.amax(dim=-1, keepdim=True) - torch.log(-torch.log(u))
