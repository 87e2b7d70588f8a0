"""How the book's drafters were trained: each is distilled from SmolLM2-135M's own output.

* ``data``: the training rows every trainer uses (the target's continuations of varied prompts,
  with its top-64 logits at every new position) and the prompts they come from.
* ``draft``: the one-layer draft model of chapter 6 (``python -m logitlab.training.draft``).
* ``medusa``: the Medusa heads of chapter 7 (``python -m logitlab.training.medusa``).
* ``lookahead``: the PaSS look-ahead embeddings of chapter 8
  (``python -m logitlab.training.lookahead``); ``train_lookahead`` also runs in the chapter.
* ``eagle``: the feature-level (EAGLE) drafter of chapter 9 (``python -m logitlab.training.eagle``).

Each module's docstring holds the exact command that made the shipped file, and why the
drafter is built the way it is.
"""

import importlib

__all__ = ["data", "draft", "eagle", "lookahead", "medusa"]


def __getattr__(name):
    # Imported on first use (``ll.training.data``), not with the package: ``python -m
    # logitlab.training.draft`` must find ``draft`` not yet imported, or runpy warns.
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
