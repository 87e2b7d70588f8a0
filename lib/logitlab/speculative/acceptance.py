"""Verification: which drafts the target keeps (chapter 6, and its trees in chapters 7-9).

``verify`` is the rejection-sampling step for a batch of chains, ``greedy_verify`` its temperature-0
form. The loop takes the rule as an ``AcceptanceRule``: ``RejectionSampling`` (exact: the output
follows the target's distribution) and ``GreedyMatching``; typical acceptance (``typical``) is
another. Each rule also judges a tree of drafts (``tree_verify``).
"""

from __future__ import annotations

import torch

from .._validate import bad_logits, check_generator, check_logits, check_probs, checking_values
from ..devices import exact_dtype
from ..sampling.draw import inverse_transform
from ..sampling.pipeline import SamplingConfig, choose
from .tree_verify import greedy_tree, verify_tree


@torch.inference_mode()
def verify(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rejection-sampling step of speculative sampling, for a batch of rows.

    ``draft_tokens`` ``[B, g]``, the drafter's probabilities ``q`` ``[B, g, V]`` and the target's
    ``p`` ``[B, g + 1, V]``. Returns ``(num_accepted [B], next_token [B])``: row ``b`` keeps its
    first ``num_accepted[b]`` drafts, followed by ``next_token[b]`` (drawn from the residual at
    the first rejection, or from ``p[b, g]`` if every draft was accepted).
    """
    batch, g = _check_verify_shapes(draft_tokens, q, p)
    check_generator(generator, p.device)
    exact = exact_dtype(p.device)  # float64 where the device has it
    p_draft = p[:, :g].gather(-1, draft_tokens[..., None]).squeeze(-1).to(exact)  # p_i(d_i)
    q_draft = q.gather(-1, draft_tokens[..., None]).squeeze(-1).to(exact)  # q_i(d_i)
    u = torch.rand(batch, g, generator=generator, device=p.device, dtype=exact)
    # Accept with probability min(1, p/q): u < p/q, written without dividing by q.
    accepted = u * q_draft < p_draft
    num = accepted.long().cumprod(dim=-1).sum(dim=-1)  # drafts accepted before the first rejection

    rows = torch.arange(batch, device=p.device)
    target = p[rows, num].to(exact)  # p at the first rejected position (or the bonus position)
    rejected = num < g
    draft_q = torch.zeros_like(target)
    draft_q[rejected] = q[rows[rejected], num[rejected]].to(exact)
    residual = (target - draft_q).clamp_min(0)  # all of p when every draft was accepted
    # A residual of zero mass means p = q at that position, where rejection has probability 0;
    # rounding can still get there, and then p itself is the right distribution.
    empty = residual.sum(dim=-1) <= 0
    residual[empty] = target[empty]
    # Draw from the (unnormalised) residual by inverse transform, as ll.sample does: the total
    # of the cumulative sum is the normaliser, so the residual is never divided by it.
    cumulative = residual.cumsum(dim=-1)
    u = torch.rand(batch, 1, generator=generator, device=p.device, dtype=exact)
    next_token = inverse_transform(cumulative, u * cumulative[:, -1:])
    return num, next_token


def greedy_verify(draft_tokens: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Verification at temperature 0: keep drafts while they equal the target's most likely
    token; the next token is the target's most likely token after them. Same return values."""
    if draft_tokens.dim() != 2 or p.dim() != 3 or p.shape[:2] != (draft_tokens.shape[0], draft_tokens.shape[1] + 1):
        raise ValueError("draft_tokens must be [B, g] and p (or the target's logits) [B, g + 1, V]")
    best = p.argmax(dim=-1)  # [B, g + 1]
    num = (draft_tokens == best[:, :-1]).long().cumprod(dim=-1).sum(dim=-1)
    return num, best.gather(-1, num[:, None]).squeeze(-1)


class AcceptanceRule:
    """How the loop decides which drafts to keep: ``rule(draft_tokens, q, p, target_logits, config,
    generator) -> (num_accepted [B], next_token [B])``, with ``p`` the target's processed
    probabilities ``[B, g + 1, V]`` (None at temperature 0) and ``target_logits`` its raw logits.
    ``first_token`` chooses the target's token after an empty prefix (the first new token)."""

    # A rule whose randomness depends on the text (a keyed watermark's acceptance test) sets this;
    # the loop then sets ``text`` as it does a drafter's (``Drafter.reads_text``).
    reads_text: bool = False
    text = None

    def __call__(self, draft_tokens, q, p, target_logits, config, generator):
        raise NotImplementedError

    def first_token(self, logits: torch.Tensor, config: SamplingConfig, generator=None) -> torch.Tensor:
        return choose(logits, config, generator)

    def tree(self, parents, tokens, q, p, target_logits, config, generator) -> tuple[list[int], torch.Tensor]:
        """One row's tree (``logitlab.speculative.tree_verify``'s form: node 0 the pending token, ``q``
        ``[n, V]`` or None, ``p`` ``[n, V]`` or None at T = 0): ``(path, next_token)``."""
        raise ValueError(f"acceptance: {type(self).__name__} cannot verify a tree of drafts")


class RejectionSampling(AcceptanceRule):
    """The acceptance rule of speculative sampling: exact at every temperature, for chains and
    for trees (recursive rejection sampling, ``logitlab.speculative.tree_verify``)."""

    def __call__(self, draft_tokens, q, p, target_logits, config, generator):
        if config.temperature == 0:
            return greedy_verify(draft_tokens, target_logits)
        return verify(draft_tokens, q, p, generator)

    def tree(self, parents, tokens, q, p, target_logits, config, generator):
        if config.temperature == 0:
            return greedy_tree(parents, tokens, target_logits)
        return verify_tree(parents, tokens, q, p, generator)


class GreedyMatching(AcceptanceRule):
    """Accept drafts while they equal the target's most likely token (exact at temperature 0)."""

    def __call__(self, draft_tokens, q, p, target_logits, config, generator):
        return greedy_verify(draft_tokens, target_logits)

    def tree(self, parents, tokens, q, p, target_logits, config, generator):
        return greedy_tree(parents, tokens, target_logits)


def _check_verify_shapes(draft_tokens, q, p):
    for name, t in (("draft_tokens", draft_tokens), ("q", q), ("p", p)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if draft_tokens.dtype != torch.long or draft_tokens.dim() != 2 or draft_tokens.shape[1] < 1:
        raise ValueError(f"draft_tokens must be a LongTensor [B, g] with g >= 1, got {tuple(draft_tokens.shape)}")
    batch, g = draft_tokens.shape
    if q.dim() != 3 or q.shape[:2] != (batch, g):
        raise ValueError(f"q must have shape [B={batch}, g={g}, V], got {tuple(q.shape)}")
    if p.dim() != 3 or p.shape[:2] != (batch, g + 1) or p.shape[2] != q.shape[2]:
        raise ValueError(f"p must have shape [B={batch}, g + 1={g + 1}, V={q.shape[2]}], got {tuple(p.shape)}")
    check_probs(q, "q")
    check_probs(p, "p")
    if checking_values() and ((draft_tokens < 0).any() or (draft_tokens >= q.shape[2]).any()):
        raise ValueError(f"draft_tokens must be token ids in [0, {q.shape[2]})")
    return batch, g


def check_rule(acceptance) -> AcceptanceRule:
    """An acceptance rule instance (default ``RejectionSampling()``)."""
    if acceptance is None:
        return RejectionSampling()
    if isinstance(acceptance, type):
        raise ValueError(f"acceptance must be a rule object, got the class {acceptance.__name__}: "
                         f"call it, e.g. acceptance={acceptance.__name__}()")
    if not isinstance(acceptance, AcceptanceRule):
        raise ValueError("acceptance must be an acceptance rule such as ll.speculative.RejectionSampling() or "
                         f"ll.TypicalAcceptance(), got {type(acceptance).__name__}")
    return acceptance


def read_kept(num, logits, q) -> list[int]:
    """How many drafts each row keeps (``num``, ``[B]``), read from the device together with
    whether the target's logits (or the drafter's ``q``) hold what ``check_logits``
    (``check_probs``) refuses: a loop's one read of its verification. The loops run the rules
    under ``trusted()``; here the check catches up."""
    invalid = bad_logits(logits) if q is None else bad_logits(logits) | torch.isnan(q).any()
    *kept, bad = torch.cat([num, invalid.long()[None]]).tolist()
    if bad:
        check_logits(logits, "the target's logits")  # raises, saying what is wrong
        raise ValueError("q, the drafter's probabilities, contains NaN")
    return kept
