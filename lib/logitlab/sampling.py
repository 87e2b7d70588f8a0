"""Choosing one token from logits: multinomial sampling, Gumbel-max and greedy.

Chapter 1 ("Logits and temperature") explains ``sample``, ``gumbel_max`` and ``greedy``;
chapters 2 and 3 add ``SamplingConfig`` and ``next_token``, which apply the penalties and
truncation rules of ``logitlab.processors`` before sampling.

All functions take logits ``[..., vocab]`` and return token ids ``[...]`` (dtype ``long``).
Every random function takes an optional ``torch.Generator``: the same seed on the same device
gives the same tokens, which is what makes an experiment reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ._validate import check_generator, check_logits, check_temperature
from .devices import exact_dtype
from . import penalties
from . import processors as rules
from .probs import apply_temperature


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The most likely token of each row (ties go to the lowest token id).

    >>> greedy(torch.tensor([[0.1, 2.0, -1.0], [5.0, 0.0, 5.0]]))
    tensor([1, 0])
    """
    check_logits(logits)
    return logits.argmax(dim=-1)


def sample(
    logits: torch.Tensor, temperature: float = 1.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Draw one token per row from ``softmax(logits / temperature)`` (multinomial sampling).

    This is inverse transform sampling: token ``i`` owns an interval of length ``p_i`` in
    ``[0, 1)``, one uniform number picks a point, and a binary search finds whose interval it
    is. ``temperature=0`` is greedy decoding and draws no random number.
    """
    check_logits(logits)
    temperature = check_temperature(temperature)
    check_generator(generator, logits.device)
    if temperature == 0.0:
        return greedy(logits)
    scaled = apply_temperature(logits.float(), temperature)
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
    past_end = tokens == cumulative.shape[-1]
    if past_end.any():
        # u equal to the total, which only rounding can produce: take the last token whose
        # interval is not empty.
        rows = cumulative[past_end]
        tokens[past_end] = (rows < rows[..., -1:]).sum(dim=-1)
    return tokens


def gumbel_max(
    logits: torch.Tensor, temperature: float = 1.0, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Draw one token per row by the Gumbel-max trick: ``argmax(logits / T + G)``.

    ``G`` holds independent standard Gumbel noise, ``G = -log(-log U)`` with ``U`` uniform on
    (0, 1). The argmax of the perturbed logits is distributed exactly as
    ``softmax(logits / T)``: a sample with no normalisation and no cumulative sum, which is why
    the trick reappears later in the book (sampling without replacement, Gumbel-top-k).
    """
    check_logits(logits)
    temperature = check_temperature(temperature)
    check_generator(generator, logits.device)
    if temperature == 0.0:
        return greedy(logits)
    scaled = apply_temperature(logits.float(), temperature)
    u = torch.rand(scaled.shape, generator=generator, device=scaled.device, dtype=torch.float32)
    # rand draws from [0, 1): keep u away from 0 so that -log(u) stays finite.
    u = u.clamp_min(torch.finfo(torch.float32).tiny)
    gumbel = -torch.log(-torch.log(u))
    return (scaled + gumbel).argmax(dim=-1)


# --- Sampling settings and the full next-token rule (chapters 2 and 3) -----------------------


@dataclass(frozen=True)
class SamplingConfig:
    """How to choose each next token. Field names follow Hugging Face's ``GenerationConfig``
    (``temperature``, ``top_k``, ``top_p``, ``min_p``, ``typical_p``, ``repetition_penalty``),
    plus the OpenAI API's ``presence_penalty`` and ``frequency_penalty``. ``None`` turns a rule
    off; ``temperature=0`` is greedy decoding.

    The rules are applied in one fixed order, the same as Hugging Face's where it has the rule:

    1. ``repetition_penalty`` (counts prompt and output tokens, like Hugging Face and CTRL);
    2. ``presence_penalty`` then ``frequency_penalty`` (count output tokens only, like OpenAI);
    3. ``temperature`` (divides the logits);
    4. truncation: ``top_k``, then ``top_p``, then ``min_p``, then ``typical_p``.

    Penalties come first because they change which tokens are likely; truncation comes last so
    that it acts on the distribution that is actually sampled. At ``temperature=0`` the
    truncation rules are skipped, as Hugging Face does for greedy decoding: the most likely
    token is chosen after the penalties.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def __post_init__(self):
        check_temperature(self.temperature)
        _check_optional(self.top_k, "top_k", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                        "an integer >= 1")
        _check_optional(self.top_p, "top_p", lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]")
        _check_optional(self.min_p, "min_p", lambda v: _number(v) and 0 <= v <= 1, "a number in [0, 1]")
        _check_optional(self.typical_p, "typical_p", lambda v: _number(v) and 0 < v <= 1, "a number in (0, 1]")
        _check_optional(self.repetition_penalty, "repetition_penalty",
                        lambda v: _number(v) and 0 < v < math.inf, "a finite number > 0 (1 means no penalty)")
        for name in ("presence_penalty", "frequency_penalty"):
            _check_optional(getattr(self, name), name, lambda v: _number(v) and math.isfinite(v), "a finite number")


def process_logits(
    logits: torch.Tensor, config: SamplingConfig, context: torch.Tensor | None = None,
    output: torch.Tensor | None = None,
) -> torch.Tensor:
    """Apply ``config``'s penalties, temperature and truncation, in the documented order.

    ``context`` ``[batch, seq]`` holds every earlier token (prompt and output) for the
    repetition penalty; ``output`` ``[batch, n]`` the generated tokens only, for the presence
    and frequency penalties. Negative entries in either are padding and are ignored. Returns
    the logits of the distribution that is sampled (``-inf`` for removed tokens); at
    ``temperature=0``, logits whose argmax is the greedy choice.
    """
    values, ids = _penalise_and_truncate(logits, config, context, output)
    if ids is None:
        return values
    return torch.full_like(logits, float("-inf")).scatter(-1, ids, values)


def _penalise_and_truncate(logits, config: SamplingConfig, context, output):
    """The work of ``process_logits``, returning ``(values, ids)``: with top-k, ``values`` are
    the processed logits of the k survivors ``ids`` only (every other token is -inf); without
    it, ``ids`` is None and ``values`` covers the whole vocabulary."""
    if config.repetition_penalty is not None and config.repetition_penalty != 1.0:
        logits = penalties.repetition_penalty(logits, _tokens(context, logits), config.repetition_penalty)
    if config.presence_penalty:
        logits = penalties.presence_penalty(logits, _tokens(output, logits), config.presence_penalty)
    if config.frequency_penalty:
        logits = penalties.frequency_penalty(logits, _tokens(output, logits), config.frequency_penalty)
    if config.temperature == 0.0:
        return logits, None
    if config.temperature != 1.0:
        logits = apply_temperature(logits, config.temperature)
    if config.top_k is not None:
        survivors = _among_top_k(logits, config, rules)
        if survivors is not None:
            return survivors
        logits = rules.top_k(logits, config.top_k)
    return _truncate(logits, config, rules), None


def _truncate(logits, config: SamplingConfig, rules) -> torch.Tensor:
    """top-p, then min-p, then typical (each when set)."""
    if config.top_p is not None and config.top_p < 1.0:
        logits = rules.top_p(logits, config.top_p)
    if config.min_p is not None and config.min_p > 0.0:
        logits = rules.min_p(logits, config.min_p)
    if config.typical_p is not None and config.typical_p < 1.0:
        logits = rules.typical(logits, config.typical_p)
    return logits


def _among_top_k(logits, config: SamplingConfig, rules) -> torch.Tensor | None:
    """top-k, then the other rules on the k survivors only: a ``[batch, k]`` problem.

    After top-k every other token is at -inf and has probability 0, so top-p, min-p and
    typical give the same kept sets on the k survivors alone as on the whole vocabulary, at a
    fraction of the cost (no sort of 49,152 logits). Returns None when a tie with the k-th
    largest logit makes top-k keep more than k tokens; the caller then takes the plain path.
    """
    k = min(config.top_k, logits.shape[-1])
    values, ids = torch.topk(logits, k, dim=-1)
    if bool(((logits >= values[..., -1:]).sum(dim=-1) > k).any()):
        return None
    return _truncate(values, config, rules), ids


def next_token(
    logits: torch.Tensor, config: SamplingConfig, context: torch.Tensor | None = None,
    output: torch.Tensor | None = None, generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose one token per row under ``config``: returns ``(tokens [batch], processed logits)``."""
    values, ids = _penalise_and_truncate(logits, config, context, output)
    # The temperature is already applied: sample the processed logits as they are.
    chosen = greedy(values) if config.temperature == 0.0 else sample(values, 1.0, generator)
    if ids is None:
        return chosen, values
    # With top-k the draw ran over the k survivors only; map back to vocabulary ids.
    tokens = ids.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)
    return tokens, torch.full_like(logits, float("-inf")).scatter(-1, ids, values)


def _tokens(tokens: torch.Tensor | None, logits: torch.Tensor) -> torch.Tensor:
    if tokens is None:
        return torch.empty(logits.shape[0], 0, dtype=torch.long, device=logits.device)
    return tokens


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def _check_optional(value, name: str, ok, allowed: str) -> None:
    if value is not None and not ok(value):
        raise ValueError(f"{name} must be None (off) or {allowed}, got {value!r}")
