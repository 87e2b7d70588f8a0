"""What the checks of several chapters share: the failure they raise, how they call a student's
function (with the library's own answer out of reach) and how they write tensors and lists into
their messages."""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect

import torch


class CheckFailed(AssertionError):
    """A student's function gave a wrong answer on one case (the message says which)."""


class LibraryCalled(BaseException):
    """Raised inside a student's function that called a library function its exercise asks
    for. A BaseException, so that a student's ``except Exception`` cannot swallow it."""


def _forbidden_call(*args, **kwargs):
    # Runs with the globals of the library module it replaces a function of: it can only reach
    # this module through __import__.
    raise __import__("logitlab.course.checks.common", fromlist=["LibraryCalled"]).LibraryCalled()


# The library functions the running check compares against: its exercise asks for them.
_forbidden: list = []


@contextlib.contextmanager
def own_work(*functions):
    """While a check runs, a call of any of ``functions`` from inside the student's function
    (directly, under another name, or through another ``ll.*`` function that uses it) fails with
    a message saying that the exercise asks for the student's own implementation. The check's
    own reference calls, made outside the student's function, are not affected."""
    _forbidden[:] = [inspect.unwrap(f) for f in functions]  # decorated: the function doing the work
    try:
        yield
    finally:
        _forbidden.clear()


def asks_for(*functions):
    """Decorator of a check whose exercise asks for the library ``functions`` (the function
    objects, e.g. ``probs.softmax``): the check runs under :func:`own_work` of them."""

    def decorate(check):
        @functools.wraps(check)
        def checked(*args, **kwargs):
            with own_work(*functions):
                return check(*args, **kwargs)

        checked.asks_for = functions  # the grader's sandbox imports their modules before it locks
        return checked

    return decorate


# The grader's seed for the checks' random cases, while it runs them (see hidden_cases).
_hidden: list[int] = []


@contextlib.contextmanager
def hidden_cases(seed: int):
    """While this is active, every check draws its random cases from ``seed`` (through
    :func:`case_generator`) instead of the fixed seeds written in the checks. The grader draws
    ``seed`` at grading time and never shows it: an answer that stores the answers to the cases
    a student can see (a lookup table) fails the cases it has never seen."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**62:
        raise ValueError(f"seed must be an int in [0, 2**62), got {seed!r}")
    _hidden[:] = [seed]
    try:
        yield
    finally:
        _hidden.clear()


def case_generator(public_seed: int) -> torch.Generator:
    """A CPU generator for a check's random cases: seeded with ``public_seed`` in a notebook (the
    same cases every run, for feedback), or, under :func:`hidden_cases`, with a seed made from the
    grader's hidden seed and ``public_seed`` (so that two generators of one check still differ)."""
    seed = public_seed if not _hidden else (_hidden[0] * 1_000_003 + public_seed) % 2**62
    return torch.Generator(device="cpu").manual_seed(seed)


def grading() -> bool:
    """True while the grader runs a check with hidden cases."""
    return bool(_hidden)


def draw_int(generator: torch.Generator, low: int, high: int) -> int:
    """A random int in ``[low, high)`` from a case generator, as a Python int."""
    return int(torch.randint(low, high, (), generator=generator))


def draw_float(generator: torch.Generator, low: float, high: float, digits: int) -> float:
    """A random float in ``[low, high]`` from a case generator, rounded to ``digits`` decimals:
    a message then shows the very number the case used."""
    u = float(torch.rand((), generator=generator, dtype=torch.float64))
    return round(low + (high - low) * u, digits)


def _names() -> str:
    return " or ".join(f"{f.__module__.replace('logitlab', 'll', 1)}.{f.__qualname__}" for f in _forbidden)


@contextlib.contextmanager
def library_out_of_reach():
    # Swap each forbidden function's code for one that raises: every reference to the function
    # object (ll.softmax, a name imported from logitlab.probs, the library's own internal calls)
    # then fails, which replacing module attributes would not achieve.
    saved = [(f, f.__code__) for f in _forbidden]
    try:
        for f, _ in saved:
            f.__code__ = _forbidden_call.__code__
        yield
    finally:
        for f, code in saved:
            f.__code__ = code


def show(t: torch.Tensor) -> str:
    """Small tensors written out (4 decimals), large ones by their shape."""
    if t.numel() > 12:
        return f"a tensor of shape {tuple(t.shape)}"
    t = t.cpu()  # a student's answer may be on another device; float64 is for CPU tensors
    return str(torch.round(t.double(), decimals=4).tolist()) if t.is_floating_point() else str(t.tolist())


def call(fn, case: str, *args):
    """``fn(*args)``, with the functions of :func:`own_work` out of reach; an error it raises
    becomes a :class:`CheckFailed` naming ``case``, except ``NotImplementedError`` (an exercise
    not written yet), which goes through unchanged."""
    try:
        with library_out_of_reach():
            return fn(*args)
    except NotImplementedError:
        raise
    except LibraryCalled:
        raise CheckFailed(
            f"{case}: your function called {_names()}, the library's own answer to this exercise. "
            "The exercise asks for your own implementation: write it with torch (or plain Python) "
            "operations instead.") from None
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
