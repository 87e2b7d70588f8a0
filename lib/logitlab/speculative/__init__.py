"""Speculative decoding (chapters 6-10): a drafter proposes, the target verifies in one pass.

* ``theory``: what drafting can gain (``acceptance_rate``, ``expected_tokens``, ``speedup``,
  ``greedy_chain_calls``);
* ``acceptance``: which drafts the target keeps (``verify``, ``RejectionSampling``, ``GreedyMatching``),
  and ``tree_verify`` for a tree of drafts; ``typical``: Medusa's typical acceptance (chapter 7);
* ``loop``: ``speculative_generate``, the one loop every drafter runs in; ``result``: what it returns;
* the drafters, each in its own module beside its model: ``drafter`` (the interface),
  ``draft_model`` and ``prompt_lookup`` (chapter 6), ``medusa`` and ``medusa_heads`` (chapter 7),
  ``pass_embeddings`` (PaSS, chapter 8), ``eagle`` (chapter 9); with no model at all
  (chapter 10), ``suffix_automaton`` (the text so far and a corpus), ``token_recycling`` (the
  target's own earlier guesses) and ``copy_or_recycle`` (the first where it matches, else the second); ``subset_head`` is the cheaper output layer two of them share.

The theory and the rules read as ``ll.speculative.speedup``, ``ll.speculative.verify``.
"""

from . import (
               copy_or_recycle,
               draft_model,
               drafter,
               eagle,
               medusa,
               medusa_heads,
               pass_embeddings,
               prompt_lookup,
               result,
               subset_head,
               suffix_automaton,
               theory,
               token_recycling,
               tree_verify,
               typical,
)
from .acceptance import AcceptanceRule, GreedyMatching, RejectionSampling, greedy_verify, verify
from .loop import speculative_generate
from .result import SpeculativeResult
from .theory import (acceptance_rate, examined_drafts, expected_tokens, greedy_chain_calls, loop_overhead, pooled_alpha,
                     speedup)

__all__ = ["AcceptanceRule", "GreedyMatching", "RejectionSampling", "SpeculativeResult", "acceptance_rate", "copy_or_recycle",
           "draft_model", "drafter", "eagle", "examined_drafts", "expected_tokens", "greedy_chain_calls",
           "greedy_verify", "loop_overhead", "medusa", "medusa_heads", "pass_embeddings", "pooled_alpha",
           "prompt_lookup", "result",
           "speculative_generate", "speedup", "subset_head", "suffix_automaton", "theory", "token_recycling",
           "tree_verify", "typical", "verify"]
