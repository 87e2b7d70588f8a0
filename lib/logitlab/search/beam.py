"""Beam search: keep the ``num_beams`` most likely partial sequences instead of one.

Chapter 4 ("Beam search") explains this module.

Greedy decoding commits to the most likely token at every step. Beam search keeps ``num_beams``
candidate sequences (the *beams*) and, at every step, extends each by every token of the
vocabulary, then keeps the ``num_beams`` extensions with the highest total log-probability.
A sequence that ends (on an end-of-sequence token, or at ``max_new_tokens``) becomes a
*finished hypothesis*, scored by its total log-probability divided by
``length ** length_penalty`` (``length`` counts the new tokens, the end-of-sequence token
included). The result is the best finished hypotheses, best first.

The details follow Hugging Face's ``generate(num_beams=...)`` exactly, so that both return the
same sequences with the same scores:

* at each step the ``2 * num_beams`` best extensions are looked at (more with several EOS ids),
  so that ``num_beams`` beams can continue even if some of the best extensions end;
* an extension that ends is a finished hypothesis only if it ranks among the ``num_beams`` best
  extensions of that step; the finished store keeps the ``num_beams`` best hypotheses;
* the search stops when every sequence has reached ``max_new_tokens``, or once the store is full
  and (``early_stopping=False``) the best running beam, scored at its current length, can no
  longer beat the worst stored hypothesis, or (``early_stopping=True``) as soon as the store is
  full. ``early_stopping="never"`` estimates the best running score at ``max_new_tokens`` when
  ``length_penalty > 0`` (longer can only score higher then).

All beams of a prompt share one prefill: the prompt's KV cache is computed once and copied
``num_beams`` times. After each step the cache rows are reordered to follow the beams that
were kept (a beam can take over another beam's row, or two beams can descend from one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .._validate import (bad_logits, check_counts, check_int, check_logits, check_model, check_number, check_processors,
                         trusted)
from ..constrained.constraint import constraint_rows, mask_rows
from ..decoding.passes import forward, prefill
from ..decoding.prompts import eos_ids, prompt_batch
from ..devices import model_device, now

NEG = -1.0e9  # the score that marks an empty or forbidden slot, as in Hugging Face


@dataclass
class Hypothesis:
    """A finished sequence of beam search."""

    tokens: torch.Tensor  # the new tokens, ending with the EOS token if it ended on one
    score: float  # logprob / len(tokens) ** length_penalty
    logprob: float  # the sum of the tokens' log-probabilities under the model
    finish_reason: str  # "eos" or "length"
    text: str | None = None


@dataclass
class BeamStep:
    """The beams after one step, for looking at how the search grows (``result.history``)."""

    beams: torch.Tensor  # [batch, num_beams, step + 1] the running beams' new tokens (at the
    #                      last step, when every extension ends: the num_beams best extensions)
    scores: torch.Tensor  # [batch, num_beams] their total log-probabilities
    parents: torch.Tensor  # [batch, num_beams] which beam of the previous step each extends
    finished: list[list[tuple[torch.Tensor, float]]]  # per prompt: (tokens, score) stored this step


@dataclass
class BeamSearchResult:
    """What ``beam_search`` returns: ``hypotheses[b]`` are prompt ``b``'s best, best first."""

    hypotheses: list[list[Hypothesis]]
    prompts: list[torch.Tensor]  # each prompt without padding
    history: list[BeamStep] = field(default_factory=list)
    model_calls: int = 0
    prefill_seconds: float = 0.0
    step_seconds: list[float] = field(default_factory=list)

    @property
    def sequences(self) -> list[torch.Tensor]:
        """Prompt + new tokens of every returned hypothesis, prompt by prompt, best first."""
        return [torch.cat([p, h.tokens]) for p, hyps in zip(self.prompts, self.hypotheses) for h in hyps]

    @property
    def scores(self) -> torch.Tensor:
        """The scores of ``sequences``, in the same order."""
        return torch.tensor([h.score for hyps in self.hypotheses for h in hyps], device="cpu")

    @property
    def best(self) -> list[Hypothesis]:
        """The best hypothesis of each prompt."""
        return [hyps[0] for hyps in self.hypotheses]


@torch.inference_mode()
def beam_search(
    model,
    input_ids,
    *,
    num_beams: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    eos_token_id=None,
    num_return_sequences: int = 1,
    tokenizer=None,
    attention_mask: torch.Tensor | None = None,
    constraint=None,
    logits_processor=None,
) -> BeamSearchResult:
    """Beam search with ``num_beams`` beams for up to ``max_new_tokens`` new tokens.

    ``input_ids`` is given as to ``ll.generate``: a LongTensor ``[batch, seq]`` (left-padded with
    ``attention_mask``), a list of token-id lists, or text with ``tokenizer``. ``eos_token_id``
    is an id or a list of ids; ``None`` takes the model's ``generation_config`` (``[]`` for none).
    Returns the ``num_return_sequences`` best finished hypotheses of each prompt (fewer when fewer
    sequences are possible). ``constraint`` (a ``logitlab.Constraint``, or one per prompt) keeps
    every beam on its pattern: the tokens it forbids score as impossible. ``logits_processor``: a
    list of processors, called as in Hugging Face's beam search on each beam's tokens (padding -1)
    and next-token log-probabilities.
    """
    check_model(model)
    num_beams, max_new_tokens, length_penalty, num_return_sequences = _check_arguments(
        num_beams, max_new_tokens, length_penalty, early_stopping, num_return_sequences)
    eos = eos_ids(eos_token_id, model)
    device = model_device(model)
    ids, mask = prompt_batch(input_ids, attention_mask, tokenizer, model)
    nb = num_beams

    # Prefill each prompt once, then give each of its beams a copy of the cache.
    start = now(device)
    step = prefill(model, ids, mask)
    cache = step.cache
    cache.batch_repeat_interleave(nb)
    logits = step.logits[:, -1].repeat_interleave(nb, dim=0)  # [batch * nb, vocab]
    mask = mask.repeat_interleave(nb, dim=0)
    beams = _Beams(ids.shape[0], nb, logits.shape[-1], eos, length_penalty, early_stopping, max_new_tokens, device)
    constraints = constraint_rows(constraint, ids.shape[0], nb, max_new_tokens)
    beams.use(check_processors(logits_processor), ids.repeat_interleave(nb, 0).masked_fill(mask == 0, -1))
    prefill_seconds, steps = now(device) - start, []

    for index in range(max_new_tokens):
        start = now(device)
        last = index == max_new_tokens - 1
        forbidden = beams.forbidden(logits, constraints, max_new_tokens - index) if constraints else None
        if beams.extend(logits, last, forbidden) or last:
            steps.append(now(device) - start)
            break
        if constraints:
            beams.follow(constraints)
        # Feed each beam's last token, with the cache rows following the beams they extend.
        cache.batch_select_indices(beams.cache_rows())
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        step = forward(model, input_ids=beams.running[:, :, -1].reshape(-1, 1), attention_mask=mask, cache=cache,
                       position_ids=mask.sum(dim=-1, keepdim=True) - 1, logits_to_keep=1)
        cache, logits = step.cache, step.logits[:, -1]
        steps.append(now(device) - start)
    prompts = [row[m.bool()] for row, m in zip(ids, mask[::nb, : ids.shape[1]])]
    return BeamSearchResult(beams.hypotheses(num_return_sequences, tokenizer), prompts, beams.history,
                            len(steps), prefill_seconds, steps)


class _Beams:
    """The running beams of every prompt, their scores, and the store of finished hypotheses.

    Token buffers grow by one column per step (no buffer of ``max_new_tokens`` columns up front).
    """

    def __init__(self, batch, nb, vocab, eos, length_penalty, early_stopping, max_new_tokens, device):
        self.nb, self.eos, self.length_penalty, self.early_stopping = nb, eos, length_penalty, early_stopping
        self.max_new_tokens = max_new_tokens
        # Only beam 0 starts "alive" (score 0): the others start at NEG, so that the first step
        # does not pick the same extension once per (identical) beam.
        self.running = torch.full((batch, nb, 0), -1, dtype=torch.long, device=device)
        self.scores = torch.zeros(batch, nb, device=device)
        self.scores[:, 1:] = NEG
        # The store of finished hypotheses: the nb best so far per prompt (NEG = empty slot).
        self.stored = self.running.clone()
        self.stored_scores = torch.full((batch, nb), NEG, device=device)
        self.stored_full = torch.zeros(batch, nb, dtype=torch.bool, device=device)  # slot holds a hypothesis
        self.can_improve = torch.ones(batch, 1, dtype=torch.bool, device=device)
        # Extensions looked at per step (never more than there are: nb beams x vocab tokens).
        self.keep = min(max(2, 1 + len(eos)) * nb, nb * vocab)
        self.in_top_nb = torch.arange(self.keep, device=device) < nb
        self.eos_tensor = torch.tensor(eos, dtype=torch.long, device=device)
        self.rows = torch.arange(batch, device=device)[:, None]
        self.history = []
        self.automaton = [[0] * nb for _ in range(batch)]  # each beam's constraint state (host-side ints)
        self.processors, self.prompts = [], None  # see use()

    def forbidden(self, logits, constraints, tokens_left: int) -> torch.Tensor:
        """``[batch * nb, vocab]``: the tokens each beam's constraint forbids in its state."""
        allowed = mask_rows(constraints, [s for row in self.automaton for s in row], torch.zeros_like(logits),
                            tokens_left)
        return torch.isinf(allowed)

    def follow(self, constraints) -> None:
        """Each new beam's automaton state: its parent's, moved by its last token (-1, off the
        pattern, for the impossible beams that only fill empty slots)."""
        tokens, parents = torch.stack([self.running[:, :, -1], self.parents]).tolist()  # one read
        self.automaton = [[constraints[b * self.nb].next_state(old[parents[b][i]], tokens[b][i])
                           if constraints[b * self.nb] is not None else 0 for i in range(self.nb)]
                          for b, old in enumerate(self.automaton)]

    def use(self, processors: list, prompts: torch.Tensor) -> None:
        """Apply ``processors`` at every step; ``prompts`` holds every beam's prompt (padding -1)."""
        self.processors, self.prompts = processors, prompts

    def process(self, logprobs) -> torch.Tensor:
        """The log-probabilities after each processor, given every beam's tokens so far (a token
        a processor removed, at -inf, becomes impossible, as a forbidden one)."""
        tokens = torch.cat([self.prompts, self.running.reshape(self.prompts.shape[0], -1)], dim=1)
        for processor in self.processors:
            logprobs = processor(tokens, logprobs)
        return logprobs.masked_fill(logprobs.isneginf(), NEG)

    def extend(self, logits, last: bool, forbidden=None) -> bool:
        """One step: extend every beam by every token (its log-probability, after the processors),
        keep the nb best running beams, store the extensions that ended. Returns whether the
        search is over."""
        rows, nb, batch = self.rows, self.nb, self.rows.shape[0]
        step = self.running.shape[2]  # tokens in every running beam before this step
        # 1. Score every extension of every beam: beam score + the token's log-probability.
        vocab = logits.shape[-1]
        logprobs = torch.log_softmax(logits, dim=-1)
        if self.processors:
            with trusted():  # the model's logits are checked once, in the step's one read below
                logprobs = self.process(logprobs)
        if forbidden is not None:  # impossible, like the empty slots: never a hypothesis
            logprobs = logprobs.masked_fill(forbidden, NEG)
        logprobs = logprobs.view(batch, nb, vocab)
        totals = (logprobs + self.scores[:, :, None]).view(batch, nb * vocab)
        top_scores, top_index = totals.topk(self.keep)  # [batch, keep], best first
        parent, token = top_index // vocab, top_index % vocab
        candidates = torch.cat([self.running[rows, parent], token[..., None]], dim=2)
        ends = torch.isin(token, self.eos_tensor) | last

        # 2. The nb best extensions that did not end are the next beams.
        alive_scores = top_scores + ends.float() * NEG
        chosen = alive_scores.topk(nb).indices
        self.running, self.scores = candidates[rows, chosen], alive_scores[rows, chosen]
        self.parents = parent[rows, chosen]
        merged = self._store(candidates, top_scores, ends, step + 1)
        fresh = (merged >= nb) & (self.stored_scores > NEG / 2)  # the hypotheses stored this step
        # The step's one host read: whether it ended, whether anything was stored, and whether
        # the model's logits were valid (a model that returns NaN must not rank beams).
        all_end, over, stored, invalid = torch.stack(
            [ends.all(), self._over(step + 1), fresh.any(), bad_logits(logits)]).tolist()
        if invalid:
            check_logits(logits, "the model's logits")  # raises, saying what is wrong
        # When every extension ends (the last step) there are no running beams to show: the
        # history shows the nb best extensions, which all became hypotheses.
        shown = (candidates[:, :nb], top_scores[:, :nb], parent[:, :nb]) if all_end else \
            (self.running, self.scores, self.parents)
        finished = _newly_stored(self.stored, self.stored_scores, fresh, step) if stored else [[] for _ in rows]
        self.history.append(BeamStep(shown[0].clone(), shown[1].clone(), shown[2].clone(), finished))
        return all_end or over

    def _store(self, candidates, top_scores, ends, length):
        """Extensions that ended among the nb best of this step become hypotheses, scored with the
        length penalty; the store keeps the nb best (none once it may not change)."""
        rows, nb = self.rows, self.nb
        new = ends & self.in_top_nb
        scores = top_scores / (length ** self.length_penalty)
        scores = scores + (self.stored_full.all(dim=-1, keepdim=True) & (self.early_stopping is True)).float() * NEG
        scores = scores + (~self.can_improve).float() * NEG + (~new).float() * NEG
        stored = torch.cat([self.stored, self.stored.new_full((*self.stored.shape[:2], 1), -1)], dim=2)
        merged = torch.cat([self.stored_scores, scores], dim=1).topk(nb).indices
        self.stored = torch.cat([stored, candidates], dim=1)[rows, merged]
        self.stored_scores = torch.cat([self.stored_scores, scores], dim=1)[rows, merged]
        self.stored_full = torch.cat([self.stored_full, new], dim=1)[rows, merged]
        return merged

    def _over(self, length: int) -> torch.Tensor:
        """Whether no running beam can still beat the stored hypotheses (or the store is full with
        ``early_stopping=True``), a 0-dim bool still on the device. ``"never"`` scores the best
        beam at the longest length instead."""
        if self.early_stopping == "never" and self.length_penalty > 0:
            length = self.max_new_tokens  # longer can only score higher then
        best_running = self.scores[:, :1] / (length ** self.length_penalty)
        worst_stored = torch.where(self.stored_full, self.stored_scores.min(dim=-1, keepdim=True).values, NEG)
        self.can_improve = self.can_improve & (best_running > worst_stored).any(dim=-1, keepdim=True)
        return ~self.can_improve.any() | (self.stored_full.all() & (self.early_stopping is True))

    def cache_rows(self) -> torch.Tensor:
        """The cache row of the beam each new beam extends, for every prompt."""
        return (self.rows * self.nb + self.parents).flatten()

    def hypotheses(self, count: int, tokenizer) -> list[list[Hypothesis]]:
        result = []
        for b in range(self.stored.shape[0]):
            hyps = []
            for slot in range(count):
                if self.stored_scores[b, slot] <= NEG / 2:
                    break  # fewer possible sequences than asked for: no placeholder hypotheses
                tokens = self.stored[b, slot][self.stored[b, slot] >= 0]
                score = self.stored_scores[b, slot].item()
                reason = "eos" if self.eos and tokens[-1].item() in self.eos else "length"
                text = tokenizer.decode(tokens.tolist(), skip_special_tokens=True) if tokenizer is not None else None
                hyps.append(Hypothesis(tokens, score, score * len(tokens) ** self.length_penalty, reason, text))
            result.append(hyps)
        return result


def _newly_stored(stored, stored_scores, fresh, step):
    """Per prompt, the hypotheses that entered the store at this step (``fresh``: ``[batch, nb]``),
    as (tokens, score), for ``history``. One read: the flags and the scores together."""
    flags, scores = torch.stack([fresh.to(stored_scores.dtype), stored_scores]).tolist()
    return [[(stored[b, i, : step + 1].clone(), scores[b][i]) for i, new in enumerate(row) if new]
            for b, row in enumerate(flags)]


def _check_arguments(num_beams, max_new_tokens, length_penalty, early_stopping, num_return_sequences):
    """Validate beam search's own arguments; numpy numbers are fine. Returns them as Python numbers."""
    num_beams = check_int(num_beams, "num_beams", 1)
    max_new_tokens = check_counts(max_new_tokens)[0]
    length_penalty = check_number(length_penalty, "length_penalty", "a finite number", math.isfinite)
    # `is` tests: 1 == True in Python, but early_stopping=1 would then run as neither rule.
    if not (early_stopping is True or early_stopping is False or early_stopping == "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    num_return_sequences = check_int(num_return_sequences, "num_return_sequences", 1,
                                     f"an integer in [1, num_beams={num_beams}]", maximum=num_beams)
    return num_beams, max_new_tokens, length_penalty, num_return_sequences
