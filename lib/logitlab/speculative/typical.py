"""Typical acceptance: Medusa's rule for accepting drafts, which trades exactness for length.

Chapter 7 ("Typical acceptance") explains this module.

Rejection sampling (``logitlab.speculative.loop``) keeps the output distribution exactly the
target's. Medusa (Cai et al., 2024) accepts a draft token ``d`` at a position instead whenever the
target finds it *typical enough* there:

    p(d) > min(epsilon, delta * exp(-H(p)))

with ``p`` the target's distribution at the sampling temperature and ``H(p)`` its entropy in
nats. Where the target is sure (low entropy), the threshold is ``epsilon``: only tokens it
gives a fair share of its mass pass. Where it hesitates (high entropy), ``delta * exp(-H)`` is
small, and so is the bar. A call keeps the longest prefix of drafts that all pass; the token
after that prefix comes from the target, either its most likely token (``next_token="argmax"``,
the choice the Medusa paper describes; with drafts that are a drafter's top tokens nothing is
random then, and each prompt gets one answer) or a sample of ``p`` (``next_token="sample"``).
Medusa's released code samples it from ``p`` restricted to the tokens above the bar.

The rule never looks at the drafter's ``q``: it judges the drafts by the target alone, so a draft
the target finds plausible is kept whatever the drafter's confidence, and the output is *not*
distributed as the target's ``p`` in general. At temperature 0 it is greedy matching: ``p`` is
one-hot, its entropy 0, and the draft passes exactly when it is the target's most likely token.
"""

from __future__ import annotations

import torch

from .._validate import check_generator, check_number, check_probs
from ..devices import exact_dtype
from ..probs import softmax
from ..sampling.draw import inverse_transform
from ..sampling.pipeline import process_logits
from .acceptance import AcceptanceRule, greedy_verify
from .tree_verify import check_tree, deepest_path, greedy_tree


def _check_epsilon_delta(epsilon, delta):
    epsilon = check_number(epsilon, "epsilon (the threshold's upper bound)", "a number in (0, 1)", lambda v: 0 < v < 1)
    delta = check_number(delta, "delta (the entropy-scaled threshold's factor)", "a number > 0", lambda v: v > 0)
    return epsilon, delta


def match_probability(p: torch.Tensor) -> torch.Tensor:
    """The probability that two independent draws from ``p`` ``[..., V]`` are the same token,
    ``sum_v p(v)^2`` (``[...]``): how often *exact matching* (a draft sampled from ``p`` kept
    only when the target's own sample equals it) keeps a perfect drafter's token."""
    check_probs(p, "p")
    return (p * p).sum(dim=-1)


def typical_threshold(p: torch.Tensor, epsilon: float, delta: float) -> torch.Tensor:
    """The bar a draft must clear at each position: ``min(epsilon, delta * exp(-H(p)))``.

    ``p`` ``[..., V]`` gives ``[...]``.
    """
    epsilon, delta = _check_epsilon_delta(epsilon, delta)
    check_probs(p, "p")
    # Each term in p's own precision, the sum over the vocabulary in float64 (where the device
    # has it): a float64 copy of p cost more than the whole rest of a tree's verification.
    entropy = -torch.xlogy(p, p).sum(dim=-1, dtype=exact_dtype(p.device))
    return torch.clamp(delta * torch.exp(-entropy), max=epsilon)


@torch.inference_mode()
def typical_accept(draft_tokens: torch.Tensor, p: torch.Tensor, epsilon: float, delta: float) -> torch.Tensor:
    """How many drafts each row keeps under typical acceptance: ``num_accepted`` ``[B]``.

    ``draft_tokens`` ``[B, g]``; ``p`` ``[B, g, V]`` or ``[B, g + 1, V]`` (the target's
    probabilities at each drafted position; a last, bonus position is ignored). Draft ``i`` passes
    when ``p_i(d_i) > min(epsilon, delta * exp(-H(p_i)))``; a row keeps its drafts up to the first
    that fails.
    """
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dtype != torch.long or draft_tokens.dim() != 2:
        raise ValueError("draft_tokens must be a LongTensor of shape [B, g]")
    batch, g = draft_tokens.shape
    if not isinstance(p, torch.Tensor) or p.dim() != 3 or p.shape[0] != batch or p.shape[1] not in (g, g + 1):
        raise ValueError(f"p must have shape [B={batch}, g={g} or g + 1, V], got "
                         f"{tuple(p.shape) if isinstance(p, torch.Tensor) else type(p).__name__}")
    if (draft_tokens < 0).any() or (draft_tokens >= p.shape[2]).any():
        raise ValueError(f"draft_tokens must be token ids in [0, {p.shape[2]})")
    p = p[:, :g]
    threshold = typical_threshold(p, epsilon, delta)  # [B, g]
    passes = p.gather(-1, draft_tokens[..., None]).squeeze(-1).to(threshold.dtype) > threshold
    return passes.long().cumprod(dim=-1).sum(dim=-1)


class TypicalAcceptance(AcceptanceRule):
    """Medusa's typical acceptance as an acceptance rule for ``ll.speculative_generate``.

    ``epsilon`` and ``delta`` set the threshold (Medusa's defaults: 0.09 and 0.3, the
    square root of epsilon); ``next_token`` says how the token after the kept drafts is chosen:
    ``"argmax"`` (Medusa) or ``"sample"`` (a draw from the target's ``p`` there). At temperature
    0 the rule is greedy matching, whatever the settings.
    """

    def __init__(self, epsilon: float = 0.09, delta: float = 0.3, next_token: str = "argmax"):
        self.epsilon, self.delta = _check_epsilon_delta(epsilon, delta)
        if next_token not in ("argmax", "sample"):
            raise ValueError(f"next_token must be 'argmax' or 'sample', got {next_token!r}")
        self.next_token = next_token

    def __call__(self, draft_tokens, q, p, target_logits, config, generator):
        if config.temperature == 0:
            return greedy_verify(draft_tokens, target_logits)
        check_generator(generator, p.device)
        num = typical_accept(draft_tokens, p, self.epsilon, self.delta)
        after = p[torch.arange(len(num), device=p.device), num]  # [B, V]: the target after the kept drafts
        return num, self.next_from(after, generator)

    def tree(self, parents, tokens, q, p, target_logits, config, generator):
        """A tree (Medusa's way): each node judged by the typical bar of its parent's ``p``; the
        deepest node that passes with all its ancestors wins, and the next token follows it."""
        if config.temperature == 0:
            return greedy_tree(parents, tokens, target_logits)
        check_tree(parents, tokens, p, "p")
        above = torch.tensor(parents[1:], device=p.device)
        # Each parent's bar once (its entropy is a pass over the vocabulary), then one per child.
        judged, which = torch.unique(above, return_inverse=True)
        bar = typical_threshold(p[judged], self.epsilon, self.delta)[which]
        passes = p[above, tokens[1:]].to(bar.dtype) > bar
        path = deepest_path(parents, [True] + passes.tolist())
        return path, self.next_from(p[path[-1]][None], generator)[0]

    def first_token(self, logits, config, generator=None) -> torch.Tensor:
        """The token after an empty prefix (the very first one), chosen as after any kept prefix,
        so that with ``"argmax"`` every token the target chooses is its most likely one, as in Medusa."""
        if config.temperature == 0:
            return logits.argmax(dim=-1)
        return self.next_from(softmax(process_logits(logits, config)), generator)

    def next_from(self, p: torch.Tensor, generator=None) -> torch.Tensor:
        """The target's token after the kept drafts, from its probabilities there (``[B, V]``)."""
        if self.next_token == "argmax":
            return p.argmax(dim=-1)
        exact = exact_dtype(p.device)
        cumulative = p.to(exact).cumsum(dim=-1)
        u = torch.rand(len(p), 1, generator=generator, device=p.device, dtype=exact)
        return inverse_transform(cumulative, u * cumulative[:, -1:])
