"""The Medusa drafter (chapter 7): extra heads on the target's last hidden state guess the tokens
after the next one, as a chain or as a tree of each head's top tokens (the heads themselves, and
Medusa's own tree loop, are in ``medusa_heads``).
"""

from __future__ import annotations

import functools

import torch

from ..decoding.tree_shape import cartesian_tree, depths
from ..sampling.pipeline import draw
from .drafter import Drafter, DraftTree


class MedusaDrafter(Drafter):
    """Proposals from Medusa heads (``logitlab.speculative.medusa_heads``), as a chain or, with ``tree``, as a tree.

    The heads read the target's last hidden state where the pending token was predicted, so
    this drafter has ``reads_hidden_state = True``: the loop of ``ll.speculative_generate`` hands
    it that state after every target pass (``observe``). ``propose`` then costs one small block
    and one output product per head, and no forward pass of any model. ``proposals="argmax"``
    (Medusa's choice) proposes each head's most likely token, with ``q`` one-hot on it;
    ``"sample"`` draws from each head's processed distribution, which is ``q``.

    ``tree=(b_1, b_2, ...)`` proposes a ``DraftTree`` instead: under the pending token, b_1
    guesses of head 1, under each of them b_2 guesses of head 2, and so on (at most one level
    per head, and no deeper than the loop's ``gamma``). With ``"argmax"`` they are each head's top
    b tokens (deterministic: ``q`` is None); with ``"sample"`` each node's children are independent
    draws from its head's distribution (a head ignores the path above it, so all nodes of a level
    draw from the same ``q``).
    """

    reads_hidden_state = True

    def __init__(self, heads, proposals: str = "argmax", tree=None):
        if not all(hasattr(heads, a) for a in ("num_heads", "vocab_size")):
            raise ValueError("heads must be MedusaHeads (see logitlab.speculative.medusa_heads.load_pretrained)")
        if proposals not in ("argmax", "sample"):
            raise ValueError(f"proposals must be 'argmax' or 'sample', got {proposals!r}")
        if tree is not None:
            cartesian_tree(tree)  # checks it
            if len(tree) > heads.num_heads:
                raise ValueError(f"tree has {len(tree)} levels but there are only {heads.num_heads} heads")
            if max(tree, default=1) > len(heads.output.vocab):
                raise ValueError(f"tree asks for {max(tree)} guesses per head, but the heads score only "
                                 f"{len(heads.output.vocab)} tokens")
        self.heads, self.proposals, self.tree = heads, proposals, None if tree is None else tuple(tree)
        self.vocab_size = heads.vocab_size
        self.hidden = None

    def start(self, input_ids, attention_mask, target=None, cache=None) -> None:
        # Steps are counted like a draft model's (SpeculativeResult.draft_step_seconds): one for
        # the prompt (here the target's prefill gives the first hidden state), then one per call.
        self.hidden, self.steps = None, 1

    def observe(self, hidden: torch.Tensor) -> None:
        self.hidden = hidden

    @torch.inference_mode()
    def propose(self, next_tokens, gamma, config, generator=None):
        if self.hidden is None:
            raise ValueError("MedusaDrafter needs the target's hidden state: use it in ll.speculative_generate")
        g = min(gamma, self.heads.num_heads if self.tree is None else len(self.tree))  # one level per head
        logits = self.heads(self.hidden)[:, :g].float()  # [B, g, V]
        self.steps += 1
        deterministic = self.proposals == "argmax" or config.temperature == 0
        if self.tree is not None:
            return self.propose_tree(logits, deterministic, config, generator)
        if deterministic:
            tokens = logits.argmax(dim=-1)
            return tokens, torch.nn.functional.one_hot(tokens, self.vocab_size).float()
        return draw(logits, config, generator)

    def propose_tree(self, logits, deterministic, config, generator) -> DraftTree:
        """The tree of ``self.tree`` cut to ``logits``' levels; ``logits`` ``[B, g, V]``, head by head."""
        parents, head, rank = tree_layout(self.tree[: logits.shape[1]])
        if deterministic:
            top = logits.topk(max(self.tree), dim=-1).indices  # [B, g, b]
            return DraftTree(top[:, head, rank], parents)
        tokens, q = draw(logits[:, head], config, generator)  # each node its own draw from its head
        return DraftTree(tokens, parents, q)

    def select_rows(self, keep: torch.Tensor) -> None:
        self.hidden = self.hidden[keep]


@functools.lru_cache(maxsize=32)
def tree_layout(levels: tuple[int, ...]) -> tuple[list[int], list[int], list[int]]:
    """For Medusa's tree with ``levels``: each node's parent (-1: the pending token), the head that
    guesses it (its depth - 1, as an index) and its rank among its siblings. The same for every
    call with the same levels, so computed once."""
    rooted = cartesian_tree(levels)
    parents = [a - 1 for a in rooted[1:]]
    head = [d - 2 for d in depths(rooted)[1:]]
    rank = [sum(parents[j] == parents[i] for j in range(i)) for i in range(len(parents))]
    return parents, head, rank
