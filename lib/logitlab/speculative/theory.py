"""What speculative sampling can gain, in theory (chapter 6).

``acceptance_rate(p, q)`` is the chance a draft from ``q`` is kept by a target ``p``;
``expected_tokens(alpha, gamma)`` how many tokens a call yields; ``speedup(alpha, gamma, c)`` what
that is worth against plain decoding when a draft step costs ``c`` target steps; and the helpers
that pool measured runs (``pooled_alpha``, ``examined_drafts``, ``loop_overhead``).
"""

from __future__ import annotations

import torch

from .._validate import check_int, check_number, check_probs
from ..decoding.result import GenerationResult


def acceptance_rate(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``sum_x min(p(x), q(x))``: the probability that a draft from ``q`` is accepted under ``p``.

    It equals ``1 - TV(p, q)``. Shapes ``[..., V]`` give ``[...]``.
    """
    check_probs(p, "p")
    check_probs(q, "q")
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    return torch.minimum(p, q).sum(dim=-1)


def expected_tokens(alpha: float, gamma: int) -> float:
    """Expected tokens per target call when each draft is accepted with probability ``alpha``,
    independently: ``(1 - alpha ** (gamma + 1)) / (1 - alpha)`` (``gamma + 1`` at ``alpha = 1``)."""
    alpha, gamma = _check_alpha_gamma(alpha, gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def greedy_chain_calls(hits, gamma: int) -> list[int]:
    """The drafts each call of a greedy chain keeps, read off a text it will produce.

    At T = 0 the text is the target's greedy text whatever the drafter does, and each call drafts
    after a prefix of it, so every verdict is fixed in advance: ``hits[t]`` says whether the
    drafter, run over that text in one pass, guesses its token ``t`` from the tokens before it.
    The first token comes from the prefill, so ``hits[0]`` is never read; a call that starts at
    token ``t`` drafts ``min(gamma, len(hits) - t)`` tokens and keeps its leading hits, and the
    next call starts after them and the target's own token. So a run's per-call counts
    (``SpeculativeResult.accepted``) can be checked, or forecast, from one pass over its text,
    without the independence that ``expected_tokens`` assumes: misses that come in runs make
    fewer calls start on an easy token.
    """
    gamma = check_int(gamma, "gamma", 1)
    hits = [bool(h) for h in hits]
    calls, t = [], 1
    while t < len(hits):
        kept = 0
        while kept < min(gamma, len(hits) - t) and hits[t + kept]:
            kept += 1
        calls.append(kept)
        t += kept + 1
    return calls


def speedup(alpha: float, gamma: int, c: float, verify_cost: float = 1.0, call_overhead: float = 0.0,
            step_overhead: float = 0.0) -> float:
    """Predicted speedup over plain decoding: tokens per call divided by the cost of a call.

    A call costs ``gamma`` drafter steps (``c`` target steps each), one target pass over
    ``gamma + 1`` tokens, which costs ``verify_cost`` target steps (1 in the textbook model,
    more on a CPU, where scoring several tokens is not free), and ``call_overhead`` steps of the
    loop's own work (choosing, accepting, trimming the cache). Plain decoding pays one pass and
    ``step_overhead`` steps of its own loop per token. Both overheads are 0 in the textbook
    model; :func:`loop_overhead` reads them from a run's recorded timings.
    """
    alpha, gamma = _check_alpha_gamma(alpha, gamma)
    c = check_number(c, "c (drafter step / target step)", "a number >= 0", lambda v: v >= 0)
    verify_cost = check_number(verify_cost, "verify_cost", "a number > 0", lambda v: v > 0)
    call_overhead, step_overhead = (
        check_number(value, f"{name} (the loop's own work, in target steps)", "a number >= 0", lambda v: v >= 0)
        for name, value in (("call_overhead", call_overhead), ("step_overhead", step_overhead)))
    return expected_tokens(alpha, gamma) * (1 + step_overhead) / (gamma * c + verify_cost + call_overhead)


def loop_overhead(result: GenerationResult, step: float, verify_cost, draft_step: float = 0.0) -> float:
    """The loop's own time per target call, in target steps, read from a run's recorded timings:
    what the cost model does not price. That is the run without its prefill, less every pass at
    its measured cost (``step`` seconds for a decode step; ``verify_cost(n)``: a pass over n new
    tokens, in steps) and less the drafter's steps at ``draft_step`` seconds each (its step
    measured apart, c times ``step``), over its calls: choosing and accepting tokens, recording
    log-probabilities, trimming caches, the drafter's own bookkeeping. For ``ll.generate``'s
    result (no drafts) every call is one step over one token. Each call's pass is over the tokens
    its result records as ``fed`` (a chain's drafts and the pending token, a tree's nodes and the
    pending token). Negative values are possible: passes timed apart can run slower than inside
    the loop."""
    step = check_number(step, "step (seconds of a decode step)", "a number > 0", lambda v: v > 0)
    draft_step = check_number(draft_step, "draft_step (seconds of a drafter step)", "a number >= 0", lambda v: v >= 0)
    if hasattr(result, "drafted"):
        sizes = list(result.fed) or [g + 1 for g in result.drafted]  # a result made without fed: chains
    else:
        sizes = [1] * len(result.step_seconds)
    if not sizes:
        raise ValueError("result must have made at least one call after its prefill")
    drafting = max(getattr(result, "drafter_steps", 1) - 1, 0) * draft_step  # its prompt's pass is not a draft step
    loop = result.seconds - result.prefill_seconds - drafting
    return (loop / step - sum(verify_cost(n) for n in sizes)) / len(sizes)


def _check_alpha_gamma(alpha, gamma):
    return check_number(alpha, "alpha", "a number in [0, 1]", lambda v: 0 <= v <= 1), check_int(gamma, "gamma", 1)


def pooled_alpha(results) -> float:
    """The acceptance rate over several runs: all their drafts accepted / all drafts examined
    (``SpeculativeResult.alpha`` pooled, so that runs with more calls weigh more)."""
    accepted = sum(n for r in results for nums in r.accepted for n in nums)
    return accepted / max(1, examined_drafts(results))


def call_counts(num: int, kept: int, g: int) -> tuple[int, int]:
    """``(accepted, examined)`` drafts of one row in one call that accepted ``num`` of its ``g``
    drafts and whose output keeps ``kept`` of the tokens the call gave it. A call examines its
    drafts up to the first rejection (all of them if none is rejected); when the output ends
    inside the accepted drafts (an EOS, or ``max_new_tokens``), the drafts after the end count
    neither as accepted nor as examined: the acceptance rate describes the text returned."""
    if kept <= num:
        return kept, kept
    return num, min(num + 1, g)


def examined_drafts(results) -> int:
    """How many drafts the target examined over several runs: in each call and row, those it
    accepted and the first it rejected (the drafts after a rejection are never looked at), as
    the loop recorded them (:func:`call_counts`). The count behind :func:`pooled_alpha`, and
    what its statistical uncertainty depends on."""
    return sum(n for r in results for nums in r.examined for n in nums)
