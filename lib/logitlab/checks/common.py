"""What the checks of several chapters share: the failure they raise, how they call a student's
function and how they write tensors and lists into their messages."""

from __future__ import annotations

import copy

import torch


class CheckFailed(AssertionError):
    """A student's function gave a wrong answer on one case (the message says which)."""


def show(t: torch.Tensor) -> str:
    """Small tensors written out (4 decimals), large ones by their shape."""
    if t.numel() > 12:
        return f"a tensor of shape {tuple(t.shape)}"
    t = t.cpu()  # a student's answer may be on another device; float64 is for CPU tensors
    return str(torch.round(t.double(), decimals=4).tolist()) if t.is_floating_point() else str(t.tolist())


def call(fn, case: str, *args):
    """``fn(*args)``; an error it raises becomes a :class:`CheckFailed` naming ``case``, except
    ``NotImplementedError`` (an exercise not written yet), which goes through unchanged."""
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:  # the student's error, reported with the case that caused it
        raise CheckFailed(f"{case}: your function raised {type(exc).__name__}: {exc}") from exc


def call_unchanged(fn, case: str, *args, what: str = "its inputs"):
    """``call(fn, case, *args)``, failing if ``fn`` changed any of its tensor or list arguments
    in place (``what`` names them in the message)."""
    originals = [copy.deepcopy(a) for a in args]
    got = call(fn, case, *args)
    for a, original in zip(args, originals):
        if not (torch.equal(a, original) if isinstance(a, torch.Tensor) else a == original):
            raise CheckFailed(f"{case}: your function changed {what} (work on a copy).")
    return got


def as_list(got):
    """A parents list as a plain list, whether a student returned a list, a tuple or a tensor."""
    if isinstance(got, torch.Tensor):
        return got.tolist()
    return list(got) if isinstance(got, (list, tuple)) else got
