"""The forward passes every loop makes (chapter 3, and the trees of chapters 5-9).

``forward`` runs new tokens (or embeddings) after a cache, optionally returning the last hidden
states that Medusa heads and feature-level drafters read; ``masked_forward`` and ``tree_forward``
run new inputs that attend to each other through a custom pattern (a token tree's mask), with
``additive_mask`` turning a boolean pattern into the model's additive one. For a model on the
static path (``logitlab.fast_gpu``), ``forward`` makes and fills a ``StaticCache`` instead of
Hugging Face's cache, and on CUDA replays the passes it has recorded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import fast_cpu
from ..devices import model_device
from .static_cache import StaticCache


@dataclass
class Pass:
    """One forward pass: the cache (holding the new inputs now), float32 logits of the kept
    positions, and the last hidden states when asked for."""

    cache: object
    logits: torch.Tensor | None
    hidden: torch.Tensor | None = None


def forward(model, *, cache=None, input_ids=None, inputs_embeds=None, attention_mask=None, position_ids=None,
            logits_to_keep: int = 0, hidden: bool = False, scores: bool = True, layers=None) -> Pass:
    """One pass of ``model`` on new inputs after ``cache`` (None: a prefill).

    ``logits_to_keep=0`` scores every new position, ``n`` the last n only. With ``hidden=True``
    the pass is split into the body and the output layer, so that the last hidden states come
    back too (Medusa heads read them; ``scores=False`` skips the output layer). This assumes the
    logits are ``lm_head(hidden)``, as for Llama models such as SmolLM2 (no soft-capping or
    scaling after the output layer). ``layers`` (with ``hidden``): the hidden states returned are
    those after each of these layers, concatenated (``[..., len(layers) * H]``; layer i's output,
    the last one's after the final norm, as Hugging Face's ``hidden_states[i]``), which a drafter
    fusing several layers reads (chapter 9); the logits still come from the last layer.
    """
    new = input_ids if input_ids is not None else inputs_embeds
    plan = getattr(model, "logitlab_static", None)
    if cache is None and plan is not None:  # the static path (fast_gpu.enable): a cache of fixed size
        cache = StaticCache(model, new.shape[0], new.shape[1] + plan.room, plan.graphs, plan.pool)
    if isinstance(cache, StaticCache):
        return _static_pass(model, cache, new, input_ids is not None, attention_mask, position_ids, logits_to_keep,
                            hidden, scores, layers)
    kwargs = dict(input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                  position_ids=position_ids, past_key_values=cache, use_cache=True)
    return _run(model, {k: v for k, v in kwargs.items() if v is not None}, logits_to_keep, hidden, scores, layers)


def _static_pass(model, cache, new, ids: bool, attention_mask, position_ids, logits_to_keep, hidden, scores,
                 layers) -> Pass:
    """``forward`` on a ``StaticCache``: every pass of a shape looks the same (its mask spans the
    whole capacity, its positions are given), so that on a GPU it is recorded once and replayed."""
    n = new.shape[1]
    if position_ids is None:
        position_ids = (torch.arange(n, device=new.device) + cache.length)[None].expand(new.shape[0], n)
    inputs = {"input_ids" if ids else "inputs_embeds": new, "attention_mask": cache.begin(n, attention_mask),
              "position_ids": position_ids}

    def run(inputs):
        step = _run(model, dict(inputs, past_key_values=cache, use_cache=True), logits_to_keep, hidden, scores, layers)
        return step.logits, step.hidden

    layers = None if layers is None else tuple(layers)
    key = (tuple((name, tuple(t.shape)) for name, t in inputs.items()), logits_to_keep, hidden, scores, layers)
    # Recorded only where no gradient is recorded (the loops run under inference_mode; training does not).
    recording = cache.graphs is not None and not torch.is_grad_enabled()
    logits, states = cache.graphs.run(key, inputs, run) if recording else run(inputs)
    cache.end()
    return Pass(cache, logits, states)


def _run(model, kwargs: dict, logits_to_keep: int, hidden: bool, scores: bool, layers) -> Pass:
    """``forward``'s pass itself: the model on ``kwargs`` (its inputs and cache)."""
    if not hidden:
        out = model(logits_to_keep=logits_to_keep, **kwargs)
        return Pass(out.past_key_values, out.logits.float())
    out = model.model(**kwargs, output_hidden_states=layers is not None)
    states = out.last_hidden_state
    fused = states if layers is None else torch.cat([out.hidden_states[i] for i in layers], dim=-1)
    if not scores:
        return Pass(out.past_key_values, None, fused)
    scored = states if logits_to_keep == 0 else states[:, -logits_to_keep:]
    return Pass(out.past_key_values, model.lm_head(scored).float(), fused)


def mask_positions(mask: torch.Tensor, last: int | None = None) -> torch.Tensor:
    """Each input's position id, from the attention mask: the number of real tokens before it, so
    that left padding and masked-out drafts take no position. ``last``: the last columns only."""
    positions = (mask.cumsum(dim=-1) - 1).clamp_min(0)
    return positions if last is None else positions[:, -last:]


def prefill(model, ids: torch.Tensor, mask: torch.Tensor, **kwargs) -> Pass:
    """The prompts' pass, which every loop starts with: positions that skip the left padding, and
    the logits of the last position only (the first new token's). ``kwargs`` go to ``forward``."""
    return forward(model, input_ids=ids, attention_mask=mask, position_ids=mask_positions(mask), logits_to_keep=1,
                   **kwargs)


def masked_forward(model, cache, allowed: torch.Tensor, positions: torch.Tensor, *, input_ids=None,
                   inputs_embeds=None, hidden: bool = False, scores: bool = True) -> Pass:
    """One pass over ``n`` new inputs of one sequence (``input_ids [n]`` or ``inputs_embeds [n, d]``)
    after the cached positions, attending through a custom pattern: ``allowed`` ``[n, m]`` says
    which of the last ``m`` positions (cached and new, ``m >= n``) each new input may attend to;
    every position before those is visible to all (the prompt). ``ll.tree_attention_mask`` gives
    such a pattern for a token tree, which is how a whole tree is scored in one pass.
    ``positions`` ``[n]`` are the new inputs' position ids. Returns the ``Pass`` without its batch
    dimension (logits ``[n, V]``, hidden states ``[n, H]``)."""
    n, m = allowed.shape
    total = n + (0 if cache is None else cache.get_seq_length())
    device = model_device(model)
    full = torch.ones(n, total, dtype=torch.bool, device=device)
    full[:, total - m:] = allowed.to(device)
    step = forward(model, cache=cache, attention_mask=additive_mask(full, model)[None, None],
                   position_ids=positions.to(device)[None], hidden=hidden, scores=scores,
                   input_ids=None if input_ids is None else input_ids.to(device)[None],
                   inputs_embeds=None if inputs_embeds is None else inputs_embeds[None])
    return Pass(step.cache, None if step.logits is None else step.logits[0],
                None if step.hidden is None else step.hidden[0])


def tree_forward(model, cache, visible: torch.Tensor, allowed: torch.Tensor, positions: torch.Tensor,
                 input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
                 hidden: bool = False, scores: bool = True, layers=None) -> Pass:
    """``masked_forward`` for a batch: ``n`` new inputs per row (``input_ids`` ``[B, n]``, or
    ``inputs_embeds`` ``[B, n, d]``) after the cached positions, which row b sees where
    ``visible[b]`` says (``[B, past]``, the loop's 2-D attention mask: 0 for padding and rejected
    drafts; or ``[B, n, past]``, one row per new input), while among the new inputs it follows
    ``allowed`` ``[B, n, n]`` (each row's tree mask). ``positions`` ``[B, n]`` are their position ids."""
    batch, n = allowed.shape[:2]
    if visible.dim() == 2:
        visible = visible[:, None, :].expand(batch, n, -1)
    full = torch.cat([visible.bool(), allowed.to(visible.device)], dim=-1)
    return forward(model, cache=cache, input_ids=input_ids, inputs_embeds=inputs_embeds, position_ids=positions,
                   attention_mask=additive_mask(full, model)[:, None], hidden=hidden, scores=scores, layers=layers)


def additive_mask(allowed: torch.Tensor, model) -> torch.Tensor:
    """A boolean "may attend" mask as Hugging Face's 4D mask values: 0 where allowed, the dtype's
    minimum where not.

    A 4D mask goes to the attention function unchanged. SDPA reads a bool mask as "True:
    attend" and adds a float one; eager attention always *adds* it, so a bool mask there would
    add 0 or 1 and mask nothing. The additive float form is right for both.
    """
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl not in (None, "sdpa", "eager", fast_cpu.ATTENTION):  # the fast path's attention is SDPA's
        raise ValueError(f"model: attention implementation {impl!r} does not take a custom 4D mask; "
                         "load the model with attn_implementation='sdpa' or 'eager'")
    dtype = getattr(model, "dtype", torch.float32)
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)
