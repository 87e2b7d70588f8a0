"""The prompts a loop starts from (chapter 3): ``prompt_batch`` turns text, lists of ids or a padded
tensor into one left-padded batch and its attention mask, ``one_prompt`` a single prompt into one
row, and ``eos_ids`` the end-of-sequence ids into a list.
"""

from __future__ import annotations

import numbers

import torch

from .._validate import vocab_size
from ..devices import model_device


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
