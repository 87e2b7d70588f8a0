"""A KV cache of fixed size: the shapes a GPU can record once and replay (the GPU fast path).

Hugging Face's ``DynamicCache`` grows by concatenation: every pass allocates keys and values one
position (or a few drafts) longer, so no two decode steps have the same shapes. A ``StaticCache``
allocates ``[batch, kv_heads, capacity, head_dim]`` once per layer and writes each pass's keys
and values in place, at the positions ``slots`` names (a tensor on the device, so that a recorded
pass reads where to write instead of having it baked in). Every pass then attends over the whole
capacity, through a mask (:meth:`StaticCache.begin`) that hides the positions not written yet,
rolled back, padded or rejected; the shapes of a pass depend only on the batch size and the
number of new inputs. That is what lets :mod:`logitlab.fast_gpu` record a pass as a CUDA graph
and replay it.

Its length is a Python number, known without asking the device: the loops know how many inputs
they feed and how many they keep. Rolling back (``crop``) only lowers it; the entries beyond are
masked and overwritten by the next pass. The decoding loops use it unchanged, through
``forward`` (``passes.py``), which creates one for a model :func:`logitlab.fast_gpu.enable` has
switched on.
"""

from __future__ import annotations

import weakref

import torch
from transformers.cache_utils import Cache

from .. import fast_gpu

BLOCK = 256  # capacities are multiples of this, so that a few sizes serve every prompt


class StaticCache(Cache):
    """Keys and values of ``batch`` rows in buffers of ``capacity`` positions, written in place.

    ``layers[i].keys`` and ``.values`` are the whole buffers (``keep_in_block`` reorders a block
    of them in place); ``length`` positions hold the sequence so far. The buffers, the slots and
    the passes recorded on them (with ``graphs``) are a :class:`Storage`; with a ``pool`` (a
    ``fast_gpu.Pool``, the model's), it is taken from there and given back when the cache is
    gone, so that the next cache of the same shape finds its passes recorded already.
    """

    def __init__(self, model, batch: int, capacity: int, graphs: bool = False, pool=None):
        config = model.config
        self.shape = (config.num_hidden_layers, config.num_key_value_heads,
                      getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        weight = next(model.parameters())
        self.dtype, self.device, self.record, self.pool = weight.dtype, weight.device, graphs, pool
        super().__init__(layers=[_Buffers() for _ in range(config.num_hidden_layers)])
        self.length, self.pending = 0, 0
        self.held = [None]  # the storage in use, where the finalizer below finds it
        if pool is not None:
            weakref.finalize(self, _give_back, pool, self.held)
        self._use(self._storage(batch, _rounded(capacity)))

    def _storage(self, batch: int, capacity: int) -> Storage:
        def make():
            return Storage(self.shape, batch, capacity, self.dtype, self.device, self.record)
        return make() if self.pool is None else self.pool.take((batch, capacity), make)

    def _use(self, storage: Storage, keep: int = 0, rows=None) -> None:
        """Work in ``storage`` from now on, holding the first ``keep`` positions of the storage
        used so far (of its batch rows ``rows``, all by default), which goes back to the pool."""
        old = self.held[0]
        for i, layer in enumerate(self.layers):
            layer.keys, layer.values = storage.keys[i], storage.values[i]
            if keep:
                for new, before in ((layer.keys, old.keys[i]), (layer.values, old.values[i])):
                    new[:, :, :keep] = before[:, :, :keep] if rows is None else before[rows, :, :keep]
        self.held[0] = storage
        if old is not None and self.pool is not None:
            self.pool.give((old.batch, old.capacity), old)
        self.batch, self.capacity, self.slots, self.offsets = storage.batch, storage.capacity, storage.slots, storage.offsets
        self.graphs = storage.graphs

    def begin(self, n: int, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Make room for a pass over ``n`` new inputs: they will be written at positions
        ``length .. length + n - 1``. Returns its attention mask over the whole capacity,
        ``[batch, 1, n, capacity]`` in the cache's dtype (0: attend, the dtype's minimum: not),
        from the loop's ``attention_mask``: None (causal), ``[batch, length + n]`` (1 for the
        positions to see; the new inputs see the ones before them) or an additive 4D mask
        ``[batch or 1, 1, n, length + n]`` (a tree's pattern, from ``additive_mask``)."""
        total = self.length + n
        if total > self.capacity:  # grow: a larger storage, holding what is there
            self._use(self._storage(self.batch, _rounded(max(total, 2 * self.capacity))), keep=self.length)
        torch.add(self.offsets[:n], self.length, out=self.slots[:n])
        self.pending = n
        lowest = torch.finfo(self.dtype).min
        if attention_mask is not None and attention_mask.dim() == 4:
            mask = attention_mask.to(self.dtype).expand(self.batch, 1, n, total)
        else:
            # key k is seen by new input q when k <= length + q (and the 2D mask allows k)
            seen = self.offsets[None, :total] <= self.offsets[:n, None] + self.length
            if attention_mask is not None:
                seen = seen[None] & attention_mask.bool()[:, None, :]
            mask = torch.zeros(seen.shape, dtype=self.dtype, device=self.device).masked_fill(~seen, lowest)
            mask = mask.expand(self.batch, n, total)[:, None]
        full = torch.full((self.batch, 1, n, self.capacity), lowest, dtype=self.dtype, device=self.device)
        full[..., :total] = mask
        return full

    def end(self) -> None:
        """The pass begun has written its inputs: they are part of the sequence now."""
        self.length += self.pending
        self.pending = 0

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        """Write one layer's new keys and values at ``slots``; return the whole buffers."""
        if key_states.shape[-2] != self.pending:
            raise ValueError(f"StaticCache: a pass over {key_states.shape[-2]} inputs was not begun "
                             f"({self.pending}); run the model through logitlab.decoding.forward")
        layer, slots = self.layers[layer_idx], self.slots[:self.pending]
        try:
            layer.keys.index_copy_(2, slots, key_states)
            layer.values.index_copy_(2, slots, value_states)
        except NotImplementedError:  # a device without index_copy_ (MPS in some versions)
            layer.keys[:, :, slots] = key_states
            layer.values[:, :, slots] = value_states
        return layer.keys, layer.values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.capacity, 0

    def crop(self, max_length: int) -> None:
        """Keep the first ``max_length`` positions (negative: drop the last ``-max_length``),
        as ``DynamicCache.crop`` does."""
        self.length = max(0, self.length + max_length if max_length < 0 else min(max_length, self.length))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._use(self._storage(self.batch * repeats, self.capacity), keep=self.length,
                  rows=torch.arange(self.batch, device=self.device).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows ``indices``: in place when the batch keeps its size (a beam search
        reordering its beams, so that the recorded passes stay valid), else in another storage."""
        indices = indices.to(self.device)
        if len(indices) != self.batch:
            self._use(self._storage(len(indices), self.capacity), keep=self.length, rows=indices)
            return
        for layer in self.layers:
            layer.keys.copy_(layer.keys.index_select(0, indices))
            layer.values.copy_(layer.values.index_select(0, indices))


class Storage:
    """A static cache's memory: each layer's key and value buffers ``[batch, heads, capacity,
    dim]``, the positions a pass writes at (``slots``, filled from ``offsets``), and with
    ``record`` the passes recorded on them (``graphs``, a ``fast_gpu.Graphs``)."""

    def __init__(self, shape: tuple, batch: int, capacity: int, dtype, device, record: bool):
        layers, heads, dim = shape
        self.batch, self.capacity = batch, capacity
        self.keys, self.values = ([torch.zeros(batch, heads, capacity, dim, dtype=dtype, device=device)
                                   for _ in range(layers)] for _ in range(2))
        self.slots = torch.zeros(capacity, dtype=torch.long, device=device)
        self.offsets = torch.arange(capacity, device=device)
        self.graphs = fast_gpu.Graphs() if record else None


def _give_back(pool, held: list) -> None:
    """A cache is gone: its storage goes back to the pool, for the next cache of its shape."""
    storage = held[0]
    pool.give((storage.batch, storage.capacity), storage)


class _Buffers:
    """One layer's key and value buffers (``keys``, ``values``: ``[batch, heads, capacity, dim]``)."""

    keys: torch.Tensor
    values: torch.Tensor
    is_sliding = False
    is_compileable = True


def _rounded(capacity: int) -> int:
    return -(-capacity // BLOCK) * BLOCK
