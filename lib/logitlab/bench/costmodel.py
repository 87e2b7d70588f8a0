"""The cost model of chapter 6, checked on runs it was not fitted on.

A speculative run is priced as the textbook model prices it, with this machine's costs: every
pass of the target over n new tokens costs v(n) decode steps (v measured in the same run, after
the cached prefix ``prompts.cached_prefix``), and a drafter that is a network of its own (a
draft model, Medusa heads) or a lookup adds its own time; the decoding loop's bookkeeping is
left out, as in the formula. Plain decoding costs one step per token. The pass sizes and the
drafter's time come from one run on *calibration* prompts (``prompts.CALIBRATION``), different
from the prompts that are timed, so each prediction is a forecast of the timed row, not a fit.
The same prices applied to the timed row's own passes and drafter time (``tally`` of what
``drafting.timed_runs`` records, priced by ``drafting.own_price``) are not a forecast but a check
of the costs alone: where the forecast misses and that price does not, the acceptance on the
calibration prompts was what differed.
"""

from __future__ import annotations

import statistics

import torch

from ..devices import generator as seeded_generator
from ..measure.timing import pass_times


@torch.inference_mode()
def calibrate(model, runs: dict, prompts, drafter_seconds=lambda result: result.draft_seconds) -> dict:
    """Run each of ``runs`` (label -> fn(ids, generator), as in ``time_against_ar``) once on
    ``prompts`` and return ``{label: (tokens, pass sizes, drafter seconds)}`` for the cost model.
    The first pass of each prompt, the prefill, is the same in every run and is left out."""
    seen = {}
    for label, run in runs.items():
        results, sizes = [], []
        for i, ids in enumerate(prompts):
            with PassLog(model) as log:
                results.append(run(ids, seeded_generator(model, i)))
            sizes += log.sizes[1:]
        seen[label] = tally(results, sizes, drafter_seconds)
    return seen


def tally(results, sizes: list[int], drafter_seconds=lambda result: result.draft_seconds) -> tuple:
    """``(tokens, pass sizes, drafter seconds)`` of one contender's ``results`` (one per prompt)
    whose target passes, prefills left out, had ``sizes``: what the cost model prices. Results
    without a drafter (``ll.generate``'s) add no drafter time."""
    tokens = sum(len(result.new_tokens[0]) for result in results)
    drafting = sum(drafter_seconds(result) for result in results if hasattr(result, "draft_seconds"))
    return tokens, list(sizes), drafting


@torch.inference_mode()
def predicted_speedups(model, calibration: dict, context, rounds: int = 5) -> dict:
    """``{label: predicted speedup over plain decoding}`` from :func:`calibrate`'s counts: plain
    decoding's one step per token over the run's sum of v(n) over its passes plus its drafter
    time in steps. v(n) is measured here for every pass size the runs used."""
    sizes = sorted({n for _, ns, _ in calibration.values() for n in ns} | {1})
    times = pass_times(model, context, sizes, rounds)
    step = statistics.median(times[1])
    v = {n: statistics.median(times[n]) / step for n in sizes}
    return {label: tokens / (sum(v[n] for n in ns) + drafting / step)
            for label, (tokens, ns, drafting) in calibration.items()}


class PassLog:
    """Records the number of new tokens of every forward pass of a model's body while it is
    open (``with PassLog(model) as log: ...``, then ``log.sizes``), for the cost model: a run's
    passes, priced at the measured v(n), predict its time. The body (``model.model``) is what
    every path runs, whether it calls the whole model or the body and the output layer apart."""

    def __init__(self, model):
        self.body = getattr(model, "model", model)
        self.sizes = []

    def _record(self, module, args, kwargs):
        tokens = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else kwargs.get("inputs_embeds")
        tokens = args[0] if tokens is None else tokens
        self.sizes.append(tokens.shape[1])

    def __enter__(self):
        self.handle = self.body.register_forward_pre_hook(self._record, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self.handle.remove()
