"""An output layer over a subset of the vocabulary: the draft model's and the EAGLE drafter's
cheaper head, which scores only the tokens a drafter is likely to need.
"""

from __future__ import annotations

import torch


class SubsetHead(torch.nn.Module):
    """An output layer that scores only a subset of the vocabulary.

    A draft step of the one-layer draft is dominated by its output layer: a [576] x [576, 49152]
    product reads the whole 113 MB embedding for every proposed token, several times the cost
    of the layer itself. Scoring only the ``K`` tokens the target uses most (rows of the same
    embedding, copied once into a small contiguous matrix) makes a step several times cheaper.
    The other tokens get logit -inf, so the draft never proposes them and its ``q`` gives them
    probability 0. Speculative sampling stays exact (any ``q`` does); only the acceptance rate
    pays, by at most the target's probability mass outside the subset.
    """

    def __init__(self, embedding: torch.Tensor, vocab: torch.Tensor):
        super().__init__()
        self.vocab_size = embedding.shape[0]
        vocab = vocab.to(embedding.device)
        self.register_buffer("vocab", vocab, persistent=False)
        self.register_buffer("rows", embedding.detach()[vocab].clone(), persistent=False)  # [K, hidden]

    def scores(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits of the ``K`` scored tokens only, ``[..., K]`` (token ``vocab[i]`` at ``i``)."""
        return hidden @ self.rows.T

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        small = self.scores(hidden)  # [..., K]
        logits = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))
        return logits.index_copy_(-1, self.vocab, small)


def subset_positions(vocab: torch.Tensor, tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Each of ``tokens``' index in ``vocab`` (a subset of ``vocab_size`` token ids, in any order),
    -1 for a token outside it: where a trainer finds a target among a subset's scores."""
    lookup = torch.full((vocab_size,), -1, dtype=torch.long, device=tokens.device)
    lookup[vocab.to(tokens.device)] = torch.arange(len(vocab), device=tokens.device)
    return lookup[tokens.long()]
