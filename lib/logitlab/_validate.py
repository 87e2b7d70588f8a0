"""Argument checks shared by the library.

Every public function validates what it is given and raises a ``ValueError`` that names the
argument and says what is allowed. Nothing is silently clamped: a temperature of -1 or a
logits tensor full of NaN is a bug in the caller, and the earliest clear message is the kindest.
"""

from __future__ import annotations

import math

import torch

from .devices import exact_dtype


def check_logits(logits, name: str = "logits") -> torch.Tensor:
    """Return ``logits`` if it is a floating tensor ``[..., vocab]`` with no NaN and no +inf.

    ``-inf`` is allowed (it is how a removed token is written) as long as every row keeps at
    least one finite entry, since a row of all ``-inf`` has no distribution.
    """
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [batch, vocab], got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {logits.dtype}")
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last (vocabulary) dimension, got shape {tuple(logits.shape)}")
    # One pass over the tensor in the common case: NaN and +inf both fail `< inf`.
    if not bool((logits < float("inf")).all()):
        if torch.isnan(logits).any():
            raise ValueError(f"{name} contains NaN; every entry must be a number or -inf")
        raise ValueError(f"{name} contains +inf; entries must be finite or -inf")
    if logits.numel() > 0 and bool((logits.amax(dim=-1) == float("-inf")).any()):
        raise ValueError(f"{name} has a row where every entry is -inf; at least one token must stay possible")
    return logits


def check_temperature(temperature) -> float:
    """A temperature is a finite number >= 0 (0 meaning greedy)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if math.isnan(temperature) or math.isinf(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {temperature}")
    return float(temperature)


def check_probs(p, name: str) -> torch.Tensor:
    """A probability tensor: floating, no NaN, entries in [0, 1], rows summing to 1 (loosely)."""
    if not isinstance(p, torch.Tensor) or not p.is_floating_point():
        raise ValueError(f"{name} must be a floating-point torch.Tensor of probabilities")
    if p.dim() < 1 or p.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last (vocabulary) dimension, got shape {tuple(p.shape)}")
    if torch.isnan(p).any() or (p < 0).any() or (p > 1 + 1e-6).any():
        raise ValueError(f"{name} must hold probabilities in [0, 1] (no NaN)")
    sums = p.sum(dim=-1, dtype=exact_dtype(p.device))  # float64 where the device has it
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
        raise ValueError(f"{name} rows must sum to 1, got sums between {sums.min():.4f} and {sums.max():.4f}")
    return p


def check_generator(generator, device: torch.device) -> None:
    """A generator, when given, must be a torch.Generator on the same device type as the data."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator.device.type != device.type:
        raise ValueError(
            f"generator is on {generator.device.type} but the logits are on {device.type}; "
            f"create it with torch.Generator(device={device.type!r})"
        )
