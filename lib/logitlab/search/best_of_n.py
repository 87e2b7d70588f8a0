"""Best-of-N: draw N samples per prompt, keep the one a score likes best.

Chapter 5 ("Parallel sampling") explains this module. The N samples come from
``ll.generate(..., num_return_sequences=N)``, which decodes them as one batch after a single
shared prefill; best-of-N only adds the choice.

A score maps each sample to a number, higher is better. Two are built in, both computed from
the model's own (unprocessed) log-probabilities of the sampled tokens:

* ``"logprob"``: the sum, the log-probability of the whole continuation. It prefers short
  continuations, since every token can only lower it.
* ``"mean_logprob"``: the sum divided by the number of tokens (length-normalised), the
  average surprise per token.

Any other score is a function ``score(result) -> Tensor [rows]``, for example a reward model,
a unit test that a generated program passes, or another model's log-probability.

A score of NaN is refused with a ``ValueError`` rather than ranked: NaN compares false with
everything, so which row "wins" would depend on where the NaN happens to sit, and ranking it
last by a rule of our own would hide a scorer that is broken. A score that means "worst" is
``-inf``, which ranks last as it should.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import check_int
from ..decoding.generate import generate
from ..decoding.result import GenerationResult

SCORES = ("logprob", "mean_logprob")


@dataclass
class BestOfN:
    """What ``best_of_n`` returns: all samples, their scores, and the best row of each prompt."""

    result: GenerationResult  # every sample, rows grouped by prompt
    scores: torch.Tensor  # [rows] the score of each sample
    best_rows: list[int]  # for each prompt, the row of its best sample

    @property
    def best_tokens(self) -> list[torch.Tensor]:
        return [self.result.new_tokens[r] for r in self.best_rows]

    @property
    def best_texts(self) -> list[str] | None:
        texts = self.result.texts
        return None if texts is None else [texts[r] for r in self.best_rows]


def sequence_scores(result: GenerationResult, score="mean_logprob") -> torch.Tensor:
    """The score of every row of ``result`` ``[rows]``: ``"logprob"``, ``"mean_logprob"`` or a function."""
    if callable(score):
        scores = score(result)
        _check_scores(scores, len(result.new_tokens), "score(result)")
        return scores.float()
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES} or a function of the result, got {score!r}")
    totals = torch.stack([lp.sum() for lp in result.raw_logprobs]).float()
    if score == "logprob":
        return totals
    lengths = torch.tensor([max(1, len(t)) for t in result.new_tokens], dtype=torch.float, device=totals.device)
    return totals / lengths


def select_best(result: GenerationResult, scores: torch.Tensor) -> list[int]:
    """For each prompt, the row with the highest score (the first such row on a tie)."""
    _check_scores(scores, len(result.prompt_index), "scores")
    best = {}
    for row, prompt in enumerate(result.prompt_index):
        if prompt not in best or scores[row] > scores[best[prompt]]:
            best[prompt] = row
    return [best[p] for p in sorted(best)]


def _check_scores(scores, rows: int, name: str) -> None:
    """One real number per row, none of them NaN (see the module's docstring)."""
    if not isinstance(scores, torch.Tensor) or scores.shape != (rows,) or scores.is_complex():
        got = tuple(scores.shape) if isinstance(scores, torch.Tensor) else type(scores).__name__
        raise ValueError(f"{name} must be a real tensor of shape [{rows}], one score per row, got {got}")
    if scores.is_floating_point() and bool(scores.isnan().any()):
        nan_rows = scores.isnan().nonzero().flatten().tolist()
        raise ValueError(f"{name} is NaN at rows {nan_rows}; every sample needs a number (-inf ranks it last)")


def best_of_n(model, input_ids, *, n: int, score="mean_logprob", **generate_kwargs) -> BestOfN:
    """Draw ``n`` samples per prompt with ``ll.generate`` and pick the best by ``score``.

    ``generate_kwargs`` go to ``ll.generate`` (``max_new_tokens``, ``temperature``, ``top_p``,
    ``tokenizer``, ``generator``, ...); ``num_return_sequences`` is ``n``.
    """
    n = check_int(n, "n", minimum=1)
    if "num_return_sequences" in generate_kwargs:
        raise ValueError("num_return_sequences: best_of_n sets it to n; pass n= instead")
    if not callable(score) and score not in SCORES:
        raise ValueError(f"score must be one of {SCORES} or a function of the result, got {score!r}")
    result = generate(model, input_ids, num_return_sequences=n, **generate_kwargs)
    scores = sequence_scores(result, score)
    return BestOfN(result, scores, select_best(result, scores))
