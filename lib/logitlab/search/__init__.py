"""Searching for good continuations (chapters 4 and 5): ``beam`` (beam search, with its
constraint, length penalty and stopping rules), ``best_of_n`` (N samples, the best kept by a
score) and ``trees`` (token trees sampled and scored a level at a time, one forward pass per
tree).
"""
