"""Constrained decoding (chapter 11): outputs that must match a pattern.

``regex`` compiles a regular expression into a byte automaton, ``json_schema`` writes a JSON
Schema as one; ``vocabulary`` reads a tokenizer's tokens as bytes, ``index`` walks every token
from every state of the automaton once, and ``constraint`` turns that into one token mask per
step: ``Constraint``, which the book's loops take (``ll.generate(..., constraint=)``), and the
row helpers the loops use.
"""

from . import index, json_schema, regex, vocabulary
from .constraint import Constraint, DraftStates, advance_rows, constraint_rows, mask_rows, state_after

__all__ = ["Constraint", "DraftStates", "advance_rows", "constraint_rows", "index", "json_schema", "mask_rows", "regex",
           "state_after", "vocabulary"]
