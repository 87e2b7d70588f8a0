"""The checks of chapter 1 (logits and temperature): softmax with a temperature, Gumbel-max sampling."""

from __future__ import annotations

import torch

from ...probs import softmax
from ...sampling.draw import add_gumbel_noise, gumbel_max, sample
from .common import CheckFailed, asks_for, call, call_unchanged, case_generator, draw_int, show


def _softmax_cases():
    gen = case_generator(0)  # the random rows: the same in a notebook, unseen while grading
    yield "a small row", torch.tensor([[1.0, 2.0, 3.0]]), 1.0, ""
    yield "a batch of random rows", torch.randn(4, 10, generator=gen), 1.0, "Work along the last dimension."
    yield "temperature 0.5", torch.tensor([[0.0, 1.0, 2.0]]), 0.5, "Divide the logits by T before the softmax."
    yield "temperature 3", torch.randn(3, 7, generator=gen), 3.0, "Divide the logits by T before the softmax."
    yield "very large logits", torch.tensor([[1000.0, 999.0, 0.0]]), 1.0, (
        "exp(1000) overflows; subtract the row maximum before exponentiating (it changes nothing else)."
    )
    yield "very negative logits", torch.tensor([[-1000.0, -1001.0]]), 1.0, (
        "exp(-1000) underflows to 0 and 0/0 is NaN; subtract the row maximum first."
    )
    yield "a -inf logit (a removed token)", torch.tensor([[0.0, float("-inf"), 1.0]]), 0.7, (
        "A -inf logit must get probability exactly 0."
    )
    yield "temperature 0 (greedy)", torch.tensor([[0.5, 3.0, -1.0], [2.0, 1.0, 0.0]]), 0.0, (
        "T = 0 cannot divide; return the one-hot on the argmax."
    )
    yield "temperature 0 with a tie", torch.tensor([[1.0, 4.0, 4.0]]), 0.0, (
        "Ties at T = 0 go to the lowest token id, like torch.argmax."
    )
    yield "a tiny temperature", torch.tensor([[1.0, 1.5, 0.0]]), 1e-3, "Subtract the maximum: logits / 0.001 are large."
    yield "one row without a batch dimension", torch.tensor([2.0, 0.0, -2.0]), 1.0, "Use dim=-1, not dim=1."
    yield "a three-dimensional batch", torch.randn(2, 3, 5, generator=gen), 1.3, "Use dim=-1, not dim=1."
    yield "rows of very different sizes", torch.tensor([[1000.0, 999.0, 998.0], [-1000.0, -1001.0, -1003.0]]), 1.0, (
        "Subtract each row's own maximum (max(dim=-1, keepdim=True)), not the maximum of the whole tensor: "
        "the second row's exponentials underflow to 0 otherwise, and 0/0 is NaN."
    )
    yield "temperature 0 on one row without a batch dimension", torch.tensor([0.5, -1.0, 2.0, 1.0]), 0.0, (
        "The greedy one-hot must work for any shape [..., vocab]: take the argmax and place the 1 along "
        "dim=-1, not dim=1."
    )


@asks_for(softmax)
def check_softmax(fn) -> None:
    """Check ``fn(logits, temperature)`` against :func:`logitlab.softmax` (chapter 1)."""
    cases = list(_softmax_cases())
    for number, (name, logits, temperature, hint) in enumerate(cases, start=1):
        label = f"Case {number} of {len(cases)} ({name})"
        got = call_unchanged(fn, label, logits, temperature, what="the logits it was given")
        expected = softmax(logits, temperature)
        where = f"With logits {show(logits)} and temperature {temperature}"
        if not isinstance(got, torch.Tensor):
            raise CheckFailed(f"{label}: {where}, your function returned a {type(got).__name__}, not a tensor.")
        if got.shape != expected.shape:
            raise CheckFailed(
                f"{label}: {where}, your function returned shape {tuple(got.shape)}, "
                f"expected {tuple(expected.shape)}. {hint}"
            )
        got = got.cpu()  # the cases are CPU tensors; a student's answer may be on another device
        if not torch.allclose(got.double(), expected.double(), atol=1e-5, rtol=1e-4):
            raise CheckFailed(
                f"{label}: {where}, your function returned {show(got)}, "
                f"the right answer is {show(expected)}. {hint}"
            )
    print(f"check_softmax: all {len(cases)} cases passed.")


@asks_for(gumbel_max, add_gumbel_noise, sample)
def check_gumbel_max(fn, samples: int = 40_000) -> None:
    """Check ``fn(logits, generator)`` samples like ``softmax(logits)`` (chapter 1).

    Deterministic checks first (shape, dtype, same seed gives same tokens, impossible tokens
    never drawn), then a chi-square test of the frequencies against the exact probabilities,
    that the logits it is given are left as they were, and last the method case
    (:func:`_check_method`): the tokens of the exercise's method, for the same seed.
    The chi-square test rejects a correct sampler with probability 1e-4 (its false-positive
    rate); its seed is fixed, also while grading, so a correct function passes every time.
    """
    from scipy.stats import chisquare

    logits = torch.tensor([1.5, 1.0, 0.0, -0.5, float("-inf"), -2.0])
    batch = torch.stack([logits, logits.flip(0)])
    # The seeds of cases 1 to 5 are fixed, also while grading: on a hidden seed the chi-square test
    # would fail a correct sampler with its false-positive rate.
    label = "Case 1 of 5 (shape and dtype)"
    got = call(fn, label, batch.clone(), torch.Generator(device="cpu").manual_seed(0))
    if not isinstance(got, torch.Tensor) or got.shape != (2,) or got.dtype != torch.long:
        shown = f"shape {tuple(got.shape)}, dtype {got.dtype}" if isinstance(got, torch.Tensor) else type(got).__name__
        raise CheckFailed(f"{label}: for logits of shape [2, 6] return token ids of shape [2] and dtype long; got {shown}.")

    label = "Case 2 of 5 (reproducibility)"
    a = call(fn, label, batch.repeat(50, 1), torch.Generator(device="cpu").manual_seed(1))
    b = call(fn, label, batch.repeat(50, 1), torch.Generator(device="cpu").manual_seed(1))
    if not torch.equal(a, b):
        raise CheckFailed(f"{label}: the same seed gave different tokens. Draw all noise from the generator you are given.")

    label = "Case 3 of 5 (impossible tokens)"
    rows = batch.repeat(samples // 2, 1)
    tokens = call(fn, label, rows, torch.Generator(device="cpu").manual_seed(2)).reshape(-1, 2).cpu()
    if (tokens[:, 0] == 4).any() or (tokens[:, 1] == 1).any():
        raise CheckFailed(f"{label}: a token whose logit is -inf was drawn; it must have probability 0.")

    label = "Case 4 of 5 (the distribution)"
    for column, row in enumerate(batch):
        probs = softmax(row.double())
        counts = torch.bincount(tokens[:, column], minlength=6).double()
        possible = probs > 0
        expected = probs[possible] / probs[possible].sum() * counts.sum()
        pvalue = chisquare(counts[possible].numpy(), expected.numpy()).pvalue
        if pvalue < 1e-4:
            freq = (counts / counts.sum()).tolist()
            raise CheckFailed(
                f"{label}: for logits {show(row)} the frequencies of your samples "
                f"{[round(f, 3) for f in freq]} differ from the probabilities "
                f"{[round(p, 3) for p in probs.tolist()]} (chi-square p-value {pvalue:.1e}). "
                "Gumbel noise is -log(-log(U)) with U uniform on (0, 1), added to the logits."
            )

    label = "Case 5 of 5 (the logits left as they were)"
    given = batch.clone()
    call(fn, label, given, torch.Generator(device="cpu").manual_seed(3))
    if not torch.equal(given, batch):
        raise CheckFailed(f"{label}: your function changed the logits it was given, from {show(batch)} to "
                          f"{show(given)}. Add the noise to a copy: logits + gumbel, not logits += gumbel.")
    _check_method(fn)
    print("check_gumbel_max: all 5 cases passed, and the method case.")


def _check_method(fn, rows: int = 4000) -> None:
    """The exercise names its method: one uniform per logit, ``torch.rand(logits.shape,
    generator=generator)``, drawn first, then the argmax of the logits plus -log(-log(u)). So
    with a generator in the same state, ``fn`` gives the reference's tokens on (almost) every row
    (a rare row differs when two perturbed logits tie to rounding), and two seeds give different
    tokens. A sampler that is right in distribution only (torch.multinomial) or that ignores the
    generator fails here; the logits and the seeds come from the case generator."""
    label = "The method case (the reference's tokens for the same seed)"
    cases = case_generator(4)
    vocab = draw_int(cases, 2, 40)
    logits = 2 * torch.randn(rows, vocab, generator=cases)
    removed = torch.rand(rows, vocab, generator=cases) < 0.2  # some tokens at -inf ...
    removed[torch.arange(rows), logits.argmax(dim=-1)] = False  # ... but never a whole row
    logits = logits.masked_fill(removed, float("-inf"))
    seeds = [draw_int(cases, 0, 2**62) for _ in range(2)]
    got = []
    for seed in seeds:
        tokens = call(fn, label, logits.clone(), torch.Generator(device="cpu").manual_seed(seed))
        if not isinstance(tokens, torch.Tensor) or tokens.shape != (rows,):
            shown = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise CheckFailed(f"{label}: for logits of shape [{rows}, {vocab}] return {rows} token ids, got {shown}.")
        got.append(tokens.cpu().long())
    where = f"With logits of shape [{rows}, {vocab}]"
    if torch.equal(got[0], got[1]):
        raise CheckFailed(
            f"{label}: {where}, generators seeded {seeds[0]} and {seeds[1]} gave the same {rows} tokens; "
            "different seeds must give different tokens. Draw the noise from the generator you are given.")
    expected = add_gumbel_noise(logits, torch.Generator(device="cpu").manual_seed(seeds[0])).argmax(dim=-1)
    differ = (got[0] != expected).nonzero().squeeze(-1)
    if len(differ) > rows // 1000:  # 99.9% of the rows must agree
        row = int(differ[0])
        raise CheckFailed(
            f"{label}: {where} and a generator seeded {seeds[0]}, your tokens differ from the reference "
            f"method's on {len(differ)} of {rows} rows (row {row}: expected token {int(expected[row])}, got "
            f"{int(got[0][row])}). Draw the noise as the exercise says: one uniform per logit, "
            "u = torch.rand(logits.shape, generator=generator, device=logits.device), before anything else "
            "draws from the generator; then return the argmax of logits - log(-log(u)).")
