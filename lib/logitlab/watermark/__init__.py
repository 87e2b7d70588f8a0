"""Watermarks (chapter 12): a key hidden in how the next token is chosen, and its detectors.

``green_list``: Kirchenbauer et al.'s green list, a logit bias towards a keyed part of the
vocabulary, and its z-test. ``gumbel``: the Gumbel-max draw with keyed uniforms, an exact sample
of the model for a random key, and its score. ``synthid``: tournament sampling with keyed
g-values, and its mean score.
"""

from . import green_list, gumbel, synthid
from .green_list import GreenList
from .gumbel import GumbelWatermark
from .synthid import TournamentWatermark

__all__ = ["GreenList", "GumbelWatermark", "TournamentWatermark", "green_list", "gumbel", "synthid"]
