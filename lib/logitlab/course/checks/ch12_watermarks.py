"""The checks of chapter 12 (watermarks): the green list's z-score, computed by hand, and one round
of tournament sampling."""

from __future__ import annotations

import math

import torch

from ...watermark.green_list import detect, green_mask
from ...watermark.synthid import tournament_probs
from .common import CheckFailed, asks_for, call_unchanged, case_generator


@asks_for(detect, allows=(green_mask,))  # the exercise gives green_mask
def check_green_z_score(fn) -> None:
    """Check ``fn(tokens, vocab_size, gamma, key) -> float`` (chapter 12): the z-score of the
    green list's detector for a list of token ids, each distinct (previous, token) pair scored
    once, green when ``token`` is in ``green_mask(previous, vocab_size, gamma, key)``."""
    generator = case_generator(12)  # the random cases: the same in a notebook, unseen while grading
    random = [torch.randint(0, 50, (n,), generator=generator).tolist() for n in (40, 200)]
    cases = [
        ("a short text", [3, 17, 4, 9, 4, 33], 50, 0.25, 7, ""),
        ("two tokens (one pair)", [5, 8], 50, 0.25, 7, "The first token has no token before it: it is not scored."),
        ("a phrase said three times", [1, 2, 3, 4] * 3, 50, 0.25, 7, (
            "Count each (previous, token) pair once: a repeated pair repeats its colour, so it is not "
            "new evidence.")),
        ("a repeated token", [6, 6, 6, 6, 6, 9], 50, 0.25, 11, "Count each (previous, token) pair once."),
        ("random text of 40 tokens", random[0], 50, 0.25, 15485863, ""),
        ("random text of 200 tokens, gamma = 0.5", random[1], 50, 0.5, 3, "gamma is the green share: use it in "
         "both the expected count and the variance."),
    ]
    for name, tokens, vocab, gamma, key, hint in cases:
        label = f"Case {name} (vocab_size {vocab}, gamma {gamma}, key {key})"
        got = call_unchanged(fn, label, list(tokens), vocab, gamma, key, what="tokens")
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = float(got)
        if isinstance(got, bool) or not isinstance(got, (int, float)) or not math.isfinite(got):
            raise CheckFailed(f"{label}: return the z-score as a finite float, got {got!r}.")
        want = detect(tokens, vocab, gamma, key)
        if abs(got - want.z) > 1e-6 * max(1.0, abs(want.z)):
            raise CheckFailed(f"{label}: expected z = {want.z:.6f} ({want.green} green of {want.scored} pairs "
                              f"scored), got {got:.6f}. {hint}".rstrip())
    print(f"check_green_z_score: all {len(cases)} cases passed.")


def _one_round(probs: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return tournament_probs(probs, g[None])


@asks_for(tournament_probs)
def check_tournament_round(fn) -> None:
    """Check ``fn(probs, g) -> tensor`` (chapter 12): the distribution of the winner of one round
    of tournament sampling between two independent draws from ``probs`` (``[..., V]``), the keyed
    bits ``g`` (``[V]``, 0. or 1.) deciding each match and a fair coin deciding a tie."""
    generator = case_generator(12)  # the random cases: the same in a notebook, unseen while grading
    p5 = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05])
    cases = [
        ("five tokens", p5, torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0]), ""),
        ("every bit 1", p5, torch.ones(5), "When every token has g = 1, every match is a tie: nothing changes."),
        ("every bit 0", p5, torch.zeros(5), "When every token has g = 0, every match is a tie: nothing changes."),
        ("one token with g = 1", p5, torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0]), (
            "A token with g = 1 wins every match against a token with g = 0: its probability becomes "
            "p(x) (1 + 1 - E_p[g]).")),
        ("a token of probability 1", torch.tensor([0.0, 1.0, 0.0]), torch.tensor([1.0, 0.0, 1.0]),
         "Two draws of a sure token are that token: the round cannot change it."),
        ("a batch of two rows", torch.softmax(torch.randn(2, 50, generator=generator), dim=-1),
         (torch.rand(50, generator=generator) < 0.5).float(), "Work along the last dimension (rows are separate)."),
    ]
    for name, probs, g, hint in cases:
        label = f"Case {name} (probs {probs.tolist() if probs.numel() <= 5 else tuple(probs.shape)}, g {g.tolist() if g.numel() <= 5 else '...'})"
        got = call_unchanged(fn, label, probs.clone(), g.clone(), what="probs or g")
        if not isinstance(got, torch.Tensor) or got.shape != probs.shape:
            raise CheckFailed(f"{label}: return a tensor shaped like probs {tuple(probs.shape)}, got "
                              f"{tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__}.")
        want = _one_round(probs, g)
        if not torch.allclose(got.float(), want, atol=1e-6):
            raise CheckFailed(f"{label}: expected {want.tolist() if want.numel() <= 5 else 'the winner distribution'}, "
                              f"got {got.tolist() if got.numel() <= 5 else 'something else'}. {hint}".rstrip())
    print(f"check_tournament_round: all {len(cases)} cases passed.")
