"""From logits to probabilities: temperature, softmax, entropy and distances.

Chapter 1 ("Logits and temperature") explains every function here.

Shapes: logits and probabilities are ``[..., vocab]`` (usually ``[batch, vocab]``); every
function works along the last dimension and keeps the leading ones.

Temperature conventions, stated once because they are often confused:

* ``T = 1`` leaves the model's distribution unchanged;
* ``T < 1`` sharpens it, and ``T -> 0`` tends to a one-hot on the most likely token (greedy);
* ``T > 1`` flattens it, and ``T -> inf`` tends to the uniform distribution over the tokens
  that are possible (finite logits).

``T = 0`` itself cannot be computed as ``logits / 0`` (it gives infinities and NaN); it is
defined here as greedy decoding, the one-hot on the argmax. That is the limit ``T -> 0`` when
one token has the largest logit. When several tokens tie for the largest logit the limit is
uniform over them, while ``T = 0`` keeps the greedy convention: the lowest token id, as
``torch.argmax`` does.
"""

from __future__ import annotations

import torch

from ._validate import check_logits, check_probs, check_same_device, check_temperature


def apply_temperature(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Divide logits by the temperature; at ``T = 0`` return the greedy limit.

    The greedy limit is written as logits too: ``0`` at the argmax and ``-inf`` elsewhere, so
    that ``softmax`` and ``log_softmax`` of the result are the one-hot distribution.

    When ``logits / T`` would overflow (a tiny ``T``, or half-precision logits: 60000 / 0.5 is
    past float16's largest number), each row's maximum is subtracted first. That gives the same
    distribution, since softmax ignores a constant added to a row, with every finite logit kept
    finite: the maximum becomes 0, and a logit becomes ``-inf`` only if its probability is 0
    in this dtype anyway. Otherwise the result is exactly ``logits / T``, as Hugging Face's
    ``TemperatureLogitsWarper``.

    >>> apply_temperature(torch.tensor([2.0, 1.0]), 0.5)
    tensor([4., 2.])
    >>> apply_temperature(torch.tensor([2.0, 1.0]), 1e-39)
    tensor([0., -inf])
    """
    check_logits(logits)
    temperature = check_temperature(temperature)
    if temperature == 0.0:
        greedy_ids = logits.argmax(dim=-1, keepdim=True)
        out = torch.full_like(logits, float("-inf"))
        return out.scatter(-1, greedy_ids, 0.0)
    if temperature == 1.0:
        return logits
    scaled = logits / temperature
    # Only T < 1 can overflow. An overflow makes a finite logit infinite: +inf (and softmax
    # NaN), or -inf for the row's largest logit (every logit -inf, NaN again). A T below the
    # dtype's smallest number is 0 to torch, and 0 / 0 is NaN.
    if temperature < 1 and bool((torch.isfinite(logits) & ~torch.isfinite(scaled)).any()):
        below_max = logits - logits.amax(dim=-1, keepdim=True)
        # The maximum (and any tie with it) is 0 at every T, even one that rounds to 0.
        scaled = torch.where(below_max == 0, 0.0, below_max / temperature)
    return scaled


def softmax(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Probabilities ``exp(z_i / T) / sum_j exp(z_j / T)`` along the last dimension.

    ``-inf`` logits get probability exactly 0. ``temperature=0`` gives the one-hot on the argmax.

    >>> softmax(torch.tensor([[0.0, 0.0]]))
    tensor([[0.5000, 0.5000]])
    >>> softmax(torch.tensor([[1.0, 3.0, 2.0]]), temperature=0)
    tensor([[0., 1., 0.]])
    """
    # torch.softmax subtracts the row maximum before exponentiating, so large logits do not
    # overflow exp; apply_temperature does the same when the division itself would overflow.
    return torch.softmax(apply_temperature(logits, temperature), dim=-1)


def log_softmax(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probabilities (natural log) along the last dimension; ``-inf`` for impossible tokens.

    Computed directly as ``z - logsumexp(z)``, which stays accurate for tiny probabilities
    where ``log(softmax(z))`` would underflow to ``-inf``.
    """
    return torch.log_softmax(apply_temperature(logits, temperature), dim=-1)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy ``-sum_i p_i log p_i`` in nats, with ``0 log 0 = 0``; shape ``[...]``.

    Zero for a one-hot distribution, ``log(V)`` for the uniform distribution over ``V`` tokens.
    """
    check_probs(probs, "probs")
    return -torch.xlogy(probs, probs).sum(dim=-1)


def kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Kullback-Leibler divergence ``KL(p || q) = sum_i p_i log(p_i / q_i)`` in nats.

    Not symmetric. It is ``+inf`` when ``q`` gives probability 0 to a token that ``p`` can emit.
    """
    _check_pair(p, q)
    return (torch.xlogy(p, p) - torch.xlogy(p, q)).sum(dim=-1)


def tv_distance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total variation distance ``max_A |p(A) - q(A)| = 0.5 * sum_i |p_i - q_i|``, in [0, 1]."""
    _check_pair(p, q)
    return 0.5 * (p - q).abs().sum(dim=-1)


def _check_pair(p, q) -> None:
    """Two distributions over one vocabulary: same shape, same device."""
    check_probs(p, "p")
    if not isinstance(q, torch.Tensor):
        raise ValueError(f"q must be a floating-point torch.Tensor of probabilities, got {type(q).__name__}")
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    check_same_device(q, "q", p, "p")
    check_probs(q, "q")
