"""The cost model of chapter 6, checked on runs it was not fitted on.

A speculative run is priced as the textbook model prices it, with this machine's costs: every
pass of the target over n new tokens costs v(n) decode steps (v measured in the same run, on a
cached prefix), and a drafter that is a network of its own (a draft model, Medusa heads) or a
lookup adds its own time; the decoding loop's bookkeeping is left out, as in the formula. Plain
decoding costs one step per token. The pass sizes and the drafter's time come from one run on
*calibration* prompts (``logitlab.bench.prompts.CALIBRATION``), different from the prompts
that are timed, so each prediction is a
forecast of the timed row, not a fit to it.
"""

from __future__ import annotations

import statistics

import torch

from ..devices import generator as seeded_generator
from ..timing import PassLog, pass_times
from .prompts import chat


@torch.inference_mode()
def calibrate(model, runs: dict, prompts, drafter_seconds=lambda result: result.draft_seconds) -> dict:
    """Run each of ``runs`` (label -> fn(ids, generator), as in ``time_against_ar``) once on
    ``prompts`` and return ``{label: (tokens, pass sizes, drafter seconds)}`` for the cost model.
    The first pass of each prompt, the prefill, is the same in every run and is left out."""
    seen = {}
    for label, run in runs.items():
        tokens, sizes, drafting = 0, [], 0.0
        for i, ids in enumerate(prompts):
            with PassLog(model) as log:
                result = run(ids, seeded_generator(model, i))
            tokens += len(result.new_tokens[0])
            sizes += log.sizes[1:]
            drafting += drafter_seconds(result) if hasattr(result, "draft_seconds") else 0.0
        seen[label] = (tokens, sizes, drafting)
    return seen


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


def cost_context(tokenizer) -> list[int]:
    """A cached prefix of realistic length for pricing the passes: a chat prompt and 128 tokens."""
    return chat(tokenizer, "Describe how to make a cup of tea.")[0].tolist() + list(range(1000, 1128))
