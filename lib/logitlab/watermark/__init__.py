"""Watermarks (chapter 12): a key hidden in how the next token is chosen, and its detectors.

``green_list``: Kirchenbauer et al.'s green list, a logit bias towards a keyed part of the
vocabulary, and its z-test. ``gumbel``: the Gumbel-max draw with keyed uniforms, an exact sample
of the model for a random key, and its score. ``synthid``: tournament sampling with keyed
g-values, and its mean score. ``speculation``: speculative sampling whose every random choice is
the key's (a keyed draft model and acceptance rule), watermarked at no cost in acceptance.
"""

from . import green_list, gumbel, speculation, synthid
from .green_list import GreenList
from .gumbel import GumbelWatermark
from .speculation import KeyedDraftModel, KeyedRejectionSampling
from .synthid import TournamentWatermark

__all__ = ["GreenList", "GumbelWatermark", "KeyedDraftModel", "KeyedRejectionSampling", "TournamentWatermark",
           "green_list", "gumbel", "speculation", "synthid"]
