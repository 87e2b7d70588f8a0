"""The draft model (chapter 6): a small language model that proposes the tokens the target verifies.

Every drafter implements ``drafter.Drafter``, the interface ``ll.speculative_generate`` calls
(``start``, ``propose``, ``rollback``, ``select_rows``). Any proposal keeps the output exact (that
is the point of the verification), so a drafter is judged only by how often its proposals are
accepted and by what it costs. The drafters, each in its own module:

* ``DraftModelDrafter`` (here): a small language model with the target's tokenizer, sampling its
  proposals one at a time from its own (processed) distribution, with its own KV cache rolled
  back like the target's. ``load_pretrained(target)`` gives the book's own draft model for
  SmolLM2-135M (one transformer layer trained by ``python -m logitlab.training.draft``; it shares
  the target's embedding, so only the layer and a norm are shipped, and its output layer
  (``subset_head.SubsetHead``) scores only the 2048 tokens SmolLM2 uses most, the cheapest way
  found to make a draft step cheap).
* ``prompt_lookup.PromptLookupDrafter``: no model at all; what followed an earlier occurrence of
  the context's last tokens (summaries, edits, code copy from their input).
* ``medusa.MedusaDrafter`` (chapter 7): Medusa heads (``medusa_heads``) guessing from the
  target's own last hidden state.
* ``pass_embeddings.LookaheadEmbeddings`` (chapter 8, PaSS): the target drafts for itself, fed a
  few learned look-ahead embeddings after the context.
* ``eagle.EagleDrafter`` (chapter 9): a one-layer drafter over the target's features.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .. import fast_cpu, fast_gpu
from .._validate import check_flag, check_processors, check_smollm2
from ..decoding.cache import roll_back
from ..decoding.passes import forward, mask_positions, prefill
from ..sampling.pipeline import draw
from .drafter import Drafter
from .subset_head import SubsetHead


class DraftModelDrafter(Drafter):
    """Proposals sampled from a small model, one forward pass per proposed token."""

    def __init__(self, model, logits_processor=None):
        if not isinstance(model, torch.nn.Module) or not hasattr(getattr(model, "config", None), "vocab_size"):
            raise ValueError("model must be a causal language model with config.vocab_size")
        self.model = model
        self.vocab_size = int(model.config.vocab_size)
        # Processors of the draft's logits (a watermark, chapter 12), called as in ll.generate.
        self.processors = check_processors(logits_processor)
        self.reads_text = bool(self.processors)

    @torch.inference_mode()
    def start(self, input_ids, attention_mask, target=None, cache=None) -> None:
        step = prefill(self.model, input_ids, attention_mask)
        self.cache, self.mask = step.cache, attention_mask
        # A proposal that was accepted but never fed to the draft model (the last of a fully
        # accepted draft): it must go in before the next token. -1: none.
        self.unfed = torch.full((input_ids.shape[0],), -1, dtype=torch.long, device=input_ids.device)
        self.any_unfed = False
        self.steps = 1  # forward passes of the draft model, this prefill included

    @torch.inference_mode()
    def propose(self, next_tokens, gamma, config, generator=None):
        # Feed what the draft model has not seen: (the unfed proposal and) the target's token.
        any_unfed = bool((self.unfed >= 0).any()) if self.any_unfed is None else self.any_unfed
        if any_unfed:  # (read from the device only where the loop did not say)
            feed = torch.stack([self.unfed.clamp_min(0), next_tokens], dim=1)
            new_mask = torch.stack([(self.unfed >= 0).long(), torch.ones_like(next_tokens)], dim=1)
        else:
            feed, new_mask = next_tokens[:, None], torch.ones_like(next_tokens)[:, None]
        tokens, qs = [], []
        for i in range(gamma):
            token, q = self.sample(self.constrained(self._forward(feed, new_mask)), config, generator, tokens)
            self.drafted(token)
            tokens.append(token)
            qs.append(q)
            if i < gamma - 1:  # the last proposal is not fed now (it may be rejected anyway)
                feed, new_mask = token[:, None], torch.ones_like(token)[:, None]
        self.proposed = torch.stack(tokens, dim=1)
        return self.proposed, torch.stack(qs, dim=1)

    def sample(self, logits, config, generator, drafted: list[torch.Tensor]):
        """One proposal per row and the distribution it came from, ``(tokens [B], q [B, V])``,
        from the draft's logits after the text so far and the tokens ``drafted`` this call."""
        for processor in self.processors:
            logits = processor(self.context(drafted), logits)
        return draw(logits, config, generator)

    def context(self, drafted: list[torch.Tensor]) -> torch.Tensor:
        """Each row's text so far (``text``, set by the loop) and the tokens drafted after it."""
        return torch.cat([self.text, *(token[:, None] for token in drafted)], dim=1)

    def _forward(self, feed, new_mask):
        self.mask = torch.cat([self.mask, new_mask], dim=1)
        positions = mask_positions(self.mask, last=feed.shape[1])
        step = forward(self.model, input_ids=feed, attention_mask=self.mask, position_ids=positions,
                       cache=self.cache, logits_to_keep=1)
        self.cache = step.cache
        self.steps += 1
        return step.logits[:, -1]

    def rollback(self, num_accepted: torch.Tensor, kept: list[int] | None = None) -> None:
        gamma = self.proposed.shape[1]
        # Proposals 1 .. gamma - 1 are in the cache (the last was drawn, never fed).
        self.mask = roll_back(self.cache, self.mask, gamma - 1, num_accepted, None if kept is None else max(kept))
        self.unfed = torch.where(num_accepted == gamma, self.proposed[:, -1], torch.full_like(num_accepted, -1))
        self.any_unfed = None if kept is None else gamma in kept  # known without a read

    def select_rows(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.mask, self.unfed = self.mask[keep], self.unfed[keep]



# The shipped draft for SmolLM2-135M: its one layer and final norm in float16, and the ids of
# the tokens its output layer scores (the embedding is the target's own and is not stored).
# Written by python -m logitlab.training.draft.
PRETRAINED_DRAFT = Path(__file__).resolve().parents[1] / "data" / "draft_smollm2_135m.safetensors"


def build_draft(target, init_layer: int = 0, num_layers: int = 1):
    """A Llama with ``num_layers`` layers and the target's shape, started from the target's weights.

    The embedding (tied to the output layer) is the target's own module, shared rather than
    copied (no second 28M-parameter table in memory), and frozen; only the layers and the
    final norm train.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**{**target.config.to_dict(), "num_hidden_layers": num_layers, "tie_word_embeddings": True})
    draft = LlamaForCausalLM(cfg).to(device=target.device, dtype=target.dtype)
    draft.model.embed_tokens = target.model.embed_tokens
    with torch.no_grad():
        n = target.config.num_hidden_layers
        for i, layer in enumerate(draft.model.layers):
            src = (init_layer + i) % n if init_layer >= 0 else n + init_layer - (num_layers - 1) + i
            layer.load_state_dict(target.model.layers[src].state_dict())
        draft.model.norm.load_state_dict(target.model.norm.state_dict())
    draft.tie_weights()
    draft.model.embed_tokens.weight.requires_grad_(False)
    return draft.eval()


def load_pretrained(target, path: str | Path | None = None, full_vocabulary: bool = False):
    """A draft model saved by ``save_draft`` (the book's trained one for SmolLM2-135M by default),
    built around ``target``'s embedding.

    Returns a Hugging Face ``LlamaForCausalLM``: the drafter of ``ll.speculative_generate`` once
    wrapped (``DraftModelDrafter(draft)``), or Hugging Face's ``assistant_model`` as it is. If the
    file names an output vocabulary (the shipped one does: the tokens SmolLM2 uses most), the
    draft scores only those tokens (a ``SubsetHead``), which makes a draft step several times
    cheaper; ``full_vocabulary=True`` gives it the whole output layer instead. When the target
    has ``ll.load``'s CPU fast path, the draft gets it too.
    """
    if path is None:
        check_smollm2(target, "target", "the shipped draft was")
    check_flag(full_vocabulary, "full_vocabulary")
    path = str(PRETRAINED_DRAFT if path is None else path)
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(path, "pt") as f:
        layers = int(f.metadata()["num_hidden_layers"])
    draft = build_draft(target, 0, layers)
    state = load_file(path)
    vocab = state.pop("vocab", None)
    state = {k: v.to(target.dtype) for k, v in state.items()}
    missing = draft.load_state_dict(state, strict=False)
    if missing.unexpected_keys:
        raise ValueError(f"path: {path} holds weights a draft of this target does not have: {missing.unexpected_keys}")
    if vocab is not None and not full_vocabulary:
        draft.lm_head = SubsetHead(target.model.embed_tokens.weight, vocab.long())
    if getattr(target, "logitlab_fast_cpu", None):
        fast_cpu.enable(draft)  # the draft runs on the kernels its target runs on (ll.load's fast path)
    return fast_gpu.follow(draft.eval(), target)  # and on its cache (ll.load's GPU fast path)
