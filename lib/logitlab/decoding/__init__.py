"""What every decoding loop of the book shares, written once.

Chapter 3 ("Repetition, stopping and the decoding loop") introduces the loop; the later loops
(beam search, token trees, speculative sampling, Medusa, PaSS) are built from the same pieces,
next to ``logitlab.devices`` (the model's device, a seeded generator on it, its exact dtype and
a clock that waits for the device) and ``logitlab.sampling.draw`` (one token from logits: ``choose``
and ``draw``):

* ``prompts``: ``prompt_batch`` turns text, lists of ids or a padded tensor into one left-padded
  batch and its attention mask; ``eos_ids`` the end-of-sequence ids into a list;
* ``passes``: ``forward`` (optionally returning the last hidden states, which Medusa heads and
  feature-level drafters read), and ``masked_forward`` and ``tree_forward`` (for a batch), the
  passes over new inputs that attend to each other through a custom pattern;
* ``tree_shape``: a token tree's attention mask and positions, and its bookkeeping;
* ``cache``: ``crop_cache``, ``roll_back`` (rejected drafts out of a batch's cache) and
  ``keep_in_block`` (each row's kept path of a tree), the only code that shortens a cache;
* ``static_cache``: a cache of fixed size written in place, which ``forward`` uses for a model
  on ``logitlab.fast_gpu``'s static path (the shapes a GPU records once and replays);
* ``result``: ``GenerationResult``, what every loop returns, and ``token_logprobs``;
* ``generate``: the loop itself (``ll.generate``).

The pieces the chapters call are here too: ``ll.decoding.forward``, ``ll.decoding.crop_cache``.
"""

from .cache import crop_cache, keep_in_block, roll_back
from .passes import Pass, additive_mask, forward, masked_forward, tree_forward
from .prompts import eos_ids, one_prompt, prompt_batch
from .result import GenerationResult, decode_texts, token_logprobs

__all__ = ["GenerationResult", "Pass", "additive_mask", "crop_cache", "decode_texts", "eos_ids", "forward",
           "keep_in_block", "masked_forward", "one_prompt", "prompt_batch", "roll_back", "token_logprobs",
           "tree_forward"]
