"""What the checks of several chapters share: the failure they raise, how they call a student's
function (watching that it runs no library code its exercise does not allow) and how they write tensors and lists into
their messages."""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import sys

import torch


class CheckFailed(AssertionError):
    """A student's function gave a wrong answer on one case (the message says which)."""


class LibraryCalled(BaseException):
    """Raised when the library's own code ran inside a student's function where its exercise
    does not allow it (``args[0]``: the function that ran). A BaseException, so that a
    student's ``except Exception`` cannot swallow it."""


# While a check runs: the library functions its exercise allows a student's function to call.
_allowed: list = []


@contextlib.contextmanager
def own_work(*allowed):
    """While a check runs, a student's function may run no code of the library (``logitlab``)
    except ``allowed`` (function objects) and what they call: not the function the exercise asks
    for, under any name (``ll.softmax``, a copy, ``ll.log_softmax(x).exp()``), nor any other.
    The check's own reference calls, made outside the student's function, are not affected."""
    _allowed[:] = [inspect.unwrap(f) for f in allowed]  # decorated: the function doing the work
    try:
        yield
    finally:
        _allowed.clear()


def asks_for(*functions, allows=()):
    """Decorator of a check whose exercise asks for the library ``functions`` (the function
    objects, e.g. ``probs.softmax``; named in the check's documentation and messages): while the
    check runs, a student's function may call no library code but ``allows``."""

    def decorate(check):
        @functools.wraps(check)
        def checked(*args, **kwargs):
            with own_work(*allows):
                return check(*args, **kwargs)

        checked.asks_for, checked.allows = functions, allows  # the grader sends the allowed ones to its sandbox
        return checked

    return decorate


def library_tracer(allowed_codes, armed: list, on_library, package: str = "logitlab", exempt=frozenset()):
    """A trace function for :func:`sys.settrace` that calls ``on_library(name)`` when a function of
    ``package`` starts while ``armed[0]`` is true, unless one of the frames it runs under (itself
    included) runs a code object of ``allowed_codes``, or its module is in ``exempt``.

    Tracing sees the code that runs, whatever name it was reached by: a function imported under
    another name, a copy of its code, another library function that uses it. It looks only at
    function starts ("call" events) and returns None, so that no line of any frame is traced.
    Everything it uses is bound here, so that changing builtins later cannot change it (the
    grader's sandbox relies on that)."""
    get, startswith, is_str, str_type = dict.get, str.startswith, isinstance, str

    def trace(frame, event, arg):
        if not armed[0] or event != "call":
            return None
        name = get(frame.f_globals, "__name__")
        if not is_str(name, str_type) or not startswith(name, package) or name in exempt:
            return None
        outer = frame
        while outer is not None:
            if outer.f_code in allowed_codes:
                return None
            outer = outer.f_back
        on_library(f"{name}.{frame.f_code.co_name}")
        return None

    return trace


@contextlib.contextmanager
def library_watched():
    """Run the body with :func:`library_tracer` on: a library function it runs that the current
    check does not allow raises :class:`LibraryCalled` when the body ends."""
    seen, armed = [], [True]
    # Exempt: this module (leaving the with-block resumes this generator before it is disarmed),
    # and the grader's stand-in for a student's function, which calls it in its sandbox.
    exempt = frozenset({"logitlab", __name__, "logitlab.course.sandbox", "logitlab.course.wire"})
    trace = library_tracer(frozenset(f.__code__ for f in _allowed), armed, seen.append, exempt=exempt)
    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield
    finally:
        armed[0] = False
        sys.settrace(previous)
    if seen:
        raise LibraryCalled(seen[0])


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


def show(t: torch.Tensor) -> str:
    """Small tensors written out (4 decimals), large ones by their shape."""
    if t.numel() > 12:
        return f"a tensor of shape {tuple(t.shape)}"
    t = t.cpu()  # a student's answer may be on another device; float64 is for CPU tensors
    return str(torch.round(t.double(), decimals=4).tolist()) if t.is_floating_point() else str(t.tolist())


def call(fn, case: str, *args):
    """``fn(*args)``, watched for library code (:func:`library_watched`); an error it raises
    becomes a :class:`CheckFailed` naming ``case``, except ``NotImplementedError`` (an exercise
    not written yet), which goes through unchanged."""
    try:
        with library_watched():
            return fn(*args)
    except NotImplementedError:
        raise
    except LibraryCalled as called:
        name = str(called.args[0]).replace("logitlab", "ll", 1) if called.args else "the library"
        raise CheckFailed(
            f"{case}: your function ran the library's own code ({name}). The exercise asks for your "
            "own implementation: write it with torch (or plain Python) operations, and use the "
            "library only where the exercise says so.") from None
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
