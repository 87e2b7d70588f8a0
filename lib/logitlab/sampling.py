"""Choosing one token from logits: multinomial sampling, Gumbel-max and greedy.

Chapter 1 ("Logits and temperature") explains ``sample``, ``gumbel_max`` and ``greedy``;
chapters 2 and 3 add ``SamplingConfig`` and ``next_token``, which apply the penalties and
truncation rules of ``logitlab.processors`` before sampling. The loops of chapters 3-9 take one
token with ``choose`` (greedy at temperature 0, else a draw from the processed distribution) or
``draw`` (the same, with the distribution it came from, which a drafter hands to verification);
``target_probs`` is the distribution drafts are judged by.

All functions take logits ``[..., vocab]`` and return token ids ``[...]`` (dtype ``long``).
Every random function takes an optional ``torch.Generator``: the same seed on the same device
gives the same tokens, which is what makes an experiment reproducible.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from ._validate import check_generator, check_int, check_logits, check_number, check_temperature
from .devices import exact_dtype
from . import cutoffs, penalties
from . import processors as rules
from .probs import apply_temperature


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


# --- Sampling settings and the full next-token rule (chapters 2 and 3) -----------------------


@dataclass(frozen=True)
class SamplingConfig:
    """How to choose each next token. Field names follow Hugging Face's ``GenerationConfig``
    (``temperature``, ``top_k``, ``top_p``, ``min_p``, ``typical_p``, ``top_h``,
    ``epsilon_cutoff``, ``eta_cutoff``, ``repetition_penalty``), plus the OpenAI API's
    ``presence_penalty`` and ``frequency_penalty`` and llama.cpp's ``top_n_sigma``. ``None`` turns
    a rule off; ``temperature=0`` is greedy decoding.

    The rules are applied in one fixed order, the same as Hugging Face's where it has the rule:

    1. ``repetition_penalty`` (counts prompt and output tokens, like Hugging Face and CTRL);
    2. ``presence_penalty`` then ``frequency_penalty`` (count output tokens only, like OpenAI)
       (steps 1 and 2 are ``logitlab.penalties.apply_penalties``);
    3. ``temperature`` (divides the logits);
    4. truncation: ``top_n_sigma`` (as llama.cpp, on the whole vocabulary; it does not depend on
       the temperature), ``top_h``, ``top_k``, ``top_p``, ``min_p``, ``typical_p``,
       ``epsilon_cutoff``, ``eta_cutoff`` (Hugging Face's order for the rules it has).

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
    top_h: float | None = None
    top_n_sigma: float | None = None
    epsilon_cutoff: float | None = None
    eta_cutoff: float | None = None

    def __post_init__(self):
        checked = {
            "temperature": check_temperature(self.temperature),
            "top_k": _optional(check_int, self.top_k, "top_k", 1, "an integer >= 1, or None (off)"),
            "top_p": _optional(check_number, self.top_p, "top_p", "a number in (0, 1], or None (off)",
                               lambda v: 0 < v <= 1),
            "min_p": _optional(check_number, self.min_p, "min_p", "a number in [0, 1], or None (off)",
                               lambda v: 0 <= v <= 1),
            "typical_p": _optional(check_number, self.typical_p, "typical_p", "a number in (0, 1], or None (off)",
                                   lambda v: 0 < v <= 1),
            "repetition_penalty": _optional(check_number, self.repetition_penalty, "repetition_penalty",
                                            "a finite number > 0 (1 means no penalty), or None (off)",
                                            lambda v: 0 < v < math.inf),
            "top_h": _optional(check_number, self.top_h, "top_h", "a number in (0, 1], or None (off)",
                               lambda v: 0 < v <= 1),
            "top_n_sigma": _optional(check_number, self.top_n_sigma, "top_n_sigma",
                                     "a finite number >= 0, or None (off)", lambda v: 0 <= v < math.inf),
        }
        for name in ("epsilon_cutoff", "eta_cutoff"):
            checked[name] = _optional(check_number, getattr(self, name), name, "a number in (0, 1), or None (off)",
                                      lambda v: 0 < v < 1)
        for name in ("presence_penalty", "frequency_penalty"):
            checked[name] = _optional(check_number, getattr(self, name), name,
                                      "a finite number (0 means no penalty), or None (off)", math.isfinite)
        # Keep plain Python numbers (np.float32(0.7) becomes 0.7...), so that two equal configs
        # compare and print alike whatever built them. The dataclass is frozen, hence object's
        # __setattr__.
        for field in fields(self):
            object.__setattr__(self, field.name, checked[field.name])


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
    if not isinstance(config, SamplingConfig):
        raise ValueError(f"config must be a SamplingConfig, got {type(config).__name__}; "
                         "for example SamplingConfig(temperature=0.7, top_p=0.9)")
    # This checks logits, context and output too, even with every penalty off.
    logits = penalties.apply_penalties(
        logits, context, output, repetition_penalty=config.repetition_penalty,
        presence_penalty=config.presence_penalty, frequency_penalty=config.frequency_penalty,
    )
    if config.temperature == 0.0:
        return logits, None
    if config.temperature != 1.0:
        logits = apply_temperature(logits, config.temperature)
    # These two look at the whole vocabulary (its spread, its 100 likeliest tokens), so they run
    # before top-k; the rules after top-k give the same kept sets on its survivors alone.
    if config.top_n_sigma is not None:
        logits = cutoffs.top_n_sigma(logits, config.top_n_sigma)
    if config.top_h is not None:
        logits = cutoffs.top_h(logits, config.top_h)
    if config.top_k is not None:
        survivors = _among_top_k(logits, config, rules)
        if survivors is not None:
            return survivors
        logits = rules.top_k(logits, config.top_k)
    return _truncate(logits, config, rules), None


def _truncate(logits, config: SamplingConfig, rules) -> torch.Tensor:
    """top-p, then min-p, typical, epsilon and eta (each when set)."""
    if config.top_p is not None and config.top_p < 1.0:
        logits = rules.top_p(logits, config.top_p)
    if config.min_p is not None and config.min_p > 0.0:
        logits = rules.min_p(logits, config.min_p)
    if config.typical_p is not None and config.typical_p < 1.0:
        logits = rules.typical(logits, config.typical_p)
    if config.epsilon_cutoff is not None:
        logits = cutoffs.epsilon_cut(logits, config.epsilon_cutoff)
    if config.eta_cutoff is not None:
        logits = cutoffs.eta_cut(logits, config.eta_cutoff)
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


def _optional(check, value, *args):
    """``check(value, *args)``, or None (the rule is off) for None."""
    return None if value is None else check(value, *args)


# --- One token for a loop, and the distribution it came from (chapters 3-9) ----------------------

def choose(logits: torch.Tensor, config: SamplingConfig, generator=None) -> torch.Tensor:
    """One token per row under ``config`` (no penalties: they need the history, see ``next_token``)."""
    return next_token(logits, config, generator=generator)[0]


def draw(logits: torch.Tensor, config: SamplingConfig, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``choose``, and the distribution the token came from: one-hot at temperature 0, else the
    processed distribution. Logits ``[..., V]`` give tokens ``[...]`` and probabilities ``[..., V]``."""
    flat = logits.reshape(-1, logits.shape[-1])
    tokens, processed = next_token(flat, config, generator=generator)
    if config.temperature == 0:
        probs = torch.nn.functional.one_hot(tokens, flat.shape[-1]).to(flat.dtype)
    else:
        probs = torch.softmax(processed, dim=-1)
    return tokens.view(logits.shape[:-1]), probs.view(logits.shape)


def target_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor | None:
    """The distribution the target samples from under ``config`` (penalties aside), which the
    acceptance rules compare drafts with; None at temperature 0, where they compare argmaxes."""
    if config.temperature == 0:
        return None
    return torch.softmax(process_logits(logits, config), dim=-1)
