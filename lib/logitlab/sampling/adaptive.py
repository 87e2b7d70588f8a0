"""Two rules that do more than cut a fixed tail: XTC and Mirostat (chapter 2).

* **XTC** ("exclude top choices", from text-generation-webui and llama.cpp) cuts the other end:
  with some probability it removes every token above a probability threshold except the least
  likely of them, so the text sometimes leaves its most obvious path but stays among sensible
  continuations;
* **Mirostat** (Basu et al. 2021, version 2) is a feedback loop: it cuts the tokens whose
  surprise ``-log2 p`` exceeds a bar ``mu``, and after each sampled token moves ``mu`` so that
  the observed surprise stays near a target ``tau``.

XTC, given its coin, is a pure function of the logits; Mirostat's processor keeps one bar per
row between calls. Each is a function on logits ``[..., vocab]`` that returns new logits with
``-inf`` for removed tokens, and a class that is a Hugging Face ``LogitsProcessor``, as the rules
of ``logitlab.sampling.truncation`` and ``logitlab.sampling.cutoffs`` are.
"""

from __future__ import annotations

import math

import torch

from .._validate import check_logits, check_number
from .hf_processor import Processor

_NEG_INF = float("-inf")


def xtc(logits: torch.Tensor, threshold: float, probability: float,
        generator: torch.Generator | None = None) -> torch.Tensor:
    """XTC: in each row, with probability ``probability`` (in [0, 1]), remove every token whose
    probability is at least ``threshold`` (in (0, 0.5]) except the least likely of them (and its
    ties); a row
    with fewer than two such tokens is left as it is. The coin is drawn with ``generator`` on the
    logits' device, one per row.

    >>> xtc(torch.tensor([0.5, 0.3, 0.15, 0.05]).log(), 0.1, 1.0)  # 0.5 and 0.3 go, 0.15 stays
    tensor([   -inf,    -inf, -1.8971, -2.9957])
    """
    check_logits(logits)
    threshold = check_number(threshold, "threshold", "a number in (0, 0.5]", lambda v: 0 < v <= 0.5)
    probability = check_number(probability, "probability", "a number in [0, 1]", lambda v: 0 <= v <= 1)
    rows = logits.reshape(-1, logits.shape[-1])
    coin = torch.rand(rows.shape[0], 1, generator=generator, device=logits.device) < probability
    probs = torch.softmax(rows.float(), dim=-1)
    above = probs >= threshold
    # The least likely token above the threshold survives: the smallest probability among them.
    least = probs.masked_fill(~above, 2.0).amin(dim=-1, keepdim=True)
    remove = above & (probs > least) & (above.sum(dim=-1, keepdim=True) >= 2) & coin
    return rows.masked_fill(remove, _NEG_INF).reshape(logits.shape)


def mirostat_cut(logits: torch.Tensor, mu) -> torch.Tensor:
    """Mirostat's cut: remove the tokens whose surprise ``-log2 p`` is above ``mu`` (a number or
    a tensor with one bar per row); the most likely token is always kept.

    >>> mirostat_cut(torch.tensor([0.5, 0.3, 0.15, 0.05]).log(), 2.0)  # surprises 1, 1.7, 2.7, 4.3
    tensor([-0.6931, -1.2040,    -inf,    -inf])
    """
    check_logits(logits)
    mu = torch.as_tensor(mu, dtype=torch.float32, device=logits.device)
    if bool(torch.isnan(mu).any()):
        raise ValueError("mu must be a number or a tensor of numbers, not NaN")
    surprise = -torch.log_softmax(logits.float(), dim=-1) / math.log(2)
    top = logits == logits.amax(dim=-1, keepdim=True)
    bar = mu[..., None] if mu.dim() else mu  # one bar per row
    return logits.masked_fill((surprise > bar) & ~top, _NEG_INF)


class Mirostat(Processor):
    """Mirostat 2 as a logits processor: ``Mirostat(tau=5.0, eta=0.1)``, one per generation.

    Each call cuts the tokens whose surprise is above the row's bar ``mu`` (``2 * tau`` at the
    start). At the next call, it reads the token the sampler chose (the last of ``input_ids``),
    measures its surprise under the cut distribution it handed out, and moves the bar: ``mu -=
    eta * (surprise - tau)``. A row is recognised by its tokens, so rows may finish and leave the
    batch between calls. The surprise is that of the distribution Mirostat hands out: sample from
    it as it is (temperature 1, no other truncation after it) for the loop to hold ``tau``.
    """

    def __init__(self, tau: float, eta: float = 0.1):
        self.tau = check_number(tau, "tau", "a finite number > 0 (bits)", lambda v: 0 < v < math.inf)
        self.eta = check_number(eta, "eta", "a number in (0, 1]", lambda v: 0 < v <= 1)
        self.rows = {}  # tokens so far -> (mu, the cut log-probabilities handed out)
        self.surprises = []  # every observed surprise, in bits, in the order they were seen

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        mus = [self._mu(seq) for seq in input_ids.tolist()]
        cut = mirostat_cut(scores, torch.tensor(mus, device=scores.device))
        logprobs = torch.log_softmax(cut.float(), dim=-1)
        self.rows = {tuple(seq): (mu, lp) for seq, mu, lp in zip(input_ids.tolist(), mus, logprobs)}
        return cut

    def _mu(self, seq: list[int]) -> float:
        """The row's bar, moved by the surprise of the token chosen since the last call."""
        earlier = self.rows.get(tuple(seq[:-1]))
        if earlier is None:
            return 2 * self.tau
        mu, logprobs = earlier
        surprise = -logprobs[seq[-1]].item() / math.log(2)
        self.surprises.append(surprise)
        return mu - self.eta * (surprise - self.tau)


class XTC(Processor):
    """``xtc`` as a logits processor: ``XTC(0.1, 0.5, generator=g)``."""

    def __init__(self, threshold: float, probability: float, generator: torch.Generator | None = None):
        self.threshold = check_number(threshold, "threshold", "a number in (0, 0.5]", lambda v: 0 < v <= 0.5)
        self.probability = check_number(probability, "probability", "a number in [0, 1]", lambda v: 0 <= v <= 1)
        self.generator = generator

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        return xtc(scores, self.threshold, self.probability, self.generator)
