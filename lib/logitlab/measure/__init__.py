"""Measuring what the book's methods do: ``timing`` (a forward pass, the cost of a pass over n
tokens, side-by-side medians), ``metrics`` (diversity and repetition of generated text),
``exactness`` (how far a speculative loop's outputs are from the target's distribution),
``conditioning`` (masking against exact conditioning under a constraint), ``results`` (the
shipped benchmark runs, read back for the chapters) and ``table`` (the benchmark's table and the
machine it ran on).
"""
