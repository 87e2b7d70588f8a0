"""The base of the library's Hugging Face ``LogitsProcessor`` classes (``TopK``, ``MinP``,
``RepetitionPenalty``, ``DRY``, ...): each rule of this package also runs inside Hugging Face's
``generate``, where the tests compare it with Hugging Face's own processor for the same rule.
"""

from __future__ import annotations

from transformers import LogitsProcessor


class Processor(LogitsProcessor):
    """A rule as a Hugging Face ``LogitsProcessor``: called as ``(input_ids, scores)``, with a
    readable ``repr``. The base of every processor class here and in ``logitlab.sampling.penalties``.

    Each subclass's ``__call__`` checks ``scores`` before passing it on, so that a bad tensor
    is reported under the name Hugging Face gives it rather than the function's ``logits``.
    """

    def __repr__(self) -> str:
        args = ", ".join(f"{name}={value!r}" for name, value in vars(self).items())
        return f"{type(self).__name__}({args})"
