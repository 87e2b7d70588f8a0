"""Speculative sampling: a cheap drafter proposes, the target verifies, and nothing changes.

Chapter 6 ("Speculative sampling") explains this module; the proof that the output
distribution is exactly the target's is in the book's proofs page.

One *call* of the loop:

1. The drafter proposes ``gamma`` tokens ``d_1 .. d_gamma`` and the probabilities ``q_i`` it
   drew them from (``logitlab.drafters``).
2. The target runs **once** on the last token and the ``gamma`` drafts, which gives its
   distributions ``p_1 .. p_{gamma+1}`` at every drafted position and one more after them.
3. ``verify`` accepts draft ``i`` with probability ``min(1, p_i(d_i) / q_i(d_i))``, left to
   right, and stops at the first rejection. A rejected position gets a token drawn from the
   *residual* ``max(0, p_i - q_i)`` (normalised); if all drafts are accepted, a *bonus* token
   is drawn from ``p_{gamma+1}``. Each call therefore yields between 1 and ``gamma + 1`` tokens.

``p`` is the target's distribution **after** temperature and truncation (the same processing
``ll.generate`` applies): that is the distribution the output follows, exactly. The drafter's
processing only affects how often drafts are accepted.

The KV caches are rolled back to the accepted prefix without recomputation. Rows of a batch
accept different numbers of tokens, so instead of cutting each row's cache at its own length
(a cache is one tensor per layer, with one length for all rows), rejected positions stay in the
cache but are masked out of attention, like left padding, and the position ids count only the
positions that are kept. Whatever lies beyond the longest row is cropped.

The theory lives here too: ``acceptance_rate(p, q)``, ``expected_tokens(alpha, gamma)`` and
``speedup(alpha, gamma, c)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ._validate import check_generator, check_probs
from .generate import _eos_ids, _model_device, _prompt_batch
from .probs import softmax
from .sampling import SamplingConfig, inverse_transform, process_logits, sample


# --- Theory ------------------------------------------------------------------------------------


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


def speedup(alpha: float, gamma: int, c: float, verify_cost: float = 1.0) -> float:
    """Predicted speedup over plain decoding: tokens per call divided by the cost of a call.

    A call costs ``gamma`` drafter steps (``c`` target steps each) and one target pass over
    ``gamma + 1`` tokens, which costs ``verify_cost`` target steps (1 in the textbook model,
    more on a CPU, where scoring several tokens is not free).
    """
    alpha, gamma = _check_alpha_gamma(alpha, gamma)
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not c >= 0:
        raise ValueError(f"c (drafter step / target step) must be a number >= 0, got {c!r}")
    if isinstance(verify_cost, bool) or not isinstance(verify_cost, (int, float)) or not verify_cost > 0:
        raise ValueError(f"verify_cost must be a number > 0, got {verify_cost!r}")
    return expected_tokens(alpha, gamma) / (gamma * c + verify_cost)


def _check_alpha_gamma(alpha, gamma):
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
    return float(alpha), gamma


def pooled_alpha(results) -> float:
    """The acceptance rate over several runs: all their drafts accepted / all drafts examined
    (``SpeculativeResult.alpha`` pooled, so that runs with more calls weigh more)."""
    accepted = sum(n for r in results for nums in r.accepted for n in nums)
    examined = sum(min(n + 1, g) for r in results for nums, g in zip(r.accepted, r.drafted) for n in nums)
    return accepted / max(1, examined)


# --- One verification step ---------------------------------------------------------------------


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
    p_draft = p[:, :g].gather(-1, draft_tokens[..., None]).squeeze(-1).double()  # p_i(d_i)
    q_draft = q.gather(-1, draft_tokens[..., None]).squeeze(-1).double()  # q_i(d_i)
    u = torch.rand(batch, g, generator=generator, device=p.device, dtype=torch.float64)
    # Accept with probability min(1, p/q): u < p/q, written without dividing by q.
    accepted = u * q_draft < p_draft
    num = accepted.long().cumprod(dim=-1).sum(dim=-1)  # drafts accepted before the first rejection

    rows = torch.arange(batch, device=p.device)
    target = p[rows, num].double()  # p at the first rejected position (or the bonus position)
    rejected = num < g
    draft_q = torch.zeros_like(target)
    draft_q[rejected] = q[rows[rejected], num[rejected]].double()
    residual = (target - draft_q).clamp_min(0)  # all of p when every draft was accepted
    # A residual of zero mass means p = q at that position, where rejection has probability 0;
    # rounding can still get there, and then p itself is the right distribution.
    empty = residual.sum(dim=-1) <= 0
    residual[empty] = target[empty]
    # Draw from the (unnormalised) residual by inverse transform, as ll.sample does: the total
    # of the cumulative sum is the normaliser, so the residual is never divided by it.
    cumulative = residual.cumsum(dim=-1)
    u = torch.rand(batch, 1, generator=generator, device=p.device, dtype=torch.float64)
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


class RejectionSampling:
    """The acceptance rule of speculative sampling: exact at every temperature."""

    name = "rejection"

    def __call__(self, draft_tokens, q, p, target_logits, config, generator):
        if config.temperature == 0:
            return greedy_verify(draft_tokens, target_logits)
        return verify(draft_tokens, q, p, generator)


class GreedyMatching:
    """Accept drafts while they equal the target's most likely token (exact at temperature 0)."""

    name = "greedy"

    def __call__(self, draft_tokens, q, p, target_logits, config, generator):
        return greedy_verify(draft_tokens, target_logits)


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
    if (draft_tokens < 0).any() or (draft_tokens >= q.shape[2]).any():
        raise ValueError(f"draft_tokens must be token ids in [0, {q.shape[2]})")
    return batch, g


# --- The loop ----------------------------------------------------------------------------------


@dataclass
class SpeculativeResult:
    """What ``speculative_generate`` returns; the first fields are those of ``GenerationResult``."""

    sequences: list[torch.Tensor]  # prompt (without padding) followed by the new tokens
    new_tokens: list[torch.Tensor]
    finish_reasons: list[str]  # "eos" or "length"
    texts: list[str] | None
    prompt_index: list[int]
    target_calls: int = 0  # forward passes of the target, the prefill included
    drafter_steps: int = 0  # forward passes of the draft model (0 for a drafter without one)
    accepted: list[list[int]] = field(default_factory=list)  # per call: drafts accepted, per active row
    drafted: list[int] = field(default_factory=list)  # per call: drafts proposed per row (g)
    seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

    @property
    def tokens_per_call(self) -> float:
        """New tokens per target call, the prefill counted as a call that yields one token."""
        rows = len(self.new_tokens)
        return sum(len(t) for t in self.new_tokens) / rows / max(1, self.calls_per_row)

    @property
    def calls_per_row(self) -> float:
        """Target calls each row took part in, on average (rows that finish early leave the batch)."""
        return (len(self.new_tokens) + sum(len(a) for a in self.accepted)) / len(self.new_tokens)

    @property
    def alpha(self) -> float:
        """The measured acceptance rate: drafts accepted / drafts examined. A call examines its
        drafts up to the first rejection (all of them if none is rejected)."""
        return pooled_alpha([self])

    @property
    def draft_step_seconds(self) -> float:
        """Mean wall time of one forward pass of the draft model while proposing (0 without one).
        Divided by the time of a plain decode step of the target, this is the cost ratio ``c``."""
        steps = self.drafter_steps - 1  # the drafter's prefill of the prompt is not a draft step
        return self.draft_seconds / steps if steps > 0 else 0.0

    @property
    def verify_call_seconds(self) -> float:
        """Mean wall time of one verification call (the target's pass over the pending token and
        the drafts, and the acceptance rule). Divided by a decode step's time, this is ``v``."""
        calls = self.target_calls - 1  # the prefill is not a verification
        return self.verify_seconds / calls if calls > 0 else 0.0

    def acceptance_counts(self, positions: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """For each draft position i, how many times verification kept it and how many times it
        reached it (all drafts before it kept); counts, so that several runs can be pooled.
        ``positions`` fixes the length (default: the most drafts of any call)."""
        g = max(self.drafted, default=0) if positions is None else positions
        reached, kept = torch.zeros(g), torch.zeros(g)
        for nums, gi in zip(self.accepted, self.drafted):
            for n in nums:
                reached[: min(n + 1, gi)] += 1
                kept[:n] += 1
        return kept, reached

    def acceptance_by_position(self) -> torch.Tensor:
        """For each draft position i, the share of calls that reached it and accepted it."""
        kept, reached = self.acceptance_counts()
        return kept / reached.clamp_min(1)


@torch.inference_mode()
def speculative_generate(
    target,
    drafter,
    input_ids,
    *,
    gamma: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    typical_p: float | None = None,
    acceptance=None,
    num_return_sequences: int = 1,
    eos_token_id=None,
    tokenizer=None,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> SpeculativeResult:
    """Generate with speculative sampling: ``drafter`` proposes ``gamma`` tokens, ``target`` verifies.

    ``drafter`` is a language model with the target's vocabulary (wrapped as a
    ``DraftModelDrafter``) or any drafter object of ``logitlab.drafters``. ``acceptance`` is the
    rule (default ``RejectionSampling()``, which at temperature 0 is greedy matching). The
    output follows the target's distribution after temperature and truncation, exactly, for any
    drafter. Prompts as in ``ll.generate``; rows of a batch advance independently.
    """
    from .drafters import as_drafter
    from .generate import _check_counts

    start_time = time.perf_counter()
    config = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p)
    if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1 (tokens drafted per call), got {gamma!r}")
    _check_counts(max_new_tokens, 0, num_return_sequences)
    drafter = as_drafter(drafter)
    vocab = int(target.config.vocab_size)
    if getattr(drafter, "vocab_size", vocab) != vocab:
        raise ValueError(f"drafter has a vocabulary of {drafter.vocab_size} tokens, the target {vocab}: "
                         "they must share the tokenizer")
    acceptance = RejectionSampling() if acceptance is None else acceptance
    if not callable(acceptance):
        raise ValueError("acceptance must be an acceptance rule such as RejectionSampling()")
    eos = _eos_ids(eos_token_id, target)
    device = _model_device(target)
    check_generator(generator, device)
    ids, mask = _prompt_batch(input_ids, attention_mask, tokenizer, device)
    n = num_return_sequences
    ids, mask = ids.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0)
    prompt_mask = mask  # the loop extends `mask`; the prompts are read back from this one
    rows = ids.shape[0]

    # A drafter such as Medusa heads reads the target's last hidden state: then each target pass
    # is split into its body and its output layer (logitlab.medusa.body_and_logits).
    reads_hidden = getattr(drafter, "reads_hidden_state", False)
    if reads_hidden:
        from .medusa import _check_target, body_and_logits

        _check_target(target)

    # Prefill the target; its logits give the first new token, exactly as in ll.generate.
    positions = (mask.cumsum(dim=-1) - 1).clamp_min(0)
    drafter.start(ids, mask)
    if reads_hidden:
        cache, hidden, logits = body_and_logits(target, logits_to_keep=1, input_ids=ids, attention_mask=mask,
                                                position_ids=positions)
        drafter.observe(hidden[:, -1])
    else:
        out = target(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
        cache, logits = out.past_key_values, out.logits
    if hasattr(drafter, "take_prefill"):  # a drafter that runs the target itself (PaSS) starts from its prefill
        drafter.take_prefill(target, cache)
    # The first token is the target's choice after an empty prefix: the rule's own choice when it
    # has one (typical acceptance takes the argmax, as after any accepted prefix), else a draw.
    next_from = getattr(acceptance, "next_from", None)
    if next_from is not None and config.temperature > 0:
        first = next_from(softmax(process_logits(logits[:, -1].float(), config)), generator)
    else:
        first = _choose(logits[:, -1].float(), config, generator)

    output = [[t] for t in first.tolist()]
    reasons = ["length"] * rows
    active = torch.arange(rows, device=device)
    pending = first  # each active row's newest token, not yet in the target's cache
    result = SpeculativeResult([], [], reasons, None, [r // n for r in range(rows)], target_calls=1)
    finished = _finished(output, active, eos, max_new_tokens, reasons)

    while True:
        if finished.any():
            keep = (~finished).nonzero().squeeze(-1)
            if keep.numel() == 0:
                break
            cache.batch_select_indices(keep)
            drafter.select_rows(keep)
            active, pending, mask = active[keep], pending[keep], mask[keep]

        # 1. Draft (no more than the longest row still needs).
        left = max(max_new_tokens - len(output[r]) for r in active.tolist())
        t0 = time.perf_counter()
        drafts, q = drafter.propose(pending, min(gamma, left), config, generator)
        t1 = time.perf_counter()
        g = drafts.shape[1]

        # 2. One target pass over the pending token and the drafts.
        feed = torch.cat([pending[:, None], drafts], dim=1)
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], g + 1)], dim=1)
        positions = (mask.cumsum(dim=-1) - 1)[:, -(g + 1):]
        if reads_hidden:
            cache, hidden, logits = body_and_logits(target, input_ids=feed, attention_mask=mask,
                                                    position_ids=positions, past_key_values=cache)
        else:
            out = target(input_ids=feed, attention_mask=mask, position_ids=positions, past_key_values=cache,
                         use_cache=True)
            cache, logits = out.past_key_values, out.logits.float()  # [B, g + 1, V]
        result.target_calls += 1

        # 3. Accept a prefix of the drafts and choose the next token.
        if g == 0:
            num = torch.zeros(len(active), dtype=torch.long, device=device)
            nxt = _choose(logits[:, 0], config, generator)
        else:
            p = softmax(process_logits(logits, config)) if config.temperature > 0 else None
            num, nxt = acceptance(drafts, q, p, logits, config, generator)
        result.verify_seconds += time.perf_counter() - t1
        result.draft_seconds += t1 - t0
        result.accepted.append(num.tolist())
        result.drafted.append(g)
        for i, r in enumerate(active.tolist()):
            output[r] += drafts[i, : num[i]].tolist() + [nxt[i].item()]

        # 4. Roll back: the target's cache holds the pending token and all g drafts; rejected
        #    drafts are masked out (and cropped where no row keeps them).
        keep_draft = torch.arange(1, g + 1, device=device)[None] <= num[:, None]
        if g > 0:
            mask[:, -g:] = mask[:, -g:] * keep_draft.long()
        drop = g - int(num.max()) if g > 0 else 0
        if drop > 0:
            cache.crop(-drop)
            mask = mask[:, :-drop]
        drafter.rollback(num)
        if reads_hidden:  # the state where `nxt` was predicted: after the last kept draft
            drafter.observe(hidden[torch.arange(len(num), device=device), num])
        pending = nxt
        finished = _finished(output, active, eos, max_new_tokens, reasons)

    new = [torch.tensor(o, dtype=torch.long, device=device) for o in output]
    prompts = [row[m.bool()] for row, m in zip(ids, prompt_mask)]
    result.new_tokens = new
    result.sequences = [torch.cat([pr, t]) for pr, t in zip(prompts, new)]
    if tokenizer is not None:
        result.texts = [tokenizer.decode(t.tolist(), skip_special_tokens=True) for t in new]
    result.drafter_steps = getattr(drafter, "steps", 0)
    result.seconds = time.perf_counter() - start_time
    return result


def _choose(logits: torch.Tensor, config: SamplingConfig, generator) -> torch.Tensor:
    """One token per row from the target's logits, as ll.generate chooses (no penalties)."""
    if config.temperature == 0:
        return logits.argmax(dim=-1)
    return sample(process_logits(logits, config), 1.0, generator)


def _finished(output, active, eos, max_new_tokens, reasons) -> torch.Tensor:
    """Cut each active row at its first EOS or at max_new_tokens; which rows are done."""
    done = []
    for r in active.tolist():
        row = output[r]
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), None)
        if cut is not None and cut <= max_new_tokens:
            del row[cut:]
            reasons[r] = "eos"
            done.append(True)
        elif len(row) >= max_new_tokens:
            del row[max_new_tokens:]
            done.append(True)
        else:
            done.append(False)
    return torch.tensor(done, dtype=torch.bool, device=active.device)

