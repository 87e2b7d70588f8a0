"""Repetition penalties: make the tokens that already occurred less (or more) likely.

Chapter 3 ("Repetition") explains every function here. Like the truncation rules of
``logitlab.sampling.truncation``, each penalty is a pure function on logits ``[..., vocab]`` that returns
new logits and never modifies its input, and also a class that works as a Hugging Face
``LogitsProcessor``.

Which earlier tokens a penalty counts, and why:

* ``repetition_penalty`` (CTRL, Keskar et al. 2019, as Hugging Face's
  ``RepetitionPenaltyLogitsProcessor``) counts the whole context, prompt and output alike, once
  per distinct token: that is CTRL's definition, and what ``RepetitionPenalty`` does inside
  ``generate``.
* ``presence_penalty`` and ``frequency_penalty`` (the OpenAI API's definitions, also vLLM's)
  count only the tokens generated so far: ``PresencePenalty(penalty, prompt_length)`` skips the
  prompt. They steer the model away from what it has said itself; counting the prompt would
  penalise the very words the user asked about.

The functions take the tokens to count as ``prev_tokens``, a LongTensor ``[batch, seq]``
(``seq`` may be 0) with the batch of the logits. Entries that are negative (the library pads
with -1) or equal to ``pad_token_id`` are padding and are not counted; ids >= vocab are not
counted either (this output layer cannot produce them; Hugging Face ignores them too).
``apply_penalties`` applies all three in the order of ``logitlab.sampling.pipeline.SamplingConfig``.

A penalty must leave every finite logit finite. One so extreme that a penalised logit would
overflow the logits' dtype (a repetition penalty of 1e-39, or a presence penalty of 1e5 on
float16 logits, whose largest number is 65504) raises a ``ValueError`` instead: the overflow
would be +inf (NaN after softmax) or -inf (the token removed, not discouraged).
"""

from __future__ import annotations

import math

import torch

from .._validate import check_int, check_logits, check_number, check_token_ids
from ..devices import exact_dtype
from .hf_processor import Processor


def repetition_penalty(
    logits: torch.Tensor, prev_tokens: torch.Tensor, penalty: float, pad_token_id: int | None = None
) -> torch.Tensor:
    """CTRL's repetition penalty (Keskar et al. 2019): the logit of every distinct token of
    ``prev_tokens`` is divided by ``penalty`` if positive, multiplied by it if negative
    (chapter 3).

    Once per distinct token, however often it occurred. ``penalty > 1`` discourages
    repetition, ``1`` changes nothing, ``0 < penalty < 1`` encourages it. Padding entries
    (negative or ``pad_token_id``) are not counted. As Hugging Face's
    ``RepetitionPenaltyLogitsProcessor``.

    >>> repetition_penalty(torch.tensor([[2.0, -2.0, 1.0]]), torch.tensor([[0, 1, 1, -1]]), 2.0)
    tensor([[ 1., -4.,  1.]])
    """
    check_logits(logits)
    penalty = _check_repetition(penalty, "penalty")
    return _repeat(logits, _token_counts(logits, prev_tokens, pad_token_id, "prev_tokens") > 0, penalty, "penalty")


def presence_penalty(
    logits: torch.Tensor, prev_tokens: torch.Tensor, penalty: float, pad_token_id: int | None = None
) -> torch.Tensor:
    """OpenAI's presence penalty: subtract ``penalty`` once from the logit of every token that
    occurs in ``prev_tokens`` (chapter 3).

    ``penalty`` is any finite number; a negative one encourages repetition (the OpenAI API
    allows -2 to 2). Padding entries (negative or ``pad_token_id``) are not counted.

    >>> presence_penalty(torch.tensor([[1.0, 1.0, 1.0]]), torch.tensor([[2, 2, 0, -1]]), 0.5)
    tensor([[0.5000, 1.0000, 0.5000]])
    """
    check_logits(logits)
    penalty = _check_additive(penalty, "penalty")
    return _subtract(logits, _token_counts(logits, prev_tokens, pad_token_id, "prev_tokens") > 0, penalty, "penalty")


def frequency_penalty(
    logits: torch.Tensor, prev_tokens: torch.Tensor, penalty: float, pad_token_id: int | None = None
) -> torch.Tensor:
    """OpenAI's frequency penalty: subtract ``penalty * count`` from the logit of every token,
    where ``count`` is how often it occurs in ``prev_tokens`` (chapter 3).

    ``penalty`` is any finite number; a negative one encourages repetition (the OpenAI API
    allows -2 to 2). Padding entries (negative or ``pad_token_id``) are not counted.

    >>> frequency_penalty(torch.tensor([[1.0, 1.0, 1.0]]), torch.tensor([[2, 2, 0, -1]]), 0.5)
    tensor([[0.5000, 1.0000, 0.0000]])
    """
    check_logits(logits)
    penalty = _check_additive(penalty, "penalty")
    return _subtract(logits, _token_counts(logits, prev_tokens, pad_token_id, "prev_tokens"), penalty, "penalty")


def apply_penalties(
    logits: torch.Tensor, context: torch.Tensor | None = None, output: torch.Tensor | None = None, *,
    repetition_penalty: float | None = None, presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
) -> torch.Tensor:
    """The penalties of a ``SamplingConfig``, in its order: the repetition penalty counts
    ``context`` (every earlier token, prompt and output), then the presence and frequency
    penalties count ``output`` (the generated tokens only).

    ``None`` turns a penalty off, and so do its neutral values (1, 0 and 0); ``None`` tokens
    mean that there are none yet. The arguments have ``SamplingConfig``'s names, and so do the
    error messages. (Inside this function those names are the numbers, not the functions.)
    """
    check_logits(logits)
    context = _none_yet(context, "context", logits)
    output = _none_yet(output, "output", logits)
    if repetition_penalty is not None:
        penalty = _check_repetition(repetition_penalty, "repetition_penalty")
        if penalty != 1.0:
            seen = _token_counts(logits, context, None, "context") > 0
            logits = _repeat(logits, seen, penalty, "repetition_penalty")
    if presence_penalty is not None:
        penalty = _check_additive(presence_penalty, "presence_penalty")
        if penalty != 0.0:
            logits = _subtract(logits, _token_counts(logits, output, None, "output") > 0, penalty, "presence_penalty")
    if frequency_penalty is not None:
        penalty = _check_additive(frequency_penalty, "frequency_penalty")
        if penalty != 0.0:
            logits = _subtract(logits, _token_counts(logits, output, None, "output"), penalty, "frequency_penalty")
    return logits


def _check_repetition(penalty, name: str) -> float:
    return check_number(penalty, name, "a finite number > 0 (1 means no penalty)", lambda v: 0 < v < math.inf)


def _check_additive(penalty, name: str) -> float:
    return check_number(penalty, name, "a finite number (0 means no penalty)", math.isfinite)


def _none_yet(tokens, name: str, logits: torch.Tensor) -> torch.Tensor:
    """``tokens``, checked, or no tokens at all ``[..., 0]`` for None."""
    if tokens is None:
        return torch.empty(logits.shape[:-1] + (0,), dtype=torch.long, device=logits.device)
    return check_token_ids(tokens, name, logits)


def _token_counts(logits: torch.Tensor, tokens, pad_token_id, name: str) -> torch.Tensor:
    """How often each token id occurs in each row of ``tokens`` (called ``name`` by the
    caller): ``[..., vocab]`` (long)."""
    check_token_ids(tokens, name, logits)
    pad_token_id = _check_pad_token_id(pad_token_id)
    vocab = logits.shape[-1]
    ids = tokens.reshape(logits.shape[:-1].numel(), tokens.shape[-1])
    ignored = (ids < 0) | (ids >= vocab)
    if pad_token_id is not None:
        ignored |= ids == pad_token_id
    ids = ids.masked_fill(ignored, vocab)  # one extra column collects what is not counted
    counts = torch.zeros(ids.shape[0], vocab + 1, dtype=torch.long, device=ids.device)
    counts.scatter_add_(-1, ids, torch.ones_like(ids))
    return counts[:, :vocab].reshape(logits.shape)


def _repeat(logits: torch.Tensor, seen: torch.Tensor, penalty: float, name: str) -> torch.Tensor:
    """CTRL's rule on the ``seen`` tokens, in the logits' dtype as Hugging Face computes it."""
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    out = torch.where(seen, penalised, logits)
    _check_in_range(out, logits, penalty, name, closer_to=1)
    return out


def _subtract(logits: torch.Tensor, counts: torch.Tensor, penalty: float, name: str) -> torch.Tensor:
    """``logits - penalty * counts`` in float64 (float32 on MPS), rounded once to the logits' dtype."""
    dtype = exact_dtype(logits.device)
    out = (logits.to(dtype) - penalty * counts.to(dtype)).to(logits.dtype)
    _check_in_range(out, logits, penalty, name, closer_to=0)
    return out


def _check_in_range(out: torch.Tensor, logits: torch.Tensor, penalty: float, name: str, closer_to: int) -> None:
    """Every finite logit must stay finite, and every -inf stay -inf (not become NaN)."""
    ok = torch.where(torch.isfinite(logits), torch.isfinite(out), torch.isneginf(out))
    if not bool(ok.all()):
        largest = torch.finfo(logits.dtype).max
        raise ValueError(
            f"{name}={penalty!r} pushes a penalised logit beyond the range of {logits.dtype} "
            f"(largest magnitude {largest:.4g}); use a penalty closer to {closer_to}"
        )


def _check_pad_token_id(pad_token_id) -> int | None:
    if pad_token_id is None:
        return None
    # Any integer will do (a negative one is padding anyway).
    return check_int(pad_token_id, "pad_token_id", minimum=-(2**63), allowed="an integer token id or None")


class RepetitionPenalty(Processor):
    """``repetition_penalty`` as a logits processor; it counts all of ``input_ids``, prompt
    included, as CTRL and Hugging Face do: ``RepetitionPenalty(1.2)``."""

    def __init__(self, penalty: float, pad_token_id: int | None = None):
        self.penalty = _check_repetition(penalty, "penalty")
        self.pad_token_id = _check_pad_token_id(pad_token_id)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        seen = _token_counts(scores, input_ids, self.pad_token_id, "input_ids") > 0
        return _repeat(scores, seen, self.penalty, "penalty")


class PresencePenalty(Processor):
    """``presence_penalty`` as a logits processor; it counts only ``input_ids[:, prompt_length:]``,
    the tokens generated so far, as the OpenAI API does: ``PresencePenalty(0.5, prompt_length)``."""

    def __init__(self, penalty: float, prompt_length: int = 0, pad_token_id: int | None = None):
        self.penalty = _check_additive(penalty, "penalty")
        self.prompt_length = check_int(prompt_length, "prompt_length", minimum=0)
        self.pad_token_id = _check_pad_token_id(pad_token_id)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        check_token_ids(input_ids, "input_ids", scores, "scores")  # before slicing it
        counts = _token_counts(scores, input_ids[..., self.prompt_length :], self.pad_token_id, "input_ids")
        return _subtract(scores, self._counted(counts), self.penalty, "penalty")

    @staticmethod
    def _counted(counts: torch.Tensor) -> torch.Tensor:
        return counts > 0  # once per distinct token


class FrequencyPenalty(PresencePenalty):
    """``frequency_penalty`` as a logits processor; it counts only ``input_ids[:, prompt_length:]``,
    the tokens generated so far, as the OpenAI API does: ``FrequencyPenalty(0.5, prompt_length)``."""

    @staticmethod
    def _counted(counts: torch.Tensor) -> torch.Tensor:
        return counts  # every occurrence
