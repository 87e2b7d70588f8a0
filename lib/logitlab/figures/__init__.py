"""The book's figures: ``viz`` (plots and tables) and ``widgets`` (the interactive ones).

Both need matplotlib, so ``import logitlab`` does not load them; ``ll.viz`` and ``ll.widgets`` do,
on first use.
"""
