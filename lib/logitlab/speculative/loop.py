"""Speculative sampling: a cheap drafter proposes, the target verifies, and nothing changes.

Chapter 6 ("Speculative sampling") explains this module; the proof that the output
distribution is exactly the target's is in the book's proofs page.

One *call* of the loop:

1. The drafter proposes ``gamma`` tokens ``d_1 .. d_gamma`` and the probabilities ``q_i`` it
   drew them from (``logitlab.speculative.draft_model``).
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

The theory (``acceptance_rate``, ``expected_tokens``, ``speedup``) is in ``theory``, the
verification rules in ``verify``, what the loop returns in ``result``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import (
    bad_logits,
    check_body_and_head,
    check_counts,
    check_generator,
    check_int,
    check_logits,
    check_model,
    check_processors,
    trusted,
    vocab_size,
)
from ..constrained.constraint import DraftStates, constraint_rows
from ..decoding.cache import keep_in_block, roll_back
from ..decoding.passes import forward, mask_positions, prefill, tree_forward
from ..decoding.prompts import eos_ids, prompt_batch
from ..decoding.tree_shape import depths, tree_attention_mask
from ..devices import model_device, now
from ..sampling.pipeline import SamplingConfig, target_probs
from .acceptance import AcceptanceRule, check_rule, read_kept
from .drafter import Drafter, DraftTree, check_drafter
from .result import CallLog, Outputs, SpeculativeResult
from .theory import call_counts


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
        step = prefill(self.model, ids, mask, hidden=self.hidden, layers=self.layers)
        self.cache, self.mask = step.cache, mask
        self.drafter.start(ids, mask, self.model, self.cache)
        if self.hidden:
            self.drafter.observe(step.hidden[:, -1])
            self.drafter.observe_states(step.hidden, ids, mask)
        if self.drafter.reads_logits:
            self.drafter.observe_logits(ids[:, -1:], step.logits[:, -1:])
        return step.logits[:, -1]

    def score(self, pending, drafts) -> torch.Tensor:
        """One pass over the pending token and the drafts: the logits ``[B, g + 1, V]``."""
        g = drafts.shape[1]
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(drafts), g + 1)], dim=1)
        positions = mask_positions(self.mask, last=g + 1)
        self.fed = torch.cat([pending[:, None], drafts], dim=1)
        step = forward(self.model, input_ids=self.fed, attention_mask=self.mask, position_ids=positions,
                       cache=self.cache, hidden=self.hidden, layers=self.layers)
        self.cache, self.states = step.cache, step.hidden
        if self.drafter.reads_logits:
            self.drafter.observe_logits(self.fed, step.logits)
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
        if self.drafter.reads_logits:
            self.drafter.observe_logits(tokens, step.logits)
        return step.logits

    def keep_paths(self, fed: int, index: torch.Tensor, counts: torch.Tensor, longest: int) -> None:
        """After a tree pass over ``fed`` nodes, row b keeps ``index[b, :counts[b]]`` (its path,
        root first): moved to the front of the block, the other nodes dropped (``longest``:
        ``max(counts)``, known on the host)."""
        self.mask = keep_in_block(self.cache, self.mask, fed, index, counts, longest)
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

    def rollback(self, num: torch.Tensor, g: int, longest: int) -> None:
        """The cache holds the pending token and all g drafts: rejected drafts are masked out, like
        left padding (rows keep different numbers), and cropped where no row keeps them
        (``longest``: ``max(num)``, read already)."""
        self.mask = roll_back(self.cache, self.mask, g, num, longest)
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
    logits_processor=None,
) -> SpeculativeResult:
    """Generate with speculative sampling: ``drafter`` proposes ``gamma`` tokens, ``target`` verifies.

    ``drafter`` is a ``logitlab.speculative.drafter.Drafter``: ``ll.speculative.draft_model.DraftModelDrafter(model)`` for a
    small language model with the target's tokenizer, or any other drafter of the book.
    ``acceptance`` is the rule (default ``RejectionSampling()``, which at temperature 0 is greedy
    matching). The output follows the target's distribution after temperature and truncation,
    exactly, for any drafter. Prompts as in ``ll.generate``; rows of a batch advance independently.
    ``constraint`` (a ``logitlab.Constraint``, or one per prompt) masks the target at every
    position as ``ll.generate`` does, so the output follows the *masked* target exactly; drafters
    that sample token by token (a draft model, EAGLE's chain) draft under the same mask. A tree's
    nodes are each masked in the state after their own path (a forbidden node is rejected).
    ``logits_processor`` (processors as in ``ll.generate``, e.g. a watermark of
    ``logitlab.watermark``) changes the target at every position of a chain, each called with the
    row's text up to that position: the output follows the *processed* target exactly.
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
    prompts = [row[m.bool()] for row, m in zip(ids, mask)]
    began, out = now(device), Outputs(len(ids), eos, max_new_tokens)
    run = _Run(_Target(target, drafter), drafter, acceptance, config, generator, out, CallLog(),
               check_processors(logits_processor), [row.tolist() for row in prompts])
    pending = _first_token(run, ids, mask, draft_states(out, constraints))
    active = list(range(len(ids)))
    run.log.prefill_seconds = now(device) - began
    while True:
        done = out.finished(active)
        if any(done):
            keep = [i for i, d in enumerate(done) if not d]
            if not keep:
                break
            keep_t = torch.tensor(keep, device=device)
            run.side.select_rows(keep_t)
            active, pending = [active[i] for i in keep], pending[keep_t]
        left = max(max_new_tokens - len(out.tokens[r]) for r in active)  # no more than any row needs
        with trusted():  # the target's logits are checked once per call, in `_call`'s read of the counts
            pending = _call(run, pending, min(gamma, left), active, draft_states(out, constraints, active))
    return out.result(prompts, [r // n for r in range(len(ids))], tokenizer, device, run.log,
                      seconds=now(device) - began, drafter_steps=drafter.steps)


def draft_states(out: "Outputs", constraints, rows=None) -> DraftStates | None:
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
    return DraftStates([constraints[r] for r in rows], states, [out.max_new_tokens - len(out.tokens[r]) for r in rows])


@dataclass
class _Run:
    """What every call of one ``speculative_generate`` shares."""

    side: _Target
    drafter: Drafter
    acceptance: AcceptanceRule
    config: SamplingConfig
    generator: torch.Generator | None
    out: Outputs
    log: CallLog
    processors: list
    prompts: list[list[int]]

    def text(self, active: list[int]) -> torch.Tensor | None:
        """Each active row's text so far, prompt first (left-padded with -1, as ``ll.generate``
        hands its processors), when a processor, the drafter or the rule reads it; else None."""
        if not (self.processors or self.drafter.reads_text or self.acceptance.reads_text):
            return None
        rows = [self.prompts[r] + self.out.tokens[r] for r in active]
        width = max(map(len, rows))
        device = model_device(self.side.model)
        text = torch.tensor([[-1] * (width - len(row)) + row for row in rows], dtype=torch.long, device=device)
        self.drafter.text = self.acceptance.text = text
        return text


def _first_token(run, ids, mask, look) -> torch.Tensor:
    """The prefill: the first token is the target's choice after an empty prefix, exactly as in
    ``ll.generate``. It is recorded in ``out`` and returned as every row's pending token."""
    raw = logits = run.side.prefill(ids, mask)
    text = run.text(list(range(len(ids))))
    if look is not None or run.processors:
        logits = _processed_positions(run, look, raw[:, None], None, text)[:, 0]
    pending = run.acceptance.first_token(logits, run.config, run.generator)
    p = target_probs(logits[:, None], run.config)
    run.out.add(list(range(len(ids))), pending[:, None], raw[:, None], p, [1] * len(ids))
    return pending


def _call(run, pending, gamma, active, look) -> torch.Tensor:
    """One call of the loop: draft, verify in one target pass, keep a prefix, roll back.
    Returns each row's new pending token."""
    side, drafter, acceptance, config, generator, out = (run.side, run.drafter, run.acceptance, run.config,
                                                          run.generator, run.out)
    device, before = pending.device, [len(out.tokens[r]) for r in active]
    t0 = now(device)
    text = run.text(active)
    drafter.constraint = None if look is None else look.copy()
    proposal = drafter.propose(pending, gamma, config, generator)
    t1 = now(device)
    if isinstance(proposal, DraftTree):
        num, nxt, kept = _tree_call(run, pending, proposal, active, look)
        g, fed = proposal.depth, proposal.tokens.shape[1] + 1
    else:
        drafts, q = proposal
        raw = logits = side.score(pending, drafts)  # [B, g + 1, V]
        g = drafts.shape[1]
        fed = g + 1
        if look is not None or run.processors:
            logits = _processed_positions(run, look, raw, drafts, text)
        p = target_probs(logits, config)
        if g == 0:  # nothing proposed: the call gives the target's own token
            num = torch.zeros(len(pending), dtype=torch.long, device=device)
            nxt = acceptance.first_token(logits[:, 0], config, generator)
        else:
            num, nxt = acceptance(drafts, q, p, logits, config, generator)
        kept = read_kept(num, logits, q)
        # The kept drafts, then the next token at position num: what each row emits, num + 1 tokens.
        emitted = torch.cat([drafts, nxt[:, None]], dim=1).scatter(1, num[:, None], nxt[:, None])
        out.add(active, emitted, raw, p, [k + 1 for k in kept])  # raw: log-probs under the model's own
        side.rollback(num, g, max(kept))
    drafter.rollback(num, kept)
    t2 = now(device)
    run.log.record([call_counts(n, k, g) for n, k in zip(kept, out.kept_since(active, before))], g, t0, t1, t2, fed)
    return nxt


def _processed_positions(run, look, logits, drafts, text) -> torch.Tensor:
    """The target's logits ``[B, g + 1, V]`` as ``ll.generate`` would see them after the text and
    the first i drafts at position i: masked in the constraint's state there (a draft the
    constraint forbids leaves only EOS after it, and is itself rejected), then each processor
    called with that text."""
    processed = []
    for i in range(logits.shape[1]):
        step = logits[:, i]
        if look is not None:
            if i > 0:
                look.advance(drafts[:, i - 1])
            step = look.mask(step)
        for processor in run.processors:
            step = processor(text if i == 0 else torch.cat([text, drafts[:, :i]], dim=1), step)
        processed.append(step)
    return torch.stack(processed, dim=1)


def _tree_call(run, pending, tree, active, look):
    """The verification of a ``DraftTree``: one target pass over every row's tree, each row's path
    chosen by ``acceptance.tree``, the cache compacted to the paths. Returns ``(num, next, kept)``
    (``kept``: ``num`` as a list, known on the host).
    Under a constraint (``look``), the target after each node is masked in the state after that
    node's own path, as the chain masks each position: a node the constraint forbids has
    probability 0 under its parent's ``p``, so it is always rejected."""
    side, acceptance, config, generator, out = run.side, run.acceptance, run.config, run.generator, run.out
    if run.processors:
        raise ValueError("logits_processor: a tree of drafts cannot be verified under processors yet; "
                         "use a drafter that proposes a chain")
    rows = tree.rows()
    tokens = torch.cat([pending[:, None], tree.tokens], dim=1)  # [B, n + 1]: the root first
    raw = logits = side.score_tree(tokens, rows)  # [B, n + 1, V]: the target after each node
    if bool(bad_logits(logits)):  # the tree's rules below trust them
        check_logits(logits, "the target's logits")
    if look is not None:
        logits = look.tree(tokens, rows).mask(raw.flatten(0, 1)).view_as(raw)
    p = target_probs(logits, config)
    q = None if tree.q is None else torch.cat([tree.q[:, :1], tree.q], dim=1)  # the root's row is not used
    paths, nxt = [], []
    for b, parents in enumerate(rows):
        path, token = acceptance.tree(parents, tokens[b], None if q is None else q[b], None if p is None else p[b],
                                      logits[b], config, generator)
        paths.append(path)
        nxt.append(token.reshape(()))
    run.drafter.kept_path(paths)
    lengths = [len(path) for path in paths]
    nxt, counts = torch.stack(nxt), torch.tensor(lengths, device=pending.device)
    width = max(lengths)
    index = torch.tensor([path + [path[-1]] * (width - len(path)) for path in paths], device=pending.device)
    # Each row emits its path's drafts and then the next token: len(path) tokens.
    emitted = torch.cat([tokens.gather(1, index)[:, 1:], nxt[:, None]], dim=1).scatter(1, counts[:, None] - 1,
                                                                                          nxt[:, None])
    on_path = index[..., None].expand(-1, -1, logits.shape[-1])
    out.add(active, emitted, raw.gather(1, on_path), None if p is None else p.gather(1, on_path), lengths)
    side.keep_paths(tokens.shape[1], index, counts, width)
    return counts - 1, nxt, [n - 1 for n in lengths]


def check_gamma(gamma) -> int:
    """Tokens drafted per call: an integer >= 1 (numpy integers are fine)."""
    return check_int(gamma, "gamma", 1, "an integer >= 1 (tokens drafted per call)")
