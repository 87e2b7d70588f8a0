"""Chapter 3's exercise checkers accept the library's answers and reject typical wrong ones."""

import re

import pytest
import torch

from logitlab.course.checks import CheckFailed, check_frequency_penalty, check_stop_position
from logitlab.decoding.generate import find_stop as library_find_stop
from logitlab.sampling.penalties import frequency_penalty as library_frequency_penalty
from test_checks_and_viz import student_copy

pytestmark = pytest.mark.usefixtures("untraced")  # the right answers are the library's code

# Answers written like the library's (a student's copy: the checks forbid calling the library's own).
find_stop, frequency_penalty = student_copy(library_find_stop), student_copy(library_frequency_penalty)


def test_check_frequency_penalty_accepts_the_reference(capsys):
    check_frequency_penalty(frequency_penalty)
    assert "all 9 cases passed" in capsys.readouterr().out


def counts(logits, prev_tokens):
    """How often each token occurs in each row, padding (negative ids) left out."""
    valid = prev_tokens >= 0
    c = torch.zeros(logits.shape, dtype=logits.dtype)
    return c.scatter_add(-1, prev_tokens.clamp_min(0), valid.to(logits.dtype))


def presence_instead(logits, prev_tokens, penalty):
    return logits - penalty * (counts(logits, prev_tokens) > 0).to(logits.dtype)


def counts_padding(logits, prev_tokens, penalty):
    wrapped = prev_tokens % logits.shape[-1]  # -1 becomes the last token
    return logits - penalty * counts(logits, wrapped)


def pools_the_batch(logits, prev_tokens, penalty):
    pooled = counts(logits, prev_tokens).sum(dim=0, keepdim=True)
    return logits - penalty * pooled


def in_place(logits, prev_tokens, penalty):
    logits -= penalty * counts(logits, prev_tokens)
    return logits


def absolute_penalty(logits, prev_tokens, penalty):
    return logits - abs(penalty) * counts(logits, prev_tokens)


def loses_minus_inf(logits, prev_tokens, penalty):
    return torch.nan_to_num(logits - penalty * counts(logits, prev_tokens), neginf=-1e4)


def needs_a_history(logits, prev_tokens, penalty):
    prev_tokens.max()  # fails on an empty history
    return logits - penalty * counts(logits, prev_tokens)


def bincount_per_row(logits, prev_tokens, penalty):
    rows = [torch.bincount(p, minlength=logits.shape[-1]) for p in prev_tokens]  # -1 raises
    return logits - penalty * torch.stack(rows)


def only_minus_one_is_padding(logits, prev_tokens, penalty):
    valid = prev_tokens != -1  # -100, also padding, is counted as token 0
    c = torch.zeros(logits.shape, dtype=logits.dtype).scatter_add(-1, prev_tokens.clamp_min(0), valid.to(logits.dtype))
    return logits - penalty * c


def nothing_to_subtract(logits, prev_tokens, penalty):
    if prev_tokens.shape[-1] == 0:
        return logits  # the caller's own tensor, not new logits
    return logits - penalty * counts(logits, prev_tokens)


@pytest.mark.parametrize(
    "fn, message",
    [
        (only_minus_one_is_padding, "Case 9 of 9 \\(padding written as -100\\).*not just prev_tokens == -1"),
        (nothing_to_subtract, "Case 4 of 9 \\(an empty history\\).*returned the logits tensor it was given itself"),
        (presence_instead, "Case 2 of 9 \\(a token seen three times\\).*presence penalty"),
        (counts_padding, "Case 3 of 9 \\(padding \\(-1\\) in prev_tokens\\).*row 0, token 3"),
        (needs_a_history, "Case 4 of 9 \\(an empty history\\): your function raised RuntimeError"),
        (pools_the_batch, "Case 5 of 9 \\(a batch: each row counts its own history\\)"),
        (absolute_penalty, "Case 6 of 9 \\(a negative penalty\\)"),
        (loses_minus_inf, "Case 7 of 9 \\(-inf logits\\).*stays removed"),
        (bincount_per_row, "Case 3 of 9 .*raised RuntimeError"),
        (in_place, "Case 1 of 9 .*changed its inputs"),
        (lambda logits, prev_tokens, penalty: logits.tolist(), "Case 1 of 9 .*got a list"),
        (lambda logits, prev_tokens, penalty: logits[0], "Case 1 of 9 .*got shape \\(4,\\)"),
    ],
)
def test_check_frequency_penalty_explains_the_first_wrong_case(fn, message):
    with pytest.raises(CheckFailed, match=message):
        check_frequency_penalty(fn)


def reference_stop_position(pieces, stops):
    return find_stop("".join(pieces), stops)


def test_check_stop_position_accepts_the_reference(capsys):
    check_stop_position(reference_stop_position)
    assert "all 15 cases passed" in capsys.readouterr().out


def each_piece_alone(pieces, stops):
    offset = 0
    for piece in pieces:
        found = [piece.find(s) for s in stops if s in piece]
        if found:
            return offset + min(found)
        offset += len(piece)
    return -1


def first_listed_stop(pieces, stops):
    text = "".join(pieces)
    for s in stops:
        if s in text:
            return text.find(s)
    return -1


def last_occurrence(pieces, stops):
    text = "".join(pieces)
    return min((text.rfind(s) for s in stops if s in text), default=-1)


def piece_index(pieces, stops):
    text, ends = "", []
    for piece in pieces:
        text += piece
        ends.append(len(text))
    start = find_stop(text, stops)
    return -1 if start < 0 else next(i for i, end in enumerate(ends) if end > start)


def none_when_missing(pieces, stops):
    start = find_stop("".join(pieces), stops)
    return None if start < 0 else start


def truthy_position(pieces, stops):
    start = find_stop("".join(pieces), stops)
    return start if start else -1  # 0 is falsy: a stop at the start is missed


def minimum_with_missing_stops(pieces, stops):
    text = "".join(pieces)
    return min((text.find(s) for s in stops), default=-1)  # a missing stop's -1 wins the minimum


def start_loop_one_short(pieces, stops):
    text = "".join(pieces)
    for i in range(len(text)):
        for s in stops:
            if i < len(text) - len(s) and text[i:i + len(s)] == s:  # misses a stop ending the text
                return i
    return -1


def character_by_character(pieces, stops):
    found = []
    for stop in stops:  # a streaming matcher that forgets a restart inside a failed partial match
        matched, position = 0, 0
        for piece in pieces:
            for ch in piece:
                if ch == stop[matched]:
                    matched += 1
                    if matched == len(stop):
                        found.append(position - len(stop) + 1)
                        break
                else:
                    matched = 1 if ch == stop[0] else 0
                position += 1
            else:
                continue
            break
    return min(found, default=-1)


def regular_expression(pieces, stops):
    match = re.search("|".join(stops), "".join(pieces))  # stops not escaped
    return match.start() if match else -1


def escaped_regular_expression(pieces, stops):
    match = re.search("|".join(map(re.escape, stops)), "".join(pieces))
    return match.start() if match else -1


@pytest.mark.parametrize(
    "fn, message",
    [
        (minimum_with_missing_stops, "Case 11 of 15 \\(two stops, only one occurs\\).*returned -1, the right answer is 10"),
        (start_loop_one_short, "Case 12 of 15 \\(a stop at the very end\\).*returned -1, the right answer is 8"),
        (character_by_character,
         "Case 13 of 15 \\(a stop after a partial match of itself\\).*returned -1, the right answer is 7"),
        (regular_expression,
         "Case 14 of 15 \\(a stop with characters special in regular expressions\\).*returned 0, the right answer is 4"),
        (escaped_regular_expression, "Case 15 of 15 \\(no stop strings at all\\).*returned 0, the right answer is -1"),
        (each_piece_alone, "Case 2 of 15 \\(a stop spanning two pieces\\).*returned -1, the right answer is 7"),
        (first_listed_stop, "Case 5 of 15 \\(two stops, the later-listed one starts earlier\\).*returned 7"),
        (last_occurrence, "Case 6 of 15 \\(a stop that occurs twice\\).*returned 3, the right answer is 1"),
        (piece_index, "Case 1 of 15 .*returned 2, the right answer is 12"),
        (none_when_missing, "Case 8 of 15 \\(no stop\\).*returned None, not an int"),
        (truthy_position, "Case 9 of 15 \\(a stop at the very start\\)"),
        (lambda pieces, stops: 1 / 0, "Case 1 of 15 .*raised ZeroDivisionError"),
    ],
)
def test_check_stop_position_explains_the_first_wrong_case(fn, message):
    with pytest.raises(CheckFailed, match=message):
        check_stop_position(fn)


def test_unwritten_exercises_raise_not_implemented_unchanged():
    def unwritten(*args):
        raise NotImplementedError("Exercise: write your solution here")

    with pytest.raises(NotImplementedError):
        check_frequency_penalty(unwritten)
    with pytest.raises(NotImplementedError):
        check_stop_position(unwritten)
