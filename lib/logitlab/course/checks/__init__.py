"""Exercise checkers: run a student's function against the library on many cases.

Each ``check_*`` function calls the student's function on a list of cases (ordinary ones first,
then the edge cases that catch real mistakes), compares with the library's reference, and
either prints how many cases passed (and returns nothing) or raises :class:`CheckFailed` describing the first case
that differs, in words: the input, what was expected, what came back, and a hint.

While the student's function runs, the library's code is traced (``common.library_watched``):
an answer that runs any library function its exercise does not give (the one it asks for, under
any name, or another) is told so, in words, naming the function, instead of passing.

Under ``common.hidden_cases(seed)`` (the grader), every check adds cases drawn from that seed to
the ones a student sees, so that an answer that stores the visible answers fails.

An exercise that has not been written yet (``raise NotImplementedError``) is not caught: the
error goes through unchanged, so a student sees exactly which exercise is still open.

The checks of each chapter are in their own module (``ch01_logits`` for chapter 1, and so on);
``common`` holds what they share. All of them are available here, as ``ll.checks.check_softmax``.
"""

from .ch01_logits import check_gumbel_max, check_softmax
from .ch02_truncation import check_top_k, check_top_p
from .ch03_repetition import check_frequency_penalty, check_stop_position
from .ch04_beam import check_backtrack, check_beam_step
from .ch05_trees import check_tree_mask, check_tree_positions
from .ch06_speculative import check_expected_tokens, check_verify
from .ch07_typical import check_match_probability, check_typical_accept
from .ch08_pass import check_single_call_layout, check_training_layout
from .ch09_eagle import check_after_rejection, check_keep_best
from .ch10_drafterless import check_suffix_automaton, check_tree_size
from .ch11_constrained import check_allowed_tokens, check_fewest_tokens, check_subset_construction, check_utf8_ranges
from .ch12_watermarks import check_green_z_score, check_tournament_round
from .ch13_choosing import check_best_gamma, check_truncation_distance
from .common import CheckFailed

__all__ = [
    "CheckFailed",
    "check_allowed_tokens",
    "check_fewest_tokens",
    "check_utf8_ranges",
    "check_subset_construction",
    "check_best_gamma",
    "check_green_z_score",
    "check_tournament_round",
    "check_suffix_automaton",
    "check_tree_size",
    "check_truncation_distance",
    "check_softmax",
    "check_gumbel_max",
    "check_top_k",
    "check_top_p",
    "check_frequency_penalty",
    "check_stop_position",
    "check_beam_step",
    "check_backtrack",
    "check_tree_mask",
    "check_tree_positions",
    "check_verify",
    "check_expected_tokens",
    "check_match_probability",
    "check_typical_accept",
    "check_training_layout",
    "check_single_call_layout",
    "check_after_rejection",
    "check_keep_best",
]
