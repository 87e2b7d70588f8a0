"""Choosing the next token from logits (chapters 1-3).

* ``draw``: one token from logits: ``sample``, ``gumbel_max``, ``greedy`` (chapter 1);
* ``truncation``: the rules that cut the tail of the distribution: top-k, top-p, min-p, typical
  (chapter 2); ``cutoffs``: the newer cuts (epsilon, eta, top-H, top-nσ); ``adaptive``: the rules
  that draw a coin or follow the text's surprise (XTC, Mirostat);
* ``penalties`` (repetition, presence, frequency) and ``ngram_rules`` (no repeated n-gram, DRY,
  banned words, sequence bias): the rules that look at the text so far (chapter 3);
* ``pipeline``: ``SamplingConfig``, every setting at once, and ``next_token``, which applies them in
  one fixed order before the draw; the loops of chapters 3-9 take their tokens through it;
* ``hf_processor``: the base of every rule's Hugging Face ``LogitsProcessor`` class.
"""

from . import adaptive, cutoffs, draw, hf_processor, ngram_rules, penalties, pipeline, truncation

__all__ = ["adaptive", "cutoffs", "draw", "hf_processor", "ngram_rules", "penalties", "pipeline", "truncation"]
