"""Drafters: who proposes the tokens that speculative sampling verifies.

Chapter 6 ("Speculative sampling") explains this module; chapter 7 adds Medusa heads, chapter 8
PaSS look-ahead embeddings.

Every drafter implements ``logitlab.drafter.Drafter``, the interface ``ll.speculative_generate``
calls (``start``, ``propose``, ``rollback``, ``select_rows``). Any proposal keeps the output
exact (that is the point of the verification), so a drafter is judged only by how often its
proposals are accepted and by what it costs.

* ``DraftModelDrafter``: a small language model with the target's tokenizer, sampling its
  proposals one at a time from its own (processed) distribution, with its own KV cache rolled
  back like the target's.
* ``load_pretrained(target)``: the book's own draft model for SmolLM2-135M (one transformer
  layer trained by ``python -m logitlab.training.draft``; it shares the target's embedding, so only
  the layer and a norm are shipped, and its output layer scores only the 2048 tokens SmolLM2
  uses most, the cheapest way found to make a draft step cheap).
* ``MedusaDrafter`` (chapter 7): Medusa heads (``logitlab.medusa``) guessing from the target's
  own last hidden state, one guess per head (``reads_hidden_state = True``: the loop hands it
  that state after every pass). ``ll.medusa.load_heads(target)`` gives the book's heads.
* ``logitlab.lookahead.LookaheadEmbeddings`` (chapter 8, PaSS): the target drafts for itself,
  fed a few learned look-ahead embeddings after the context; it keeps its own copy of the
  target's cache, which it takes from the loop's prefill (``start``).
  ``ll.lookahead.load_pretrained(target, k)`` gives the book's embeddings for SmolLM2-135M.
* ``PromptLookupDrafter``: no model at all. It finds an earlier occurrence (the earliest, by
  default) of the context's last n tokens and proposes what followed it, with ``q`` one-hot on each proposal:
  very cheap, and good when the output copies from the input (summaries, edits, code).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from . import fast_cpu
from .decoding.cache import roll_back
from .decoding.passes import forward
from .sampling.pipeline import draw
from .drafter import Drafter, DraftTree
from .decoding.tree_shape import cartesian_tree, depths


class DraftModelDrafter(Drafter):
    """Proposals sampled from a small model, one forward pass per proposed token."""

    def __init__(self, model):
        if not isinstance(model, torch.nn.Module) or not hasattr(getattr(model, "config", None), "vocab_size"):
            raise ValueError("model must be a causal language model with config.vocab_size")
        self.model = model
        self.vocab_size = int(model.config.vocab_size)

    @torch.inference_mode()
    def start(self, input_ids, attention_mask, target=None, cache=None) -> None:
        positions = (attention_mask.cumsum(dim=-1) - 1).clamp_min(0)
        step = forward(self.model, input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                       logits_to_keep=1)
        self.cache, self.mask = step.cache, attention_mask
        # A proposal that was accepted but never fed to the draft model (the last of a fully
        # accepted draft): it must go in before the next token. -1: none.
        self.unfed = torch.full((input_ids.shape[0],), -1, dtype=torch.long, device=input_ids.device)
        self.steps = 1  # forward passes of the draft model, this prefill included

    @torch.inference_mode()
    def propose(self, next_tokens, gamma, config, generator=None):
        # Feed what the draft model has not seen: (the unfed proposal and) the target's token.
        if bool((self.unfed >= 0).any()):  # one host sync per call, not per token
            feed = torch.stack([self.unfed.clamp_min(0), next_tokens], dim=1)
            new_mask = torch.stack([(self.unfed >= 0).long(), torch.ones_like(next_tokens)], dim=1)
        else:
            feed, new_mask = next_tokens[:, None], torch.ones_like(next_tokens)[:, None]
        tokens, qs = [], []
        for i in range(gamma):
            token, q = draw(self.constrained(self._forward(feed, new_mask)), config, generator)
            self.drafted(token)
            tokens.append(token)
            qs.append(q)
            if i < gamma - 1:  # the last proposal is not fed now (it may be rejected anyway)
                feed, new_mask = token[:, None], torch.ones_like(token)[:, None]
        self.proposed = torch.stack(tokens, dim=1)
        return self.proposed, torch.stack(qs, dim=1)

    def _forward(self, feed, new_mask):
        self.mask = torch.cat([self.mask, new_mask], dim=1)
        positions = (self.mask.cumsum(dim=-1) - 1).clamp_min(0)[:, -feed.shape[1]:]
        step = forward(self.model, input_ids=feed, attention_mask=self.mask, position_ids=positions,
                       cache=self.cache, logits_to_keep=1)
        self.cache = step.cache
        self.steps += 1
        return step.logits[:, -1]

    def rollback(self, num_accepted: torch.Tensor) -> None:
        gamma = self.proposed.shape[1]
        # Proposals 1 .. gamma - 1 are in the cache (the last was drawn, never fed).
        self.mask = roll_back(self.cache, self.mask, gamma - 1, num_accepted)
        self.unfed = torch.where(num_accepted == gamma, self.proposed[:, -1], torch.full_like(num_accepted, -1))

    def select_rows(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.mask, self.unfed = self.mask[keep], self.unfed[keep]


class PromptLookupDrafter(Drafter):
    """Proposals copied from the context: what followed an earlier match of its last n tokens.

    ``max_ngram`` down to ``min_ngram`` tokens are tried, longest first. ``match`` says which
    earlier occurrence is copied when there are several: ``"earliest"`` (the default, as Hugging
    Face's prompt lookup does; measured faster on prompts whose answer copies them, where the
    first occurrence is usually in the prompt itself) or ``"latest"``. Rows without a match
    propose fewer tokens; all rows propose the same number (the longest proposal), the shorter
    ones padded with their last token (any proposal is allowed: a bad one is just rejected).
    """

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1, match: str = "earliest"):
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
        if not (isinstance(min_ngram, int) and isinstance(max_ngram, int) and 1 <= min_ngram <= max_ngram):
            raise ValueError(f"need integers 1 <= min_ngram <= max_ngram, got {min_ngram!r}, {max_ngram!r}")
        if match not in ("earliest", "latest"):
            raise ValueError(f"match must be 'earliest' or 'latest', got {match!r}")
        self.vocab_size, self.max_ngram, self.min_ngram, self.match = vocab_size, max_ngram, min_ngram, match

    def start(self, input_ids, attention_mask, target=None, cache=None) -> None:
        self.history = [row[m.bool()].tolist() for row, m in zip(input_ids, attention_mask)]

    def propose(self, next_tokens, gamma, config, generator=None):
        for row, t in zip(self.history, next_tokens.tolist()):
            row.append(t)
        found = [self._lookup(row, gamma) for row in self.history]
        g = max(len(f) for f in found)
        self.proposed = [f + [row[-1] if not f else f[-1]] * (g - len(f)) for f, row in zip(found, self.history)]
        tokens = torch.tensor(self.proposed, dtype=torch.long, device=next_tokens.device).view(len(found), g)
        return tokens, torch.nn.functional.one_hot(tokens, self.vocab_size).float()

    def _lookup(self, row: list[int], gamma: int) -> list[int]:
        for n in range(min(self.max_ngram, len(row) - 1), self.min_ngram - 1, -1):
            tail = row[-n:]
            starts = range(len(row) - n)  # every earlier occurrence, not the tail itself
            for start in (starts if self.match == "earliest" else reversed(starts)):
                if row[start:start + n] == tail:
                    return row[start + n:start + n + gamma]
        return []

    def rollback(self, num_accepted: torch.Tensor) -> None:
        for row, proposed, n in zip(self.history, self.proposed, num_accepted.tolist()):
            row.extend(proposed[:n])

    def select_rows(self, keep: torch.Tensor) -> None:
        self.history = [self.history[i] for i in keep.tolist()]


class MedusaDrafter(Drafter):
    """Proposals from Medusa heads (``logitlab.medusa``), as a chain or, with ``tree``, as a tree.

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
            raise ValueError("heads must be MedusaHeads (see logitlab.medusa.load_heads)")
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


# The shipped draft for SmolLM2-135M: its one layer and final norm in float16, and the ids of
# the tokens its output layer scores (the embedding is the target's own and is not stored).
# Written by python -m logitlab.training.draft.
PRETRAINED_DRAFT = Path(__file__).parent / "data" / "draft_smollm2_135m.safetensors"


def load_pretrained(target, full_vocabulary: bool = False):
    """The book's trained draft model for SmolLM2-135M, built around ``target``'s embedding.

    Returns a Hugging Face ``LlamaForCausalLM`` with one layer: the drafter of
    ``ll.speculative_generate`` once wrapped (``DraftModelDrafter(draft)``), or Hugging Face's
    ``assistant_model`` as it is. Its output layer scores only the tokens SmolLM2 uses most (a ``SubsetHead``), which makes a draft
    step several times cheaper; ``full_vocabulary=True`` gives it the whole output layer instead.
    """
    config = getattr(target, "config", None)
    shape = tuple(getattr(config, k, None) for k in ("vocab_size", "hidden_size", "num_hidden_layers"))
    if shape != (49152, 576, 30):
        raise ValueError("target must be SmolLM2-135M (vocab 49152, hidden size 576, 30 layers), the model "
                         f"the shipped draft was trained for; got (vocab, hidden, layers) = {shape}")
    if not isinstance(full_vocabulary, bool):
        raise ValueError(f"full_vocabulary must be True or False, got {full_vocabulary!r}")
    return load_draft(target, str(PRETRAINED_DRAFT), full_vocabulary=full_vocabulary)


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


def load_draft(target, path: str, full_vocabulary: bool = False):
    """Rebuild the draft model from the target and a file written by ``save_draft``.

    If the file names an output vocabulary, the draft predicts only those tokens (a
    ``SubsetHead``), unless ``full_vocabulary`` asks for the whole output layer. When the target
    has ``ll.load``'s CPU fast path, the draft gets it too.
    """
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
    return draft.eval()


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
