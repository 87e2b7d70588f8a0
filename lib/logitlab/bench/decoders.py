"""Rows for the closing chapter: every decoder of chapters 1 to 5 against ``ll.generate``.

The drafters' rows (chapters 6 to 9) come from ``drafting``, ``eagle`` and ``pass_`` in the same
run; these rows add the decoders that draft nothing, on the same held-out prompts and with the
same number of tokens, so that one table can put them all side by side.
"""

from __future__ import annotations

import torch

from ..decoding.generate import generate
from ..measure.table import Table
from ..sampling.pipeline import SamplingConfig, process_logits
from ..search.beam import beam_search
from ..search.best_of_n import best_of_n
from .drafting import timed_runs
from .prompts import DRAFT_PROMPTS, chat

# One setting per truncation rule, the values the chapters use as their examples.
TRUNCATIONS = {"top-k 50": dict(top_k=50), "top-p 0.9": dict(top_p=0.9), "min-p 0.1": dict(min_p=0.1),
               "typical 0.9": dict(typical_p=0.9), "epsilon 3e-4": dict(epsilon_cutoff=3e-4),
               "eta 3e-4": dict(eta_cutoff=3e-4), "top-H 0.4": dict(top_h=0.4), "top-nsigma 1": dict(top_n_sigma=1.0)}


@torch.inference_mode()
def bench_decoders(table: Table, model, tokenizer, new_tokens: int = 128, beams: int = 4, n: int = 4,
                   repeat: int = 3) -> None:
    """Each decoder against ``ll.generate`` at the same temperature, in turn on the held-out
    prompts: greedy and beam search at T = 0; sampling with each truncation rule, best-of-n and a
    batch of n samples at T = 1. Every run makes exactly ``new_tokens`` tokens per answer (no
    EOS), so a ratio is a ratio of answers per second. The truncation rows also give how much
    probability the rule removes per step of plain sampling's answers: the total-variation
    distance between the distribution it samples from and the model's."""
    prompts = [chat(tokenizer, q) for q in DRAFT_PROMPTS]
    common = dict(max_new_tokens=new_tokens, eos_token_id=[])
    name = f"{len(prompts)} prompts, {new_tokens} tokens each"

    greedy = {"ll.generate": lambda ids, g: generate(model, ids, temperature=0, **common),
              f"beam search, {beams} beams": lambda ids, g: beam_search(model, ids, num_beams=beams, **common)}
    times, _ = timed_runs(model, greedy, prompts, repeat)
    table.add(f"decoders: ll.generate, T=0, {name}", times[0])
    table.add(f"decoders: beam search, {beams} beams, T=0, {name}", times[1], times[0] / times[1],
              "faster than ll.generate")

    sampled = {"ll.generate": lambda ids, g: generate(model, ids, temperature=1.0, generator=g, **common)}
    for label, kwargs in TRUNCATIONS.items():
        sampled[label] = lambda ids, g, kw=kwargs: generate(model, ids, temperature=1.0, generator=g, **kw, **common)
    sampled[f"best of {n}"] = lambda ids, g: best_of_n(model, ids, n=n, temperature=1.0, generator=g, **common)
    sampled[f"{n} samples in one batch"] = lambda ids, g: generate(model, ids, temperature=1.0, generator=g,
                                                                   num_return_sequences=n, **common)
    times, results = timed_runs(model, sampled, prompts, repeat)
    removed = removed_mass(model, [r.sequences[0][None] for r in results["ll.generate"]], new_tokens)
    table.add(f"decoders: ll.generate, T=1, {name}", times[0])
    for (label, seconds) in list(zip(sampled, times))[1:]:
        if label in removed:
            label = f"{label} (removes {removed[label]:.1%} of the probability per step)"
        answers = n if label.endswith("one batch") else 1
        table.add(f"decoders: {label}, T=1, {name}", seconds, answers * times[0] / seconds,
                  "faster than ll.generate, in answers per second")


def removed_mass(model, sequences: list, new_tokens: int) -> dict:
    """For each rule of ``TRUNCATIONS``: the mean probability (at T = 1) of the tokens it
    removes, over every generated position of ``sequences``."""
    logits = torch.cat([model(s).logits[0, -new_tokens - 1:-1].float() for s in sequences])
    probs = torch.softmax(logits, dim=-1)
    out = {}
    for label, kwargs in TRUNCATIONS.items():
        kept = process_logits(logits, SamplingConfig(temperature=1.0, **kwargs)).isfinite()
        out[label] = (probs * ~kept).sum(-1).mean().item()
    return out
