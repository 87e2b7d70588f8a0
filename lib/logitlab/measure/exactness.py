"""How far a speculative loop's outputs are from the target's own distribution.

Chapter 7 uses it to show that typical acceptance is not exact while rejection sampling is, and
chapter 10 (``output_pvalue``) that drafts recycled from the target keep the loop exact: every
continuation of a tiny-vocabulary model is enumerated, so the distance is computed, not estimated
from samples of the target.
"""

from __future__ import annotations

import torch

from .._validate import check_int, check_number
from ..devices import exact_dtype, model_device
from ..devices import generator as seeded_generator
from ..speculative.loop import speculative_generate


def output_distance(target, drafter, acceptance, prompt=(1,), length: int = 3, samples: int = 20_000,
                    gamma: int = 2, temperature: float = 1.0, seed: int = 0) -> float:
    """Total variation between the continuations that ``ll.speculative_generate`` produces with
    ``acceptance`` and the target's own distribution, for a model with a tiny vocabulary.

    Every continuation of ``length`` tokens is enumerated and its exact probability under the
    target (at ``temperature``) computed in one forward pass; ``samples`` runs of the loop give
    the empirical distribution. Sampling noise alone leaves a distance of at most about
    ``0.4 * sqrt(V ** length / samples)`` (less for a peaked target), which an exact rule
    (rejection sampling) shows.
    """
    exact, counts = output_counts(target, drafter, acceptance, prompt, length, samples, gamma, temperature, seed)
    return 0.5 * (counts / samples - exact).abs().sum().item()


def output_pvalue(target, drafter, acceptance=None, prompt=(1,), length: int = 3, samples: int = 20_000,
                  gamma: int = 2, temperature: float = 1.0, seed: int = 0) -> float:
    """The p-value of Pearson's chi-square test of the same counts against the exact
    probabilities (chapter 10): uniform between 0 and 1 for an exact loop. Every continuation
    should be expected 5 times or more (``samples`` large enough for the least likely)."""
    from scipy.stats import chisquare

    exact, counts = output_counts(target, drafter, acceptance, prompt, length, samples, gamma, temperature, seed)
    return float(chisquare(counts.numpy(), (exact / exact.sum() * samples).numpy()).pvalue)


@torch.inference_mode()
def output_counts(target, drafter, acceptance, prompt=(1,), length: int = 3, samples: int = 20_000,
                  gamma: int = 2, temperature: float = 1.0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(exact, counts)``, on the CPU in float64, one entry per continuation of ``length`` tokens
    in ``itertools.product`` order: its probability under the target, and how many of the loop's
    ``samples`` outputs (one batch, seeded with ``seed``) it was."""
    import itertools
    from collections import Counter

    vocab = int(target.config.vocab_size)
    length, samples, gamma = (check_int(value, name, 1) for name, value in [("length", length), ("samples", samples),
                                                                               ("gamma", gamma)])
    temperature = check_number(temperature, "temperature", "a number > 0 (the distance of a sampled output)",
                               lambda v: v > 0)
    if not prompt or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in prompt):
        raise ValueError(f"prompt must be a non-empty sequence of token ids in [0, {vocab}), got {prompt!r}")
    if vocab ** length > 100_000:
        raise ValueError(f"vocab_size ** length must be at most 100000 to enumerate, got {vocab} ** {length}")
    seqs = list(itertools.product(range(vocab), repeat=length))
    device = model_device(target)
    ids = torch.tensor([list(prompt) + list(s) for s in seqs], device=device)
    logits = target(ids).logits[:, len(prompt) - 1: -1].to(exact_dtype(device)) / temperature
    exact = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, len(prompt):, None]).squeeze(-1).sum(-1).exp()
    out = speculative_generate(target, drafter, [list(prompt)], gamma=gamma, max_new_tokens=length, eos_token_id=[],
                               temperature=temperature, num_return_sequences=samples, acceptance=acceptance,
                               generator=seeded_generator(target, seed))
    counts = Counter(tuple(t.tolist()) for t in out.new_tokens)
    return exact.cpu().double(), torch.tensor([counts.get(s, 0) for s in seqs], dtype=torch.float64)
