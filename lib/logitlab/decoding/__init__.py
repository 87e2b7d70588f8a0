"""What every decoding loop of the book shares, written once.

Chapter 3 ("Repetition, stopping and the decoding loop") introduces the loop; the later loops
(beam search, token trees, speculative sampling, Medusa, PaSS) are built from the same pieces,
next to ``logitlab.devices`` (the model's device, a seeded generator on it, its exact dtype and
a clock that waits for the device):

* **the prompts**: ``prompt_batch`` turns text, lists of ids or a padded tensor into one
  left-padded batch and its attention mask; ``eos_ids`` and ``check_counts`` validate the rest;
* **one token from logits**: ``choose`` (greedy at temperature 0, else a draw from the
  processed distribution) and ``draw`` (the same, with the distribution it came from, which a
  drafter hands to verification), and ``target_probs``, the distribution drafts are judged by;
* **forward passes**: ``forward`` (optionally returning the last hidden states, which Medusa
  heads and feature-level drafters read), and ``masked_forward`` and ``tree_forward`` (for a
  batch), the passes over new inputs that attend to each other through a custom pattern (a
  token tree's mask);
* **the KV cache**: ``crop_cache``, ``roll_back`` (rejected drafts out of a batch's cache) and
  ``keep_in_block`` (each row's kept path of a tree), the only code that shortens a cache;
* **the result**: ``GenerationResult``, what every loop returns, and ``token_logprobs``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import torch

from .. import fast_cpu
from ..devices import model_device
from ..sampling import SamplingConfig, next_token, process_logits

# --- Prompts and counts --------------------------------------------------------------------------


def vocab_size(model) -> int | None:
    """The model's vocabulary size, from its config (None if it has no config)."""
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(size) if size is not None else None


def check_model(model, name: str = "model"):
    """A causal language model: callable with input ids, with parameters (a model's name is not one)."""
    if not isinstance(model, torch.nn.Module):
        hint = " (load it first: model, tokenizer = ll.load(name))" if isinstance(model, str) else ""
        raise ValueError(f"{name} must be a causal language model (a torch.nn.Module), got "
                         f"{type(model).__name__}{hint}")
    return model


def check_body_and_head(model, name: str = "target"):
    """A Hugging Face causal LM split as ``.model`` (its body) and ``.lm_head`` (its output layer),
    which the loops that read hidden states need."""
    check_model(model, name)
    if not (hasattr(model, "model") and hasattr(model, "lm_head") and hasattr(model.model, "embed_tokens")):
        raise ValueError(f"{name} must be a Hugging Face causal LM with .model (its body), .model.embed_tokens "
                         "and .lm_head, such as the SmolLM2 model of ll.load(): this reads its hidden states")
    return model


def check_counts(max_new_tokens, min_new_tokens=0, num_return_sequences=1) -> tuple[int, int, int]:
    """Validate the token counts of a loop; numpy integers are fine. Returns them as ints."""
    def integer(value):
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    if not integer(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not integer(min_new_tokens) or not 0 <= min_new_tokens <= max_new_tokens:
        raise ValueError(f"min_new_tokens must be an integer in [0, max_new_tokens={max_new_tokens}], "
                         f"got {min_new_tokens!r}")
    if not integer(num_return_sequences) or num_return_sequences < 1:
        raise ValueError(f"num_return_sequences must be an integer >= 1, got {num_return_sequences!r}")
    return int(max_new_tokens), int(min_new_tokens), int(num_return_sequences)


def eos_ids(eos_token_id, model) -> list[int]:
    """End-of-sequence ids as a list: an id, a list of ids, or None for the model's own."""
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos_token_id is None:
            return []
    ids = [eos_token_id] if isinstance(eos_token_id, numbers.Integral) else eos_token_id
    vocab = vocab_size(model)
    ok = isinstance(ids, (list, tuple)) and all(
        isinstance(i, numbers.Integral) and not isinstance(i, bool) and 0 <= i < (vocab or float("inf"))
        for i in ids)
    if not ok:
        raise ValueError(f"eos_token_id must be None, a token id or a list of token ids in [0, {vocab}), "
                         f"got {eos_token_id!r}")
    return [int(i) for i in ids]


def prompt_batch(input_ids, attention_mask, tokenizer, model) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts as a left-padded LongTensor ``[batch, seq]`` and its attention mask, on the model's
    device. ``input_ids``: a LongTensor (left-padded with ``attention_mask``), a list of token-id
    lists of any lengths, or, with a ``tokenizer``, a string or a list of strings."""
    if isinstance(input_ids, str) or (isinstance(input_ids, (list, tuple)) and input_ids
                                      and all(isinstance(p, str) for p in input_ids)):
        if tokenizer is None:
            raise ValueError("input_ids: text prompts need tokenizer=")
        texts = [input_ids] if isinstance(input_ids, str) else list(input_ids)
        input_ids = [tokenizer(t).input_ids for t in texts]
    device = model_device(model)
    if isinstance(input_ids, (list, tuple)):
        ids, mask = _pad_lists(input_ids, attention_mask, device)
    elif isinstance(input_ids, torch.Tensor):
        ids, mask = _check_padded(input_ids.to(device), attention_mask)
    else:
        raise ValueError(f"input_ids must be a LongTensor, a list of token-id lists or text, got {type(input_ids).__name__}")
    vocab = vocab_size(model)
    if (ids < 0).any() or (vocab is not None and bool((ids >= vocab).any())):
        raise ValueError(f"input_ids must be token ids in [0, {vocab}) (the model's vocabulary)")
    return ids, mask


def one_prompt(input_ids, tokenizer, model) -> torch.Tensor:
    """One prompt as a LongTensor ``[1, seq]`` on the model's device, for the loops that decode a
    single sequence (token trees, Medusa trees, PaSS); a flat list of ids is one prompt."""
    if isinstance(input_ids, (list, tuple)) and input_ids and not isinstance(input_ids[0], (list, tuple, str)):
        input_ids = [input_ids]
    ids, _ = prompt_batch(input_ids, None, tokenizer, model)
    if ids.shape[0] != 1:
        raise ValueError(f"input_ids must be one prompt (a LongTensor [1, seq] or a list of ids), "
                         f"got {ids.shape[0]} prompts")
    return ids


def _pad_lists(input_ids, attention_mask, device):
    if attention_mask is not None:
        raise ValueError("attention_mask: pass it only with a padded tensor of input_ids")
    rows = [list(r) if isinstance(r, (list, tuple)) else None for r in input_ids]
    if not rows or any(not r for r in rows) or not all(
            isinstance(t, numbers.Integral) and not isinstance(t, bool) for r in rows for t in r):
        raise ValueError("input_ids must hold at least one non-empty prompt of integer token ids")
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + [int(t) for t in r] for r in rows], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=device)
    return ids, mask


def _check_padded(ids, attention_mask):
    if ids.dtype != torch.long or ids.dim() != 2 or ids.numel() == 0:
        raise ValueError("input_ids must be a non-empty LongTensor of shape [batch, seq]")
    mask = torch.ones_like(ids) if attention_mask is None else attention_mask
    if not isinstance(mask, torch.Tensor) or mask.shape != ids.shape:
        raise ValueError(f"attention_mask must be a tensor of the shape of input_ids {tuple(ids.shape)}")
    mask = mask.long().to(ids.device)
    if ((mask != 0) & (mask != 1)).any() or (mask[:, 1:] < mask[:, :-1]).any() or (mask[:, -1] == 0).any():
        raise ValueError("attention_mask must be left padding: each row zeros then ones, ending with a one")
    return ids, mask


# --- One token from logits -----------------------------------------------------------------------


def choose(logits: torch.Tensor, config: SamplingConfig, generator=None) -> torch.Tensor:
    """One token per row under ``config`` (no penalties: they need the history, see ``next_token``)."""
    return next_token(logits, config, generator=generator)[0]


def draw(logits: torch.Tensor, config: SamplingConfig, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``choose``, and the distribution the token came from: one-hot at temperature 0, else the
    processed distribution. Logits ``[..., V]`` give tokens ``[...]`` and probabilities ``[..., V]``."""
    flat = logits.reshape(-1, logits.shape[-1])
    tokens, processed = next_token(flat, config, generator=generator)
    if config.temperature == 0:
        probs = torch.nn.functional.one_hot(tokens, flat.shape[-1]).to(flat.dtype)
    else:
        probs = torch.softmax(processed, dim=-1)
    return tokens.view(logits.shape[:-1]), probs.view(logits.shape)


def target_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor | None:
    """The distribution the target samples from under ``config`` (penalties aside), which the
    acceptance rules compare drafts with; None at temperature 0, where they compare argmaxes."""
    if config.temperature == 0:
        return None
    return torch.softmax(process_logits(logits, config), dim=-1)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)`` at ``tokens``: logits ``[..., V]`` and tokens ``[...]`` give ``[...]``."""
    # torch's own: the loops call this every step on logits that were checked already.
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[..., None]).squeeze(-1)


# --- Forward passes ------------------------------------------------------------------------------


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
    kwargs = dict(input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                  position_ids=position_ids, past_key_values=cache, use_cache=True)
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
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


# --- The KV cache --------------------------------------------------------------------------------


def crop_cache(cache, length: int) -> None:
    """Keep the first ``length`` positions of a cache (Hugging Face's ``crop(-n)`` drops the last n)."""
    drop = cache.get_seq_length() - length
    if drop > 0:  # crop(0) would empty a Hugging Face cache: call it only to drop something
        cache.crop(-drop)


def roll_back(cache, mask: torch.Tensor, fed: int, kept: torch.Tensor) -> torch.Tensor:
    """After a pass whose last ``fed`` inputs were proposals, of which row b keeps the first
    ``kept[b]``: the rejected ones are masked out (like left padding, since rows keep different
    numbers) and cropped from the cache where no row keeps them. Returns the attention mask."""
    if fed == 0:
        return mask
    kept = kept.clamp(max=fed)
    mask[:, -fed:] *= (torch.arange(1, fed + 1, device=kept.device)[None] <= kept[:, None]).long()
    drop = fed - int(kept.max())  # positions no row keeps
    if drop > 0:
        crop_cache(cache, cache.get_seq_length() - drop)
        mask = mask[:, :-drop]
    return mask


def keep_in_block(cache, mask: torch.Tensor, fed: int, index: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """After a pass over ``fed`` new inputs per row (a token tree), keep in row b only the inputs
    ``index[b, :counts[b]]`` (ascending positions inside that block): they are moved to the front
    of the block, in that order, the rest is masked out (rows keep different numbers) and cropped
    where no row keeps anything. ``index`` ``[B, m]``, ``m <= fed``. Returns the attention mask."""
    start = cache.get_seq_length() - fed
    m = index.shape[1]
    for layer in cache.layers:
        for name in ("keys", "values"):
            block = getattr(layer, name)  # [B, heads, seq, dim]
            picked = block[:, :, start:].gather(2, index[:, None, :, None].expand(-1, block.shape[1], -1, block.shape[3]))
            block[:, :, start:start + m] = picked
    kept = (torch.arange(fed, device=mask.device)[None] < counts[:, None]).long()
    mask = torch.cat([mask[:, :start], kept], dim=1)
    crop_cache(cache, start + int(counts.max()))
    return mask[:, :start + int(counts.max())]


# --- The result ----------------------------------------------------------------------------------


@dataclass(kw_only=True)
class GenerationResult:
    """What every decoding loop returns. Row ``r`` continues prompt ``prompt_index[r]``.

    Speculative loops (``logitlab.speculative.SpeculativeResult``) add their acceptance statistics.
    """

    sequences: list[torch.Tensor]  # prompt (without padding) followed by the new tokens
    new_tokens: list[torch.Tensor]
    logprobs: list[torch.Tensor]  # each new token's log-probability under the sampled distribution
    raw_logprobs: list[torch.Tensor]  # ... and under the model's own distribution (T = 1, no rules)
    finish_reasons: list[str]  # "eos", "stop" or "length"
    texts: list[str] | None = None  # decoded new text, cut before a stop string (needs a tokenizer)
    prompt_index: list[int]
    model_calls: int = 0  # forward passes of the model, the prefill included
    seconds: float = 0.0  # the whole call
    prefill_seconds: float = 0.0
    step_seconds: list[float] = field(default_factory=list)  # each decode step (or each speculative call)

    @property
    def decode_seconds_per_token(self) -> float:
        """Mean time of one step of the loop: for ``ll.generate`` one token (a choice and one
        forward pass); for the speculative loops, whose steps are calls, one call."""
        return sum(self.step_seconds) / max(1, len(self.step_seconds))


def decode_texts(tokenizer, new_tokens) -> list[str] | None:
    """Each row's new tokens as text (None without a tokenizer)."""
    if tokenizer is None:
        return None
    return [tokenizer.decode(t.tolist(), skip_special_tokens=True) for t in new_tokens]
