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

import numbers
from dataclasses import dataclass, field

import torch

from ._validate import check_generator, check_probs
from ._validate import check_body_and_head, check_counts, check_model, vocab_size
from .decoding.cache import keep_in_block, roll_back
from .decoding.passes import forward, tree_forward
from .decoding.prompts import eos_ids, prompt_batch
from .decoding.result import GenerationResult, decode_texts, token_logprobs
from .sampling.pipeline import choose, target_probs
from .devices import exact_dtype, model_device, now
from .constrained.constraint import LookAhead, constraint_rows
from .drafter import DraftTree, check_drafter
from .sampling.draw import inverse_transform
from .sampling.pipeline import SamplingConfig
from .decoding.tree_shape import depths, tree_attention_mask
from .tree_verification import greedy_tree, verify_tree


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
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not c >= 0:
        raise ValueError(f"c (drafter step / target step) must be a number >= 0, got {c!r}")
    if isinstance(verify_cost, bool) or not isinstance(verify_cost, (int, float)) or not verify_cost > 0:
        raise ValueError(f"verify_cost must be a number > 0, got {verify_cost!r}")
    for name, value in (("call_overhead", call_overhead), ("step_overhead", step_overhead)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name} (the loop's own work, in target steps) must be a number >= 0, got {value!r}")
    return expected_tokens(alpha, gamma) * (1 + step_overhead) / (gamma * c + verify_cost + call_overhead)


def loop_overhead(result: GenerationResult, step: float, verify_cost, draft_step: float = 0.0) -> float:
    """The loop's own time per target call, in target steps, read from a run's recorded timings:
    what the cost model does not price. That is the run without its prefill, less every pass at
    its measured cost (``step`` seconds for a decode step; ``verify_cost(n)``: a pass over n new
    tokens, in steps) and less the drafter's steps at ``draft_step`` seconds each (its step
    measured apart, c times ``step``), over its calls: choosing and accepting tokens, recording
    log-probabilities, trimming caches, the drafter's own bookkeeping. For ``ll.generate``'s
    result (no drafts) every call is one step over one token. A chain's call passes over its
    drafts and the pending token; a tree's pass sizes are not in its result, so this reads chains
    and plain decoding only. Negative values are possible: passes timed apart can run slower than
    inside the loop."""
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not step > 0:
        raise ValueError(f"step (seconds of a decode step) must be a number > 0, got {step!r}")
    if isinstance(draft_step, bool) or not isinstance(draft_step, (int, float)) or not draft_step >= 0:
        raise ValueError(f"draft_step (seconds of a drafter step) must be a number >= 0, got {draft_step!r}")
    drafted = getattr(result, "drafted", None)
    sizes = [g + 1 for g in drafted] if drafted is not None else [1] * len(result.step_seconds)
    if not sizes:
        raise ValueError("result must have made at least one call after its prefill")
    drafting = max(getattr(result, "drafter_steps", 1) - 1, 0) * draft_step  # its prompt's pass is not a draft step
    loop = result.seconds - result.prefill_seconds - drafting
    return (loop / step - sum(verify_cost(n) for n in sizes)) / len(sizes)


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

    def __call__(self, draft_tokens, q, p, target_logits, config, generator):
        raise NotImplementedError

    def first_token(self, logits: torch.Tensor, config: SamplingConfig, generator=None) -> torch.Tensor:
        return choose(logits, config, generator)

    def tree(self, parents, tokens, q, p, target_logits, config, generator) -> tuple[list[int], torch.Tensor]:
        """One row's tree (``logitlab.tree_verification``'s form: node 0 the pending token, ``q``
        ``[n, V]`` or None, ``p`` ``[n, V]`` or None at T = 0): ``(path, next_token)``."""
        raise ValueError(f"acceptance: {type(self).__name__} cannot verify a tree of drafts")


class RejectionSampling(AcceptanceRule):
    """The acceptance rule of speculative sampling: exact at every temperature, for chains and
    for trees (recursive rejection sampling, ``logitlab.tree_verification``)."""

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
    if (draft_tokens < 0).any() or (draft_tokens >= q.shape[2]).any():
        raise ValueError(f"draft_tokens must be token ids in [0, {q.shape[2]})")
    return batch, g


# --- The loop ----------------------------------------------------------------------------------


@dataclass(kw_only=True)
class SpeculativeResult(GenerationResult):
    """What the speculative loops return: a ``GenerationResult`` (``model_calls`` counts the
    target's passes, the prefill included; ``step_seconds`` holds each call) and the acceptance
    statistics. ``logprobs`` are under the target's processed distribution ``p``."""

    drafter_steps: int = 0  # the drafter's steps (Drafter.steps), its prompt counted as one
    # Per call, per active row: drafts accepted, and drafts examined (see call_counts: only those
    # the output keeps, none after its EOS).
    accepted: list[list[int]] = field(default_factory=list)
    examined: list[list[int]] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)  # per call: drafts proposed per row (g)
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
        calls = self.model_calls - 1  # the prefill is not a verification
        return self.verify_seconds / calls if calls > 0 else 0.0

    def acceptance_counts(self, positions: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """For each draft position i, how many times verification kept it and how many times it
        reached it (all drafts before it kept); counts, so that several runs can be pooled.
        ``positions`` fixes the length (default: the most drafts of any call)."""
        g = max(self.drafted, default=0) if positions is None else positions
        reached, kept = torch.zeros(g, device="cpu"), torch.zeros(g, device="cpu")  # counts: host-side statistics
        for nums, gi in zip(self.accepted, self.drafted):
            for n in nums:
                reached[: min(n + 1, gi)] += 1
                kept[:n] += 1
        return kept, reached

    def acceptance_by_position(self) -> torch.Tensor:
        """For each draft position i, the share of calls that reached it and accepted it."""
        kept, reached = self.acceptance_counts()
        return kept / reached.clamp_min(1)


class Outputs:
    """The new tokens of each row of a speculative loop and their log-probabilities, cut at the
    first end-of-sequence token or at ``max_new_tokens``. Shared by every speculative loop."""

    def __init__(self, rows: int, eos: list[int], max_new_tokens: int):
        self.tokens, self.raw, self.sampled = ([[] for _ in range(rows)] for _ in range(3))
        self.reasons = ["length"] * rows
        self.eos, self.max_new_tokens = set(eos), max_new_tokens

    def add(self, rows: list[int], tokens, logits, p, counts: list[int]) -> None:
        """Row ``rows[i]`` gets ``tokens[i, :counts[i]]``; ``logits`` ``[B, m, V]`` are the target's
        raw logits there and ``p`` its processed probabilities (None at T = 0: log-prob 0)."""
        raw = token_logprobs(logits, tokens)
        sampled = torch.zeros_like(raw) if p is None else torch.log(p.gather(-1, tokens[..., None]).squeeze(-1))
        for r, toks, lr, ls, c in zip(rows, tokens.tolist(), raw.tolist(), sampled.tolist(), counts):
            self.tokens[r] += toks[:c]
            self.raw[r] += lr[:c]
            self.sampled[r] += ls[:c]

    def kept_since(self, rows: list[int], before: list[int]) -> list[int]:
        """How many of the tokens each of ``rows`` got since it held ``before`` tokens survive
        the cut at its first EOS and at ``max_new_tokens``: drafts after the cut are not output,
        so an acceptance rate must not count them."""
        kept = []
        for r, b in zip(rows, before):
            new = self.tokens[r][b:]
            stop = next((i + 1 for i, t in enumerate(new) if t in self.eos), len(new))
            kept.append(max(0, min(stop, self.max_new_tokens - b)))
        return kept

    def finished(self, rows: list[int]) -> list[bool]:
        """Cut each of ``rows`` at its first EOS or at max_new_tokens; which of them are done."""
        done = []
        for r in rows:
            row = self.tokens[r]
            cut = next((i + 1 for i, t in enumerate(row) if t in self.eos), None)
            if cut is not None and cut <= self.max_new_tokens:
                self.reasons[r] = "eos"
            cut = min(cut or len(row), self.max_new_tokens)
            for values in (row, self.raw[r], self.sampled[r]):
                del values[cut:]
            done.append(self.reasons[r] == "eos" or len(row) >= self.max_new_tokens)
        return done

    def result(self, prompts, prompt_index, tokenizer, device, **stats) -> SpeculativeResult:
        new = [torch.tensor(t, dtype=torch.long, device=device) for t in self.tokens]
        return SpeculativeResult(
            sequences=[torch.cat([p, t]) for p, t in zip(prompts, new)], new_tokens=new,
            logprobs=[torch.tensor(v, device=device) for v in self.sampled],
            raw_logprobs=[torch.tensor(v, device=device) for v in self.raw],
            finish_reasons=self.reasons, texts=decode_texts(tokenizer, new), prompt_index=prompt_index, **stats)


class _Target:
    """The target's side of the loop: its KV cache and attention mask, one row per active
    sequence, and the hidden states a drafter may read."""

    def __init__(self, target, drafter):
        self.model, self.drafter = target, drafter
        self.hidden, self.layers = drafter.reads_hidden_state, drafter.feature_layers
        if self.hidden:
            check_body_and_head(target)

    def prefill(self, ids, mask) -> torch.Tensor:
        """The prompts' pass; returns the logits of the first new token ``[B, V]``."""
        positions = (mask.cumsum(dim=-1) - 1).clamp_min(0)
        step = forward(self.model, input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1,
                       hidden=self.hidden, layers=self.layers)
        self.cache, self.mask = step.cache, mask
        self.drafter.start(ids, mask, self.model, self.cache)
        if self.hidden:
            self.drafter.observe(step.hidden[:, -1])
            self.drafter.observe_states(step.hidden, ids, mask)
        return step.logits[:, -1]

    def score(self, pending, drafts) -> torch.Tensor:
        """One pass over the pending token and the drafts: the logits ``[B, g + 1, V]``."""
        g = drafts.shape[1]
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(drafts), g + 1)], dim=1)
        positions = (self.mask.cumsum(dim=-1) - 1)[:, -(g + 1):]
        self.fed = torch.cat([pending[:, None], drafts], dim=1)
        step = forward(self.model, input_ids=self.fed, attention_mask=self.mask, position_ids=positions,
                       cache=self.cache, hidden=self.hidden, layers=self.layers)
        self.cache, self.states = step.cache, step.hidden
        return step.logits

    def score_tree(self, tokens: torch.Tensor, rows: list[list[int]]) -> torch.Tensor:
        """One pass over each row's tree (``tokens`` ``[B, n]``, the pending token as node 0, and
        the rows' parents), each node seeing its ancestors only: the logits ``[B, n, V]``."""
        device = tokens.device
        shapes = {tuple(parents): (tree_attention_mask(parents), depths(parents)) for parents in map(tuple, rows)}
        allowed = torch.stack([shapes[tuple(parents)][0] for parents in rows]).to(device)
        depth = torch.tensor([shapes[tuple(parents)][1] for parents in rows], device=device)  # the root: 1
        positions = self.mask.sum(dim=-1, keepdim=True) + depth - 1
        step = tree_forward(self.model, self.cache, self.mask, allowed, positions, tokens, hidden=self.hidden,
                            layers=self.layers)
        self.mask = torch.cat([self.mask, self.mask.new_ones(tokens.shape)], dim=1)
        self.cache, self.states, self.fed = step.cache, step.hidden, tokens
        return step.logits

    def keep_paths(self, fed: int, index: torch.Tensor, counts: torch.Tensor) -> None:
        """After a tree pass over ``fed`` nodes, row b keeps ``index[b, :counts[b]]`` (its path,
        root first): moved to the front of the block, the other nodes dropped."""
        self.mask = keep_in_block(self.cache, self.mask, fed, index, counts)
        if self.hidden:
            self.show_drafter(index, counts)

    def show_drafter(self, index: torch.Tensor, counts: torch.Tensor) -> None:
        """Hand the drafter the states of the positions row b kept, ``index[b, :counts[b]]`` of the
        last pass: the last one (``observe``: where the next token was predicted) and all of them."""
        states = self.states.gather(1, index[..., None].expand(-1, -1, self.states.shape[-1]))
        rows = torch.arange(len(counts), device=counts.device)
        self.drafter.observe(states[rows, counts - 1])
        kept = torch.arange(index.shape[1], device=counts.device)[None] < counts[:, None]
        self.drafter.observe_states(states, self.fed.gather(1, index), kept.long())

    def rollback(self, num: torch.Tensor, g: int) -> None:
        """The cache holds the pending token and all g drafts: rejected drafts are masked out, like
        left padding (rows keep different numbers), and cropped where no row keeps them."""
        self.mask = roll_back(self.cache, self.mask, g, num)
        if self.hidden:  # the pending token and the kept drafts: the first num + 1 positions
            index = torch.arange(g + 1, device=num.device).expand(len(num), -1)
            self.show_drafter(index, num + 1)

    def select_rows(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.mask = self.mask[keep]
        self.drafter.select_rows(keep)


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
    acceptance: AcceptanceRule | None = None,
    num_return_sequences: int = 1,
    eos_token_id=None,
    tokenizer=None,
    attention_mask: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    constraint=None,
) -> SpeculativeResult:
    """Generate with speculative sampling: ``drafter`` proposes ``gamma`` tokens, ``target`` verifies.

    ``drafter`` is a ``logitlab.drafter.Drafter``: ``ll.drafters.DraftModelDrafter(model)`` for a
    small language model with the target's tokenizer, or any other drafter of the book.
    ``acceptance`` is the rule (default ``RejectionSampling()``, which at temperature 0 is greedy
    matching). The output follows the target's distribution after temperature and truncation,
    exactly, for any drafter. Prompts as in ``ll.generate``; rows of a batch advance independently.
    ``constraint`` (a ``logitlab.Constraint``, or one per prompt) masks the target at every
    position as ``ll.generate`` does, so the output follows the *masked* target exactly; drafters
    that sample token by token (a draft model, EAGLE's chain) draft under the same mask. A tree's
    nodes are each masked in the state after their own path (a forbidden node is rejected).
    """
    config = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p)
    gamma = check_gamma(gamma)
    max_new_tokens, _, n = check_counts(max_new_tokens, 0, num_return_sequences)
    check_model(target, "target")
    drafter = check_drafter(drafter, vocab_size(target))
    acceptance = check_rule(acceptance)
    eos = eos_ids(eos_token_id, target)
    device = model_device(target)
    check_generator(generator, device)
    ids, mask = prompt_batch(input_ids, attention_mask, tokenizer, target)
    constraints = constraint_rows(constraint, len(ids), n, max_new_tokens)
    ids, mask = ids.repeat_interleave(n, dim=0), mask.repeat_interleave(n, dim=0)
    began, out, side = now(device), Outputs(len(ids), eos, max_new_tokens), _Target(target, drafter)
    stats = dict(model_calls=1, accepted=[], examined=[], drafted=[], draft_seconds=0.0, verify_seconds=0.0,
                 step_seconds=[])

    pending = _first_token(side, acceptance, ids, mask, config, generator, out, look_ahead(out, constraints))
    active = list(range(len(ids)))
    stats["prefill_seconds"] = now(device) - began
    while True:
        done = out.finished(active)
        if any(done):
            keep = [i for i, d in enumerate(done) if not d]
            if not keep:
                break
            keep_t = torch.tensor(keep, device=device)
            side.select_rows(keep_t)
            active, pending = [active[i] for i in keep], pending[keep_t]
        left = max(max_new_tokens - len(out.tokens[r]) for r in active)  # no more than any row needs
        pending = _call(side, drafter, acceptance, pending, min(gamma, left), config, generator, out, active, stats,
                        look_ahead(out, constraints, active))
    prompts = [row[m.bool()] for row, m in zip(ids, mask)]
    return out.result(prompts, [r // n for r in range(len(ids))], tokenizer, device, seconds=now(device) - began,
                      drafter_steps=drafter.steps, **stats)


def look_ahead(out: "Outputs", constraints, rows=None) -> LookAhead | None:
    """Each row's automaton state after the tokens it has kept (None without a constraint)."""
    if constraints is None:
        return None
    rows = range(len(out.tokens)) if rows is None else rows
    states = []
    for r in rows:
        state = 0
        for token in out.tokens[r] if constraints[r] is not None else ():
            state = constraints[r].next_state(state, token)
        states.append(state)
    return LookAhead([constraints[r] for r in rows], states, [out.max_new_tokens - len(out.tokens[r]) for r in rows])


def _first_token(side, acceptance, ids, mask, config, generator, out, look) -> torch.Tensor:
    """The prefill: the first token is the target's choice after an empty prefix, exactly as in
    ``ll.generate``. It is recorded in ``out`` and returned as every row's pending token."""
    logits = side.prefill(ids, mask)
    if look is not None:
        logits = look.mask(logits)
    pending = acceptance.first_token(logits, config, generator)
    p = target_probs(logits[:, None], config)
    out.add(list(range(len(ids))), pending[:, None], logits[:, None], p, [1] * len(ids))
    return pending


def _call(side, drafter, acceptance, pending, gamma, config, generator, out, active, stats, look) -> torch.Tensor:
    """One call of the loop: draft, verify in one target pass, keep a prefix, roll back.
    Returns each row's new pending token."""
    device, before = pending.device, [len(out.tokens[r]) for r in active]
    t0 = now(device)
    drafter.constraint = None if look is None else look.copy()
    proposal = drafter.propose(pending, gamma, config, generator)
    t1 = now(device)
    if isinstance(proposal, DraftTree):
        num, nxt = _tree_call(side, acceptance, pending, proposal, config, generator, out, active, look)
        g = proposal.depth
    else:
        drafts, q = proposal
        logits = side.score(pending, drafts)  # [B, g + 1, V]
        g = drafts.shape[1]
        if look is not None:
            logits = _masked_positions(look, logits, drafts)
        p = target_probs(logits, config)
        if g == 0:  # nothing proposed: the call gives the target's own token
            num = torch.zeros(len(pending), dtype=torch.long, device=device)
            nxt = acceptance.first_token(logits[:, 0], config, generator)
        else:
            num, nxt = acceptance(drafts, q, p, logits, config, generator)
        # The kept drafts, then the next token at position num: what each row emits, num + 1 tokens.
        emitted = torch.cat([drafts, nxt[:, None]], dim=1).scatter(1, num[:, None], nxt[:, None])
        out.add(active, emitted, logits, p, (num + 1).tolist())
        side.rollback(num, g)
    drafter.rollback(num)
    t2 = now(device)
    stats["model_calls"] += 1
    counts = [call_counts(n, k, g) for n, k in zip(num.tolist(), out.kept_since(active, before))]
    stats["accepted"].append([a for a, _ in counts])
    stats["examined"].append([e for _, e in counts])
    stats["drafted"].append(g)
    stats["draft_seconds"] += t1 - t0
    stats["verify_seconds"] += t2 - t1
    stats["step_seconds"].append(t2 - t0)
    return nxt


def _masked_positions(look, logits, drafts) -> torch.Tensor:
    """The target's logits ``[B, g + 1, V]``, position i masked in the state after the first i
    drafts (a draft the constraint forbids leaves only EOS after it, and is itself rejected)."""
    masked = []
    for i in range(logits.shape[1]):
        if i > 0:
            look.advance(drafts[:, i - 1])
        masked.append(look.mask(logits[:, i]))
    return torch.stack(masked, dim=1)


def _tree_call(side, acceptance, pending, tree, config, generator, out, active, look):
    """The verification of a ``DraftTree``: one target pass over every row's tree, each row's path
    chosen by ``acceptance.tree``, the cache compacted to the paths. Returns ``(num, next)``.
    Under a constraint (``look``), the target after each node is masked in the state after that
    node's own path, as the chain masks each position: a node the constraint forbids has
    probability 0 under its parent's ``p``, so it is always rejected."""
    rows = tree.rows()
    tokens = torch.cat([pending[:, None], tree.tokens], dim=1)  # [B, n + 1]: the root first
    logits = side.score_tree(tokens, rows)  # [B, n + 1, V]: the target after each node
    if look is not None:
        logits = look.tree(tokens, rows).mask(logits.flatten(0, 1)).view_as(logits)
    p = target_probs(logits, config)
    q = None if tree.q is None else torch.cat([tree.q[:, :1], tree.q], dim=1)  # the root's row is not used
    paths, nxt = [], []
    for b, parents in enumerate(rows):
        path, token = acceptance.tree(parents, tokens[b], None if q is None else q[b], None if p is None else p[b],
                                      logits[b], config, generator)
        paths.append(path)
        nxt.append(token.reshape(()))
    nxt, counts = torch.stack(nxt), torch.tensor([len(path) for path in paths], device=pending.device)
    width = int(counts.max())
    index = torch.tensor([path + [path[-1]] * (width - len(path)) for path in paths], device=pending.device)
    # Each row emits its path's drafts and then the next token: len(path) tokens.
    emitted = torch.cat([tokens.gather(1, index)[:, 1:], nxt[:, None]], dim=1).scatter(1, counts[:, None] - 1,
                                                                                          nxt[:, None])
    on_path = index[..., None].expand(-1, -1, logits.shape[-1])
    out.add(active, emitted, logits.gather(1, on_path), None if p is None else p.gather(1, on_path), counts.tolist())
    side.keep_paths(tokens.shape[1], index, counts)
    return counts - 1, nxt


def check_gamma(gamma) -> int:
    """Tokens drafted per call: an integer >= 1 (numpy integers are fine)."""
    if isinstance(gamma, bool) or not isinstance(gamma, numbers.Integral) or gamma < 1:
        raise ValueError(f"gamma must be an integer >= 1 (tokens drafted per call), got {gamma!r}")
    return int(gamma)


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
