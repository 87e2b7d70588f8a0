"""Four more truncation rules: epsilon, eta, top-H and top-nσ (chapter 2).

``logitlab.sampling.truncation`` has the four rules in common use (top-k, top-p, min-p, typical). The
rules here are the ones users of local models reach for next. Each sets a cut-off from the
distribution itself:

* **epsilon** keeps the tokens whose probability is at least a fixed ``epsilon``;
* **eta** lowers that bar where the distribution is spread out: ``min(epsilon, sqrt(epsilon) *
  exp(-H))`` with ``H`` the entropy (both from Hewitt et al. 2022);
* **top-H** keeps the most likely tokens until their share of the entropy would pass a
  fraction of the whole (Hugging Face's ``TopHLogitsWarper``);
* **top-nσ** keeps the logits within ``n`` standard deviations of the largest (Tang et al. 2024).

As in ``logitlab.sampling.truncation``, each is a pure function on logits ``[..., vocab]`` that
returns new logits with ``-inf`` for removed tokens, and a class that is a Hugging Face
``LogitsProcessor``. Where Hugging Face has the rule (epsilon, eta, top-H), the same tokens are
kept, computed in the same arithmetic; the tests use its warpers as the oracle. The rules that
draw a coin or keep state between tokens (XTC, Mirostat) are in ``logitlab.sampling.adaptive``.
"""

from __future__ import annotations

import torch

from .._validate import check_int, check_logits, check_number
from .hf_processor import Processor

_NEG_INF = float("-inf")
# Top-H looks at this many most likely tokens only, as Hugging Face does.
TOP_H_CANDIDATES = 100


def epsilon_cut(logits: torch.Tensor, epsilon: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Epsilon sampling: keep the tokens whose probability is at least ``epsilon`` (in (0, 1));
    the ``min_tokens_to_keep`` most likely are always kept, and so are tokens tied with the last
    of them (as Hugging Face's ``EpsilonLogitsWarper``).

    >>> epsilon_cut(torch.tensor([0.6, 0.3, 0.08, 0.02]).log(), 0.05)
    tensor([-0.5108, -1.2040, -2.5257,    -inf])
    """
    check_logits(logits)
    epsilon = check_number(epsilon, "epsilon", "a number in (0, 1)", lambda v: 0 < v < 1)
    m = check_int(min_tokens_to_keep, "min_tokens_to_keep", minimum=1)
    return _keep_at_least(logits, torch.softmax(logits, dim=-1) < epsilon, m)


def eta_cut(logits: torch.Tensor, epsilon: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Eta sampling: keep the tokens whose probability is at least ``eta = min(epsilon,
    sqrt(epsilon) * exp(-H))``, where ``H`` is the entropy of the row in nats and ``epsilon`` is
    in (0, 1). A spread-out distribution (large ``H``) gets a lower bar, so more of its tokens
    survive than epsilon sampling would keep. ``min_tokens_to_keep`` as in :func:`epsilon_cut`.
    """
    check_logits(logits)
    epsilon = check_number(epsilon, "epsilon", "a number in (0, 1)", lambda v: 0 < v < 1)
    m = check_int(min_tokens_to_keep, "min_tokens_to_keep", minimum=1)
    # The entropy as Hugging Face computes it, with torch's Categorical (a -inf logit adds 0).
    entropy = torch.distributions.Categorical(logits=logits).entropy()[..., None]
    eps = torch.tensor(epsilon, device=logits.device)  # epsilon in float32, as Hugging Face keeps it
    eta = torch.minimum(eps, eps.sqrt() * torch.exp(-entropy))
    return _keep_at_least(logits, torch.softmax(logits, dim=-1) < eta, m)


def _keep_at_least(logits: torch.Tensor, remove: torch.Tensor, m: int) -> torch.Tensor:
    """Remove ``remove`` except the ``m`` largest logits of each row (and ties with the m-th)."""
    mth_largest = torch.topk(logits, min(m, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(remove & (logits < mth_largest), _NEG_INF)


def top_h(logits: torch.Tensor, h: float) -> torch.Tensor:
    """Top-H: among the ``TOP_H_CANDIDATES`` (100) most likely tokens, renormalised, keep the most
    likely ones while their terms ``-p log p`` add up to at most ``h`` times the entropy of those
    100 (``h`` in (0, 1]); the most likely token is always kept, the rest get ``-inf``.

    This is Hugging Face's ``TopHLogitsWarper``, rule and arithmetic. A small ``h`` keeps few
    tokens; ``h = 1`` keeps all 100 candidates. Works on ``[batch, vocab]`` or ``[vocab]``.
    """
    check_logits(logits)
    h = check_number(h, "h", "a number in (0, 1]", lambda v: 0 < v <= 1)
    rows = logits.reshape(-1, logits.shape[-1])
    top, ids = torch.topk(rows, min(TOP_H_CANDIDATES, rows.shape[-1]), dim=-1)
    candidates = torch.distributions.Categorical(logits=top)
    terms = -candidates.probs * torch.log(candidates.probs)
    keep = terms.cumsum(dim=-1) <= h * candidates.entropy()[:, None]
    keep[:, 0] = True
    kept = torch.zeros_like(rows, dtype=torch.bool).scatter(-1, ids, keep)
    return rows.masked_fill(~kept, _NEG_INF).reshape(logits.shape)


def top_n_sigma(logits: torch.Tensor, n: float) -> torch.Tensor:
    """Top-nσ: keep the tokens whose logit is at least ``max - n * sigma``, where ``sigma`` is the
    standard deviation of the row's finite logits (over the vocabulary, dividing by their
    number) and ``n >= 0``; the rest get ``-inf``.

    Dividing the logits by a temperature divides both the maximum's distance and ``sigma`` by it,
    so the kept set does not depend on the temperature; ``n = 0`` keeps the largest logit and
    its ties. Tokens already at ``-inf`` are left out of the statistics.

    >>> top_n_sigma(torch.tensor([4.0, 3.0, 1.0, 0.0]), 1.0)  # sigma 1.58: the bar is 2.42
    tensor([4., 3., -inf, -inf])
    """
    check_logits(logits)
    n = check_number(n, "n", "a finite number >= 0", lambda v: 0 <= v < float("inf"))
    finite = torch.isfinite(logits)
    count = finite.sum(dim=-1, keepdim=True)
    values = logits.masked_fill(~finite, 0.0)
    mean = values.sum(dim=-1, keepdim=True) / count
    sigma = ((values - mean).masked_fill(~finite, 0.0).square().sum(dim=-1, keepdim=True) / count).sqrt()
    bar = logits.amax(dim=-1, keepdim=True) - n * sigma
    return logits.masked_fill(logits < bar, _NEG_INF)


class EpsilonCut(Processor):
    """``epsilon_cut`` as a logits processor: ``EpsilonCut(3e-4)``."""

    def __init__(self, epsilon: float, min_tokens_to_keep: int = 1):
        self.epsilon = check_number(epsilon, "epsilon", "a number in (0, 1)", lambda v: 0 < v < 1)
        self.min_tokens_to_keep = check_int(min_tokens_to_keep, "min_tokens_to_keep", minimum=1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        return epsilon_cut(scores, self.epsilon, self.min_tokens_to_keep)


class EtaCut(EpsilonCut):
    """``eta_cut`` as a logits processor: ``EtaCut(3e-4)``."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        return eta_cut(scores, self.epsilon, self.min_tokens_to_keep)


class TopH(Processor):
    """``top_h`` as a logits processor: ``TopH(0.4)``."""

    def __init__(self, h: float):
        self.h = check_number(h, "h", "a number in (0, 1]", lambda v: 0 < v <= 1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        return top_h(scores, self.h)


class TopNSigma(Processor):
    """``top_n_sigma`` as a logits processor: ``TopNSigma(1.0)``."""

    def __init__(self, n: float):
        self.n = check_number(n, "n", "a finite number >= 0", lambda v: 0 <= v < float("inf"))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        return top_n_sigma(scores, self.n)
