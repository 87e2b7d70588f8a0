"""The checks of chapter 3 (repetition, stopping and the decoding loop): the frequency penalty and
where a stop string starts."""

from __future__ import annotations

import torch

from ...decoding.generate import find_stop
from ...sampling.penalties import frequency_penalty
from .common import CheckFailed, asks_for, call, call_unchanged, case_generator, draw_int, show


def _frequency_cases():
    """(name, logits, prev_tokens, penalty, hint) for check_frequency_penalty."""
    gen = case_generator(0)  # the random batch: the same in a notebook, unseen while grading
    inf = float("-inf")
    row = torch.tensor([[1.0, 2.0, -1.0, 0.5]])
    count_hint = "Subtract penalty * count, where count is how often the token occurs in prev_tokens."
    cases = [
        ("each earlier token once", row, torch.tensor([[0, 2]]), 0.5, count_hint),
        ("a token seen three times", row, torch.tensor([[1, 3, 1, 1]]), 0.5, (
            "The frequency penalty grows with the count: a token seen 3 times loses 3 * penalty "
            "(subtracting once per distinct token is the presence penalty)."
        )),
        ("padding (-1) in prev_tokens", row, torch.tensor([[-1, -1, 2, 2]]), 1.0, (
            "Negative entries are padding and must not be counted (as an index, -1 is the last token)."
        )),
        ("an empty history", row, torch.empty(1, 0, dtype=torch.long), 0.7, (
            "With no earlier token nothing changes; prev_tokens has shape [batch, 0]."
        )),
        ("a batch: each row counts its own history", torch.zeros(2, 4), torch.tensor([[0, 0, 1], [3, -1, 3]]), 1.0, (
            "Row i is penalised by the tokens of prev_tokens[i] only."
        )),
        ("a negative penalty", row, torch.tensor([[1, 1, 2]]), -0.5, (
            "A negative penalty raises the logits of earlier tokens: still logits - penalty * count."
        )),
        ("-inf logits", torch.tensor([[inf, 1.0, inf, 0.0]]), torch.tensor([[0, 0, 1, 2]]), 0.5, (
            "A removed token (logit -inf) stays removed."
        )),
        ("a random batch with padding", 3 * torch.randn(4, 50, generator=gen),
         torch.randint(-1, 50, (4, 30), generator=gen), 0.3, count_hint),
        ("padding written as -100", row, torch.tensor([[3, -100, 3, -100, 0]]), 1.0, (
            "Every negative entry is padding, not only -1: leave out prev_tokens < 0, not just prev_tokens == -1."
        )),
    ]
    return cases


@asks_for(frequency_penalty)
def check_frequency_penalty(fn) -> None:
    """Check ``fn(logits, prev_tokens, penalty)`` against
    :func:`logitlab.sampling.penalties.frequency_penalty` (chapter 3): the same logits, in a new tensor."""

    cases = _frequency_cases()
    for number, (name, logits, prev_tokens, penalty, hint) in enumerate(cases, start=1):
        label = f"Case {number} of {len(cases)} ({name})"
        got = call_unchanged(fn, label, logits, prev_tokens, penalty)
        expected = frequency_penalty(logits, prev_tokens, penalty)
        where = f"With logits {show(logits)}, prev_tokens {show(prev_tokens)} and penalty {penalty}"
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            shown = f"shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else f"a {type(got).__name__}"
            raise CheckFailed(f"{label}: {where}, expected a tensor of shape {tuple(expected.shape)}, got {shown}.")
        if got.data_ptr() == logits.data_ptr():
            raise CheckFailed(f"{label}: {where}, your function returned the logits tensor it was given itself; "
                              "return new logits (logits - penalty * counts is a new tensor, even when the "
                              "counts are all 0).")
        got = got.cpu()  # the cases are CPU tensors; a student's answer may be on another device
        same = (got == expected) | (got - expected).abs().le(1e-5)  # -inf == -inf counts as the same
        if not bool(same.all()):
            r, i = (~same).nonzero()[0].tolist()
            raise CheckFailed(
                f"{label}: {where}, your function returned {show(got)}, the right answer is "
                f"{show(expected)} (first difference: row {r}, token {i}: {got[r, i].item():.4f} "
                f"instead of {expected[r, i].item():.4f}). {hint}"
            )
    print(f"check_frequency_penalty: all {len(cases)} cases passed.")


def _stop_cases():
    """(name, pieces, stops, hint) for check_stop_position."""
    spans = "The stop string is split over several tokens: search the joined text, not each piece."
    cases = [
        ("a stop inside one piece", ["Hello", " world", ".\n\n", "Next"], ["\n\n"], ""),
        ("a stop spanning two pieces", [" Paris", ".", "\n", "\n", "The"], ["\n\n"], spans),
        ("a stop spanning three pieces", [" Berlin", ".", "\n", "Question", ":", " What"], ["\nQuestion:"], spans),
        ("a stop starting in the middle of a piece", [" Paris", ".", "\n"], ["ris."], (
            "A stop string can start anywhere, also inside a piece; return a character index."
        )),
        ("two stops, the later-listed one starts earlier", ["one", " two", " three"], [" three", " two"], (
            "Return where the earliest stop string starts, whichever stop it is, not the first stop of the list."
        )),
        ("a stop that occurs twice", ["a", "X", "b", "X"], ["X"], "Return the first occurrence."),
        ("an empty piece", ["Hi", "", "\n", "", "\n", "there"], ["\n\n"], "Some tokens decode to no text."),
        ("no stop", ["The", " end", "."], ["\n\n", "###"], "Return -1 when no stop string occurs."),
        ("a stop at the very start", ["\n", "\n", "Next"], ["\n\n"], "0 is a position like any other."),
        ("no pieces yet", [], ["\n\n"], "Return -1 when no stop string occurs."),
        ("two stops, only one occurs", ["Answer", ":", " 42", "\n\n", "Question"], ["###", "\n\n"], (
            "A stop that does not occur has find() == -1: leave it out before taking the minimum, "
            "or -1 wins whenever some stop is missing."
        )),
        ("a stop at the very end", ["The", " end", ".", "\n", "\n"], ["\n\n"], (
            "A stop may end with the last character: it can start at len(text) - len(stop), "
            "so a loop over start positions must include that one."
        )),
        ("a stop after a partial match of itself", ["Paris.", "\n", "\n", "\n", "Question"], ["\n\nQuestion"], (
            "The text has three newlines: a match that starts at the first one fails at the third, "
            "and the stop starts one character later. Search the joined text with str.find rather "
            "than matching character by character."
        )),
        ("a stop with characters special in regular expressions", ["a", "xb a", ".b"], ["a.b"], (
            "Stop strings are plain text: in a regular expression '.' matches any character, so "
            "use str.find (or re.escape each stop)."
        )),
        ("no stop strings at all", ["Some", " text"], [], (
            "With an empty list of stops nothing can stop the text: return -1 "
            "(an empty regular expression would match at 0)."
        )),
    ]
    return cases


def _random_stop_cases(count: int = 12):
    """(pieces, stops) drawn from the case generator: short pieces and stops over four characters;
    in two cases of three one stop is cut from the text itself (often across pieces), so that
    both answers, a position and -1, come up."""
    gen = case_generator(3)
    alphabet = "ab.\n"

    def text(low, high):
        return "".join(alphabet[draw_int(gen, 0, len(alphabet))] for _ in range(draw_int(gen, low, high)))

    for _ in range(count):
        pieces = [text(0, 4) for _ in range(draw_int(gen, 1, 8))]
        stops = [text(1, 4) for _ in range(draw_int(gen, 1, 3))]
        joined = "".join(pieces)
        if joined and draw_int(gen, 0, 3) > 0:
            start = draw_int(gen, 0, len(joined))
            stops.insert(draw_int(gen, 0, len(stops) + 1), joined[start:start + draw_int(gen, 1, 5)])
        yield pieces, stops


@asks_for(find_stop)
def check_stop_position(fn) -> None:
    """Check ``fn(pieces, stops)`` against :func:`logitlab.decoding.generate.find_stop` applied to
    ``"".join(pieces)`` (chapter 3): the hand cases, then random ones."""

    cases = _stop_cases()
    for number, (name, pieces, stops, hint) in enumerate(cases, start=1):
        _compare_stop(fn, f"Case {number} of {len(cases)} ({name})", pieces, stops, hint)
    random = list(_random_stop_cases())
    for number, (pieces, stops) in enumerate(random, start=1):
        _compare_stop(fn, f"Random case {number} of {len(random)}", pieces, stops,
                      "Search the joined text for every stop: the earliest start wins, -1 if none occurs.")
    print(f"check_stop_position: all {len(cases)} cases passed, and {len(random)} random ones.")


def _compare_stop(fn, label: str, pieces: list, stops: list, hint: str) -> None:
    got = call(fn, label, list(pieces), list(stops))
    expected = find_stop("".join(pieces), stops)
    where = f"With pieces {pieces!r} and stops {stops!r}"
    if isinstance(got, bool) or not isinstance(got, int):
        raise CheckFailed(f"{label}: {where}, your function returned {got!r}, not an int. {hint}")
    if got != expected:
        raise CheckFailed(f"{label}: {where}, your function returned {got}, the right answer is {expected}. {hint}")
