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

from dataclasses import dataclass, field

import torch

from .generate import _eos_ids, _model_device, _now, _prompt_batch

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
        return torch.tensor([h.score for hyps in self.hypotheses for h in hyps])

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
) -> BeamSearchResult:
    """Beam search with ``num_beams`` beams for up to ``max_new_tokens`` new tokens.

    ``input_ids`` is given as to ``ll.generate``: a LongTensor ``[batch, seq]`` (left-padded with
    ``attention_mask``), a list of token-id lists, or text with ``tokenizer``. ``eos_token_id``
    is an id or a list of ids; ``None`` takes the model's ``generation_config`` (``[]`` for none).
    Returns the ``num_return_sequences`` best finished hypotheses of each prompt.
    """
    _check_arguments(num_beams, max_new_tokens, length_penalty, early_stopping, num_return_sequences)
    eos = _eos_ids(eos_token_id, model)
    device = _model_device(model)
    ids, mask = _prompt_batch(input_ids, attention_mask, tokenizer, device)
    batch, nb = ids.shape[0], num_beams

    # Prefill each prompt once, then give each of its beams a copy of the cache.
    start = _now(device)
    positions = (mask.cumsum(dim=-1) - 1).clamp_min(0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    cache.batch_repeat_interleave(nb)
    logits = out.logits[:, -1].float().repeat_interleave(nb, dim=0)  # [batch * nb, vocab]
    mask = mask.repeat_interleave(nb, dim=0)
    prefill_seconds = _now(device) - start
    calls = 1

    # Running beams. Only beam 0 starts "alive" (score 0): the others start at NEG, so that the
    # first step does not pick the same extension once per (identical) beam.
    running = torch.full((batch, nb, max_new_tokens), -1, dtype=torch.long, device=device)
    running_scores = torch.zeros(batch, nb, device=device)
    running_scores[:, 1:] = NEG
    # The store of finished hypotheses: the nb best so far per prompt (NEG = empty slot).
    stored = running.clone()
    stored_scores = torch.full((batch, nb), NEG, device=device)
    stored_full = torch.zeros(batch, nb, dtype=torch.bool, device=device)  # slot holds a hypothesis
    can_improve = torch.ones(batch, 1, dtype=torch.bool, device=device)
    keep = max(2, 1 + len(eos)) * nb  # extensions looked at per step
    in_top_nb = torch.arange(keep, device=device) < nb
    eos_tensor = torch.tensor(eos, dtype=torch.long, device=device)
    rows = torch.arange(batch, device=device)[:, None]
    history, steps = [], []

    for step in range(max_new_tokens):
        start = _now(device)
        # 1. Score every extension of every beam: beam score + the token's log-probability.
        vocab = logits.shape[-1]
        logprobs = torch.log_softmax(logits, dim=-1).view(batch, nb, vocab)
        totals = (logprobs + running_scores[:, :, None]).view(batch, nb * vocab)
        top_scores, top_index = totals.topk(keep)  # [batch, keep], best first
        parent, token = top_index // vocab, top_index % vocab
        candidates = running[rows, parent]  # [batch, keep, max_new_tokens]
        candidates[:, :, step] = token
        ends = torch.isin(token, eos_tensor) | (step + 1 == max_new_tokens)

        # 2. The nb best extensions that did not end are the next beams.
        alive_scores = top_scores + ends.float() * NEG
        chosen = alive_scores.topk(nb).indices
        running, running_scores = candidates[rows, chosen], alive_scores[rows, chosen]
        parents = parent[rows, chosen]

        # 3. Extensions that ended among the nb best of this step become hypotheses, scored
        #    with the length penalty; the store keeps the nb best (none once it may not change).
        new = ends & in_top_nb
        scores = top_scores / ((step + 1) ** length_penalty)
        scores = scores + (stored_full.all(dim=-1, keepdim=True) & (early_stopping is True)).float() * NEG
        scores = scores + (~can_improve).float() * NEG
        scores = scores + (~new).float() * NEG
        merged = torch.cat([stored_scores, scores], dim=1).topk(nb).indices
        stored = torch.cat([stored, candidates], dim=1)[rows, merged]
        stored_scores = torch.cat([stored_scores, scores], dim=1)[rows, merged]
        stored_full = torch.cat([stored_full, new], dim=1)[rows, merged]
        # When every extension ends (the last step) there are no running beams to show: the
        # history shows the nb best extensions, which all became hypotheses.
        shown = (candidates[:, :nb], top_scores[:, :nb], parent[:, :nb]) if bool(ends.all()) else \
            (running, running_scores, parents)
        history.append(BeamStep(shown[0][:, :, : step + 1].clone(), shown[1].clone(), shown[2].clone(),
                                _newly_stored(stored, stored_scores, merged, nb, step)))

        # 4. Stop, or feed each beam's last token, with the cache rows following the beams.
        length = step + 1  # tokens in every running beam now
        if early_stopping == "never" and length_penalty > 0:
            length = max_new_tokens
        best_running = running_scores[:, :1] / (length ** length_penalty)
        worst_stored = torch.where(stored_full, stored_scores.min(dim=-1, keepdim=True).values, NEG)
        can_improve = can_improve & (best_running > worst_stored).any(dim=-1, keepdim=True)
        done = (not bool(can_improve.any()) or (bool(stored_full.all()) and early_stopping is True)
                or bool(ends.all()))
        if done:
            steps.append(_now(device) - start)
            break
        cache.batch_select_indices((rows * nb + parents).flatten())
        mask = torch.cat([mask, mask.new_ones(batch * nb, 1)], dim=1)
        positions = mask.sum(dim=-1, keepdim=True) - 1
        out = model(input_ids=running[:, :, step].reshape(-1, 1), attention_mask=mask, position_ids=positions,
                    past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache, logits = out.past_key_values, out.logits[:, -1].float()
        calls += 1
        steps.append(_now(device) - start)

    hypotheses = []
    for b in range(batch):
        hyps = []
        for slot in range(num_return_sequences):
            tokens = stored[b, slot][stored[b, slot] >= 0]
            score = stored_scores[b, slot].item()
            reason = "eos" if eos and tokens[-1].item() in eos else "length"
            text = tokenizer.decode(tokens.tolist(), skip_special_tokens=True) if tokenizer is not None else None
            hyps.append(Hypothesis(tokens, score, score * len(tokens) ** length_penalty, reason, text))
        hypotheses.append(hyps)
    prompts = [row[m.bool()] for row, m in zip(ids, mask[::nb, : ids.shape[1]])]
    return BeamSearchResult(hypotheses, prompts, history, calls, prefill_seconds, steps)


def _newly_stored(stored, stored_scores, merged, nb, step):
    """Per prompt, the hypotheses that entered the store at this step (for ``history``)."""
    out = []
    for b in range(stored.shape[0]):
        fresh = [(stored[b, i, : step + 1].clone(), stored_scores[b, i].item())
                 for i in range(nb) if merged[b, i] >= nb and stored_scores[b, i] > NEG / 2]
        out.append(fresh)
    return out


def _check_arguments(num_beams, max_new_tokens, length_penalty, early_stopping, num_return_sequences):
    def integer(v):
        return isinstance(v, int) and not isinstance(v, bool)

    if not integer(num_beams) or num_beams < 1:
        raise ValueError(f"num_beams must be an integer >= 1, got {num_beams!r}")
    if not integer(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or length_penalty != length_penalty \
            or abs(length_penalty) == float("inf"):
        raise ValueError(f"length_penalty must be a finite number, got {length_penalty!r}")
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    if not integer(num_return_sequences) or not 1 <= num_return_sequences <= num_beams:
        raise ValueError(f"num_return_sequences must be an integer in [1, num_beams={num_beams}], "
                         f"got {num_return_sequences!r}")
