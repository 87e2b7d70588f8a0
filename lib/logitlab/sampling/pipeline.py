"""The full rule for the next token: the settings, and the pipeline that applies them (chapters 2-9).

``SamplingConfig`` holds every setting of a decoding run (temperature, the truncation rules of
``truncation`` and ``cutoffs``, the penalties of ``penalties``) and checks them once.
``process_logits`` applies them in one fixed order, and ``next_token`` draws from the result. The
loops of chapters 3-9 take one token with ``choose`` (greedy at temperature 0, else a draw from the
processed distribution) or ``draw`` (the same, with the distribution it came from, which a drafter
hands to verification); ``target_probs`` is the distribution drafts are judged by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from .._validate import check_int, check_number, check_temperature
from ..probs import apply_temperature
from . import cutoffs, penalties, truncation
from .draw import greedy, sample


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
       (steps 1 and 2 are ``logitlab.sampling.penalties.apply_penalties``);
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
        survivors = _among_top_k(logits, config)
        if survivors is not None:
            return survivors
        logits = truncation.top_k(logits, config.top_k)
    return _truncate(logits, config), None


def _truncate(logits, config: SamplingConfig) -> torch.Tensor:
    """top-p, then min-p, typical, epsilon and eta (each when set)."""
    if config.top_p is not None and config.top_p < 1.0:
        logits = truncation.top_p(logits, config.top_p)
    if config.min_p is not None and config.min_p > 0.0:
        logits = truncation.min_p(logits, config.min_p)
    if config.typical_p is not None and config.typical_p < 1.0:
        logits = truncation.typical(logits, config.typical_p)
    if config.epsilon_cutoff is not None:
        logits = cutoffs.epsilon_cut(logits, config.epsilon_cutoff)
    if config.eta_cutoff is not None:
        logits = cutoffs.eta_cut(logits, config.eta_cutoff)
    return logits


def _among_top_k(logits, config: SamplingConfig) -> torch.Tensor | None:
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
    return _truncate(values, config), ids


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
