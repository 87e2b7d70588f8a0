"""A toy language model whose next-token distribution is known exactly.

Tests and chapters compare sampled frequencies with exact probabilities, and a real model
cannot give those. ``NGramLM`` is an n-gram model (a bigram model by default) written to be
called like a Hugging Face causal LM:

>>> model = toy_model(vocab_size=5, order=2, seed=0)
>>> out = model(torch.tensor([[1, 2, 3]]))             # no cache: the whole sequence
>>> out.logits.shape
torch.Size([1, 3, 5])
>>> step = model(torch.tensor([[4]]), past_key_values=out.past_key_values)  # one new token
>>> step.logits.shape
torch.Size([1, 1, 5])

Its "KV cache" holds every token seen so far with its position. That is a real cache in the
sense that matters for testing a decoding loop: a loop that feeds the wrong cache gets the wrong
logits. ``next_token_probs`` gives the exact distribution for any context, which is what
statistical tests compare samples against.

Like a transformer, the model also takes a custom 4D attention mask ``[batch, 1, q, kv]``
(``True`` or ``0.0``: may attend; ``False``, ``-inf`` or the dtype's minimum: may not) with
``position_ids``. Each query then sees only the tokens its mask row allows, and its n-gram
context is the last ``order - 1`` of those, ordered by position. That is what lets the toy
model score a whole token tree in one call (chapter 5, ``logitlab.search.trees``) and get exactly what
it gives each root-to-leaf path alone.
"""

from __future__ import annotations

import torch
from torch import nn

from ._validate import check_int
from .probs import softmax


class NGramCache:
    """Every token of each row so far and its position (the toy model's "keys and values").

    An n-gram model needs only the last ``order - 1`` tokens of a plain sequence, but a tree
    attention mask can make any earlier token the context of a query, so the whole history is
    kept (it is small: one integer per token).
    """

    def __init__(self, tokens: torch.Tensor, positions: torch.Tensor, order: int):
        self.tokens = tokens  # [batch, length]
        self.positions = positions  # [batch, length]
        self.order = order

    @property
    def length(self) -> int:
        return self.tokens.shape[1]

    @property
    def history(self) -> torch.Tensor:
        """The last ``order - 1`` tokens of each row ``[batch, order - 1]``, ``-1`` where the
        sequence is shorter: the context of the next token in a plain sequence."""
        width = self.order - 1
        missing = max(0, width - self.length)
        pad = self.tokens.new_full((self.tokens.shape[0], missing), -1)
        return torch.cat([pad, self.tokens[:, self.length - (width - missing):]], dim=1)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    # The batch operations of Hugging Face's DynamicCache that the decoding loops use.
    def batch_repeat_interleave(self, repeats: int) -> None:
        self.tokens = self.tokens.repeat_interleave(repeats, dim=0)
        self.positions = self.positions.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.tokens = self.tokens[indices]
        self.positions = self.positions[indices]

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` tokens, as ``DynamicCache.crop`` does in
        transformers 5 (which accepts only a number <= 0): the rollback of speculative decoding."""
        tokens_to_remove = check_int(tokens_to_remove, "tokens_to_remove", -self.length,
                                     f"an integer in [-{self.length}, 0] (minus the number of tokens to drop)", 0)
        keep = self.length + tokens_to_remove
        self.tokens, self.positions = self.tokens[:, :keep], self.positions[:, :keep]


class _Config:
    def __init__(self, vocab_size: int, order: int):
        self.vocab_size = vocab_size
        self.order = order
        self.model_type = "ngram-toy"


class _Output:
    """The two fields of a Hugging Face ``CausalLMOutputWithPast`` that decoding uses."""

    def __init__(self, logits: torch.Tensor, past_key_values: NGramCache | None):
        self.logits = logits
        self.past_key_values = past_key_values


class NGramLM(nn.Module):
    """An n-gram language model defined by a logits table.

    ``table`` has shape ``[V + 1] * (order - 1) + [V]``: ``table[a, b, :]`` (order 3) holds the
    logits of the token that follows ``a, b``. Index ``V`` stands for "no token here", the
    history of the first positions of a sequence.
    """

    def __init__(self, table: torch.Tensor):
        super().__init__()
        if not isinstance(table, torch.Tensor) or not table.is_floating_point() or table.dim() < 1:
            raise ValueError("table must be a floating tensor of shape [V + 1] * (order - 1) + [V]")
        vocab = table.shape[-1]
        if any(size != vocab + 1 for size in table.shape[:-1]):
            raise ValueError(f"table must have shape [V + 1] * (order - 1) + [V], got {tuple(table.shape)}")
        self.register_buffer("table", table)
        self.config = _Config(vocab, table.dim())

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def order(self) -> int:
        return self.config.order

    @property
    def device(self) -> torch.device:
        return self.table.device

    @property
    def dtype(self) -> torch.dtype:
        return self.table.dtype

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=True,
                position_ids=None, **kwargs):
        """Logits ``[batch, seq, V]`` for the token after each position of ``input_ids``.

        ``attention_mask`` is None, a 2D mask ``[batch, past + seq]`` (zeros: tokens no query
        may see, such as padding), or a 4D mask ``[batch or 1, 1, seq, past + seq]`` (a tree mask). ``position_ids``
        ``[batch or 1, seq]`` (default: the next positions) order the tokens a 4D mask shows;
        without a 4D mask every token sees all earlier ones, in the order they came.
        """
        ids = self._check_ids(input_ids)
        batch, seq = ids.shape
        if past_key_values is None:
            past_tokens = ids.new_empty(batch, 0)
            past_positions = ids.new_empty(batch, 0)
        else:
            if past_key_values.tokens.shape[0] != batch:
                raise ValueError(
                    f"past_key_values holds {past_key_values.tokens.shape[0]} rows but input_ids has {batch}"
                )
            past_tokens, past_positions = past_key_values.tokens, past_key_values.positions
        past = past_tokens.shape[1]
        positions = self._positions(position_ids, batch, seq, past, ids.device)
        tokens = torch.cat([past_tokens, ids], dim=1)  # [batch, past + seq]
        visible = self._visible(attention_mask, batch, seq, past + seq)
        if self.order == 1:  # a unigram model ignores the context
            logits = self.table.expand(batch, seq, -1)
        else:
            if visible is None:
                contexts = self._causal_contexts(tokens, seq)
            else:
                contexts = self._masked_contexts(tokens, torch.cat([past_positions, positions], dim=1), visible)
            contexts = torch.where(contexts < 0, self.vocab_size, contexts)  # -1 -> "none" index
            logits = self.table[tuple(contexts[..., i] for i in range(self.order - 1))]
        cache = NGramCache(tokens, torch.cat([past_positions, positions], dim=1), self.order) if use_cache else None
        return _Output(logits, cache)

    def _causal_contexts(self, tokens: torch.Tensor, seq: int) -> torch.Tensor:
        """``[batch, seq, order - 1]``: the context of position i is the ``order - 1`` tokens
        ending at i (a sliding window), ``-1`` before the start of the sequence."""
        width = self.order - 1
        pad = tokens.new_full((tokens.shape[0], width), -1)
        window = torch.cat([pad, tokens], dim=1)[:, -(seq + width):]
        return window.unfold(1, width, 1)[:, 1:]

    def _masked_contexts(self, tokens, positions, visible) -> torch.Tensor:
        """``[batch, seq, order - 1]``: each query's last ``order - 1`` visible tokens, ordered by
        position (ties by their order in the sequence), ``-1`` where fewer are visible."""
        batch, seq, length = visible.shape
        width = min(self.order - 1, length)
        # One sortable number per (query, token): later positions rank higher; hidden tokens -1.
        rank = positions * length + torch.arange(length, device=positions.device)
        rank = torch.where(visible, rank[:, None, :], -1)
        top, where = rank.topk(width, dim=-1)  # the most recent first
        chosen = tokens.gather(1, where.reshape(batch, -1)).reshape(batch, seq, width)
        chosen = torch.where(top < 0, -1, chosen).flip(-1)  # the most recent last, as in the table
        missing = self.order - 1 - width
        return torch.cat([chosen.new_full((batch, seq, missing), -1), chosen], dim=-1)

    @staticmethod
    def _positions(position_ids, batch: int, seq: int, past: int, device) -> torch.Tensor:
        if position_ids is None:
            return (past + torch.arange(seq, device=device)).expand(batch, seq)
        if not isinstance(position_ids, torch.Tensor) or position_ids.dim() != 2 \
                or position_ids.shape[1] != seq or position_ids.shape[0] not in (1, batch):
            raise ValueError(f"position_ids must be a tensor of shape [{batch} or 1, {seq}]")
        if position_ids.is_floating_point() or (position_ids < 0).any():
            raise ValueError("position_ids must hold integer positions >= 0")
        return position_ids.to(device=device, dtype=torch.long).expand(batch, seq)

    @staticmethod
    def _visible(attention_mask, batch: int, seq: int, length: int) -> torch.Tensor | None:
        """A 4D mask as booleans ``[batch, seq, length]`` (True: may attend); None for causal."""
        if attention_mask is None:
            return None
        if attention_mask.dim() == 2:
            if bool((attention_mask != 0).all()):
                return None
            if tuple(attention_mask.shape) != (batch, length):
                raise ValueError(f"attention_mask: a 2D mask must have shape [{batch}, {length}] (past + new tokens)")
            # Zeros (left padding, or the rejected drafts that speculative decoding masks out)
            # are hidden from every query; each query sees the visible tokens up to itself.
            causal = torch.ones(seq, length, dtype=torch.bool, device=attention_mask.device).tril(diagonal=length - seq)
            return (attention_mask != 0)[:, None, :] & causal[None]
        if attention_mask.dim() != 4 or attention_mask.shape[1] != 1 or attention_mask.shape[0] not in (1, batch) \
                or tuple(attention_mask.shape[2:]) != (seq, length):
            raise ValueError(f"attention_mask must be 2D (no padding) or 4D of shape [batch, 1, {seq}, {length}] "
                             f"(batch {batch} or 1), got {tuple(attention_mask.shape)}")
        if attention_mask.dtype == torch.bool:
            visible = attention_mask
        elif not attention_mask.is_floating_point():
            raise ValueError("attention_mask: a 4D mask must be bool (True: attend) or float (additive: 0 attends)")
        else:
            # An additive mask, as Hugging Face's eager attention adds it: 0 attends, -inf (or the
            # dtype's minimum) hides. Softer biases have no meaning for an n-gram model.
            visible = attention_mask == 0
            hidden = attention_mask <= torch.finfo(attention_mask.dtype).min
            if not bool((visible | hidden).all()):
                raise ValueError("attention_mask: a float 4D mask must hold only 0 (attend) and -inf or the "
                                 "dtype's minimum (hide)")
        return visible[:, 0].expand(batch, seq, length)

    def next_token_probs(self, context: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
        """The exact next-token distribution after each row of ``context`` ``[batch, seq]``."""
        ids = self._check_ids(context)
        return softmax(self(ids, use_cache=False).logits[:, -1], temperature)

    def _check_ids(self, input_ids) -> torch.Tensor:
        if not isinstance(input_ids, torch.Tensor) or input_ids.dtype != torch.long or input_ids.dim() != 2:
            raise ValueError("input_ids must be a LongTensor of shape [batch, seq]")
        if input_ids.shape[1] == 0:
            raise ValueError("input_ids must hold at least one token per row")
        if (input_ids < 0).any() or (input_ids >= self.vocab_size).any():
            raise ValueError(f"input_ids must be token ids in [0, {self.vocab_size})")
        return input_ids.to(self.device)


def toy_model(vocab_size: int = 8, order: int = 2, seed: int = 0, scale: float = 2.0) -> NGramLM:
    """A random but fixed n-gram model: logits drawn once from ``N(0, scale^2)`` with ``seed``."""
    if not isinstance(vocab_size, int) or vocab_size < 2:
        raise ValueError(f"vocab_size must be an integer >= 2, got {vocab_size!r}")
    if not isinstance(order, int) or order < 1:
        raise ValueError(f"order must be an integer >= 1 (1: unigram, 2: bigram), got {order!r}")
    gen = torch.Generator(device="cpu").manual_seed(seed)  # the same table everywhere; .to(device) moves it
    shape = [vocab_size + 1] * (order - 1) + [vocab_size]
    return NGramLM(scale * torch.randn(shape, generator=gen, device="cpu"))


def toy_bigram(vocab_size: int = 8, seed: int = 0) -> NGramLM:
    """The bigram toy model: the next token depends on the previous one only."""
    return toy_model(vocab_size=vocab_size, order=2, seed=seed)
