"""The checks of chapter 2 (truncation): top-k and top-p."""

from __future__ import annotations

import torch

from ...sampling.truncation import top_k, top_p
from .common import CheckFailed, asks_for, call_unchanged, case_generator, show


def _check_truncation(fn, reference, cases, name: str, new_tensor: bool = False) -> None:
    """Shared by the truncation checks: same removed tokens (-inf) and same kept logits; with
    ``new_tensor``, the answer must not be the logits tensor it was given (nor a view of it)."""
    for number, (label, logits, arg, hint) in enumerate(cases, start=1):
        case = f"Case {number} of {len(cases)} ({label})"
        got = call_unchanged(fn, case, logits, arg, what="the logits it was given")
        expected = reference(logits, arg)
        where = f"With logits {show(logits)} and {name} = {arg}"
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            shown = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise CheckFailed(f"{case}: {where}, expected a tensor of shape {tuple(expected.shape)}, got {shown}.")
        if new_tensor and got.data_ptr() == logits.data_ptr():
            raise CheckFailed(
                f"{case}: {where}, your function returned the logits tensor it was given itself, not a new "
                "tensor: whoever changes the result in place would change the logits too. Return a copy "
                "(logits.clone()) even when nothing is removed."
            )
        got = got.cpu()  # the cases are CPU tensors; a student's answer may be on another device
        kept, should_keep = ~got.isneginf(), ~expected.isneginf()
        if not torch.equal(kept, should_keep):
            raise CheckFailed(
                f"{case}: {where}, your function keeps tokens {_kept(kept)}, "
                f"the right answer keeps {_kept(should_keep)}. {hint}"
            )
        if not torch.equal(got[kept], logits[kept]):
            raise CheckFailed(f"{case}: {where}, the kept tokens' logits changed; leave them as they are.")
    print(f"check_{name.replace('-', '_')}: all {len(cases)} cases passed.")


def _kept(mask: torch.Tensor) -> str:
    rows = mask.reshape(-1, mask.shape[-1])
    ids = [row.nonzero().squeeze(-1).tolist() for row in rows]
    return str(ids[0] if mask.dim() == 1 else ids)


@asks_for(top_k)
def check_top_k(fn) -> None:
    """Check ``fn(logits, k)`` against :func:`logitlab.sampling.truncation.top_k` (chapter 2)."""

    gen = case_generator(0)  # the random rows: the same in a notebook, unseen while grading
    inf = float("-inf")
    cases = [
        ("a small row", torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2, "Keep the k largest logits, set the rest to -inf."),
        ("k = 1 is greedy", torch.tensor([[0.5, -1.0, 2.5]]), 1, ""),
        ("a batch", torch.randn(3, 20, generator=gen), 5, "Each row keeps its own k largest (dim=-1)."),
        ("k larger than the vocabulary", torch.tensor([[1.0, 2.0]]), 5, "With k >= vocabulary size keep everything."),
        ("a tie at the k-th place", torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0]]), 2, (
            "Tokens tied with the k-th largest logit are all kept: remove only logits strictly "
            "below the k-th largest value."
        )),
        ("-inf entries", torch.tensor([[inf, 1.0, inf, 0.5, 0.0]]), 2, ""),
        ("one row without a batch dimension", torch.tensor([0.1, 0.4, 0.3]), 2, "Use dim=-1."),
        ("a three-dimensional batch", torch.randn(2, 3, 6, generator=gen), 3, (
            "Logits have shape [..., vocab]: work along dim=-1 and keep every leading dimension "
            "(the k-th largest of each row is torch.topk(logits, k, dim=-1).values[..., -1:])."
        )),
    ]
    _check_truncation(fn, top_k, cases, "top-k", new_tensor=True)


@asks_for(top_p)
def check_top_p(fn) -> None:
    """Check ``fn(logits, p)`` against :func:`logitlab.sampling.truncation.top_p` (chapter 2)."""
    import math

    gen = case_generator(0)  # the random rows: the same in a notebook, unseen while grading
    log = math.log
    # probabilities 1/2, 1/4, 3/16, 1/16: sums of these are exact in floating point
    dyadic = torch.tensor([[log(0.5), log(0.25), log(0.1875), log(0.0625)]])
    cases = [
        ("a small row", torch.tensor([[2.0, 1.0, 0.0, -1.0]]), 0.8, (
            "Sort by probability, keep the most likely tokens until their total reaches p."
        )),
        ("a prefix whose mass is exactly p", dyadic, 0.75, (
            "1/2 + 1/4 reaches 0.75 exactly, so the third token is not needed: keep a token only "
            "while the mass of the more likely tokens is still below p."
        )),
        ("p just above a prefix", dyadic, 0.76, "1/2 + 1/4 is below 0.76: one more token is needed."),
        ("p = 1 keeps every possible token", dyadic, 1.0, ""),
        ("tiny p keeps only the top token", torch.tensor([[0.0, 2.0, 1.0]]), 1e-6, "Always keep at least one token."),
        ("a batch of different rows", 3 * torch.randn(4, 30, generator=gen), 0.9, "Each row has its own nucleus."),
        ("-inf entries", torch.tensor([[float("-inf"), 1.0, 0.0, float("-inf"), 2.0]]), 0.7, (
            "Removed tokens have probability 0 and stay removed."
        )),
        ("unsorted input", torch.tensor([[0.0, 3.0, 1.0, 2.0]]), 0.9, "Return the logits in the original token order."),
    ]
    _check_truncation(fn, top_p, cases, "top-p")
