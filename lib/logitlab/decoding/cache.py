"""The KV cache, shortened: the only code that removes entries from a cache.

``crop_cache`` cuts a whole batch to one length; ``roll_back`` takes each row's rejected drafts
out of a batch's cache (the speculative loop, chapter 6); ``keep_in_block`` keeps each row's
accepted path of a verified tree (chapters 7-9).
"""

from __future__ import annotations

import torch


def crop_cache(cache, length: int) -> None:
    """Keep the first ``length`` positions of a cache (Hugging Face's ``crop(-n)`` drops the last n)."""
    drop = cache.get_seq_length() - length
    if drop > 0:  # crop(0) would empty a Hugging Face cache: call it only to drop something
        cache.crop(-drop)


def roll_back(cache, mask: torch.Tensor, fed: int, kept: torch.Tensor, longest: int | None = None) -> torch.Tensor:
    """After a pass whose last ``fed`` inputs were proposals, of which row b keeps the first
    ``kept[b]``: the rejected ones are masked out (like left padding, since rows keep different
    numbers) and cropped from the cache where no row keeps them. ``longest``: ``max(kept)``,
    where the caller has read it from the device already (else it is read here). Returns the
    attention mask."""
    if fed == 0:
        return mask
    kept = kept.clamp(max=fed)
    mask[:, -fed:] *= (torch.arange(1, fed + 1, device=kept.device)[None] <= kept[:, None]).long()
    drop = fed - min(fed, int(kept.max()) if longest is None else longest)  # positions no row keeps
    if drop > 0:
        crop_cache(cache, cache.get_seq_length() - drop)
        mask = mask[:, :-drop]
    return mask


def keep_in_block(cache, mask: torch.Tensor, fed: int, index: torch.Tensor, counts: torch.Tensor,
                  longest: int | None = None) -> torch.Tensor:
    """After a pass over ``fed`` new inputs per row (a token tree), keep in row b only the inputs
    ``index[b, :counts[b]]`` (ascending positions inside that block): they are moved to the front
    of the block, in that order, the rest is masked out (rows keep different numbers) and cropped
    where no row keeps anything. ``index`` ``[B, m]``, ``m <= fed``; ``longest``: ``max(counts)``,
    where the caller knows it without reading the device. Returns the attention mask."""
    start = cache.get_seq_length() - fed
    m = index.shape[1]
    for layer in cache.layers:
        for name in ("keys", "values"):
            block = getattr(layer, name)  # [B, heads, seq, dim]
            picked = block[:, :, start:].gather(2, index[:, None, :, None].expand(-1, block.shape[1], -1, block.shape[3]))
            block[:, :, start:start + m] = picked
    kept = (torch.arange(fed, device=mask.device)[None] < counts[:, None]).long()
    mask = torch.cat([mask[:, :start], kept], dim=1)
    longest = int(counts.max()) if longest is None else longest
    crop_cache(cache, start + longest)
    return mask[:, :start + longest]
