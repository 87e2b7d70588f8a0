"""Token trees: many continuations of one prompt, scored and sampled a level at a time.

Chapter 5 ("Tree sampling") explains this module.

A *token tree* after a prompt holds several continuations that share their beginnings: the
root is the prompt, every node is one token, and every root-to-leaf path is a continuation.
Nodes are numbered so that a parent comes before its children, level by level, and the tree
is just the list ``parents`` (``-1``: a child of the root, the first token after the prompt):

    parents = [-1, -1, 0, 0, 1]        prompt ─┬─ 0 ─┬─ 2
                                               │     └─ 3
                                               └─ 1 ─── 4

A transformer scores such a tree in **one forward pass**: put all its tokens in one sequence
after the prompt and let each node attend to the prompt, its ancestors and itself only
(``tree_attention_mask``), at the position it would have in its own path
(``tree_position_ids``, both in ``decoding.tree_shape`` with the rest of the tree's shape, which the
speculative loops share). Each node then computes exactly what it would in a plain sequence made
of its path: ``score_tree`` does that, ``score_paths`` is the slow reference that runs every path
on its own.

``sample_tree`` grows a tree level by level, drawing K children per node (K random children,
where beam search keeps the K best); ``gumbel_top_k`` draws K distinct children at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._validate import (bad_logits, check_branching, check_generator, check_logits, check_flag, check_int,
                         check_model, check_parents, checking_values, trusted)
from ..decoding.passes import masked_forward
from ..decoding.prompts import one_prompt
from ..decoding.tree_shape import ancestors, depths, leaves, tree_attention_mask, tree_position_ids
from ..devices import model_device
from ..probs import log_softmax
from ..sampling.draw import add_gumbel_noise, sample
from ..sampling.pipeline import SamplingConfig, process_logits


@dataclass
class TokenTree:
    """A tree of tokens after a prompt (what ``sample_tree`` returns).

    ``parents[i]`` is the parent of node ``i`` (``-1``: the root, i.e. the prompt), and every
    parent comes before its children. ``logprobs[i]`` is the log-probability of ``tokens[i]``
    given the prompt and node i's ancestors under the distribution it was drawn from (after
    temperature and truncation); ``raw_logprobs[i]`` the same under the model's own distribution.
    """

    parents: list[int]
    tokens: torch.Tensor  # [n] long
    logprobs: torch.Tensor  # [n]
    raw_logprobs: torch.Tensor  # [n]

    def __post_init__(self):
        self.parents = check_parents(self.parents)
        n = len(self.parents)
        for name in ("tokens", "logprobs", "raw_logprobs"):
            value = getattr(self, name)
            if not isinstance(value, torch.Tensor) or value.shape != (n,):
                raise ValueError(f"{name} must be a tensor of shape [{n}], one entry per node")

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def depths(self) -> list[int]:
        """The depth of each node: 1 for the children of the root."""
        return depths(self.parents)

    def children(self, i: int) -> list[int]:
        """The children of node ``i`` (``i = -1``: the children of the root)."""
        return [j for j, p in enumerate(self.parents) if p == i]

    def leaves(self) -> list[int]:
        """The nodes without children, in node order."""
        return leaves(self.parents)

    def ancestors(self, i: int) -> list[int]:
        """The nodes on the path from the root to node ``i``, ``i`` included (root side first)."""
        return ancestors(self.parents, i)

    def paths(self) -> list[list[int]]:
        """Each leaf's root-to-leaf path of node indices."""
        return [ancestors(self.parents, leaf) for leaf in leaves(self.parents)]

    def leaf_sequences(self, raw: bool = False) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Each leaf's token sequence (root to leaf, without the prompt) and its summed
        log-probability ``[leaves]``: the log-probability of the whole continuation under the
        sampled distribution, or under the model's own with ``raw=True``."""
        scores = self.raw_logprobs if raw else self.logprobs
        paths = self.paths()
        return [self.tokens[p] for p in paths], torch.stack([scores[p].sum() for p in paths])


# --- The tree as one sequence: mask and positions --------------------------------------------



# --- Scoring a tree ----------------------------------------------------------------------------


@torch.inference_mode()
def score_tree(model, input_ids, parents, tokens) -> tuple[torch.Tensor, torch.Tensor]:
    """Score every node of a tree in one forward pass after the prompt.

    Returns ``(logprobs [n], logits [n, V])``: the log-probability of each node's token given
    the prompt and its ancestors (under the model's own distribution), and the next-token
    logits after each node (float32). ``input_ids`` is one prompt, ``[1, seq]`` or a list of
    ids. Two forward passes in all: the prompt (prefill), then all n nodes at once with the tree
    mask.
    """
    parents = check_parents(parents)
    device = model_device(model)
    ids = one_prompt(input_ids, None, check_model(model))
    tokens = _check_tokens(tokens, len(parents), model, device)
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)  # only the last position's logits are used
    first = out.logits[0, -1:].float()  # [1, V]: the distribution of the root's children
    logits, _ = _forward_nodes(model, out.past_key_values, parents, 0, tokens)
    # Each node's token was predicted by its parent's logits (the prompt's for the root's children).
    before = torch.cat([first, logits])[torch.tensor(parents, device=device) + 1]
    return log_softmax(before).gather(-1, tokens[:, None]).squeeze(-1), logits


@torch.inference_mode()
def score_paths(model, input_ids, parents, tokens) -> tuple[torch.Tensor, torch.Tensor]:
    """The slow reference for ``score_tree``: each root-to-leaf path in its own forward pass
    (prompt + path, no cache, no special mask). Same return values."""
    parents = check_parents(parents)
    device = model_device(model)
    ids = one_prompt(input_ids, None, check_model(model))
    tokens = _check_tokens(tokens, len(parents), model, device)
    seq = ids.shape[1]
    logprobs = torch.empty(len(parents), device=device)
    logits = [None] * len(parents)
    for path in (ancestors(parents, leaf) for leaf in leaves(parents)):
        row = model(input_ids=torch.cat([ids[0], tokens[path]])[None], use_cache=False).logits[0].float()
        # row[seq - 1 + j] predicts the token after path[j - 1]: the token of path[j].
        lp = log_softmax(row[seq - 1 : -1]).gather(-1, tokens[path][:, None]).squeeze(-1)
        for j, node in enumerate(path):  # a node on several paths gets the same value each time
            logprobs[node], logits[node] = lp[j], row[seq + j]
    return logprobs, torch.stack(logits)


def _forward_nodes(model, cache, parents: list[int], start: int, tokens):
    """One pass over nodes ``start..n-1`` (``tokens``, ``[n - start]``), the cache holding the
    prompt and nodes ``0..start-1``. Returns their next-token logits ``[n - start, V]`` and the
    cache, which now holds every node too."""
    prompt_len = cache.get_seq_length() - start
    step = masked_forward(model, cache, tree_attention_mask(parents)[start:],
                          tree_position_ids(parents, prompt_len)[start:], input_ids=tokens)
    return step.logits, step.cache


# --- Sampling a tree ---------------------------------------------------------------------------


def gumbel_top_k(logits: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw ``k`` distinct tokens per row without replacement: the top k of ``logits + Gumbel noise``.

    ``logits`` is ``[batch, V]`` (any leading dimensions), the result ``[batch, k]`` token ids,
    in the order of their perturbed logits. The first is an exact sample from
    ``softmax(logits)`` (that is the Gumbel-max trick); the second is an exact sample from the
    rest, renormalised, and so on: the result is a sample *without replacement*, as if tokens
    were drawn one by one and each drawn token were removed before the next draw. ``k`` may not
    exceed the number of tokens with a finite logit in any row.
    """
    check_logits(logits)
    k = check_int(k, "k", 1)
    if checking_values():  # inside trusted(), the caller has counted the possible tokens
        possible = int((logits > float("-inf")).sum(dim=-1).min())
        if k > possible:
            raise ValueError(f"k={k} distinct tokens asked for, but a row has only {possible} tokens with a finite logit")
    check_generator(generator, logits.device)
    return add_gumbel_noise(logits, generator).topk(k, dim=-1).indices


@torch.inference_mode()
def sample_tree(
    model,
    input_ids,
    *,
    branching,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    typical_p: float | None = None,
    with_replacement: bool = True,
    generator: torch.Generator | None = None,
) -> TokenTree:
    """Grow a token tree after one prompt: ``branching[d]`` children for every node of level d.

    ``branching=(4, 4, 2)`` gives 4 children of the root, 4 children each (16 nodes), then 2
    each (32 leaves). Each level costs one forward pass: the prompt's prefill gives the root's
    children, and the nodes of each new level are run together, with the KV cache holding the
    prompt and the earlier levels and a tree mask letting each node see only its ancestors. The
    last level needs no forward pass. The children of each node are drawn from the model's
    next-token distribution after temperature and truncation (``top_k``, ``top_p``, ``min_p``,
    ``typical_p``, as in ``SamplingConfig``):

    * ``with_replacement=True``: the K children are K independent draws; two may be the same
      token, and both are kept as separate nodes. Every root-to-leaf path is then an exact
      sample of a continuation from the processed distribution.
    * ``with_replacement=False``: the K children are distinct (``gumbel_top_k``). The first
      child is an exact sample; each later one is conditioned on differing from those before,
      so the set is a sample without replacement and the paths are *not* independent samples
      of continuations (they cover more of the distribution, but not in proportion to it).
      To estimate an expectation from them, weight each path with importance weights.
    * ``temperature=0``: the K children are the K most likely tokens, distinct and in order
      (the first is the greedy token), whatever ``with_replacement`` says: a deterministic tree,
      the top-K expansion that beam search prunes. Set against a sampled tree, it is the
      difference between K best and K random children. Truncation rules are skipped at T = 0,
      and ``logprobs`` are 0 (each choice is certain); ``raw_logprobs`` keep the model's.

    ``input_ids`` is one prompt, ``[1, seq]`` or a list of ids.
    """
    config = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p)
    branching = check_branching(branching)
    with_replacement = check_flag(with_replacement, "with_replacement")
    device = model_device(model)
    check_generator(generator, device)
    ids = one_prompt(input_ids, None, check_model(model))

    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)  # prefill; only the last logits are used
    return _grow(model, out.past_key_values, out.logits[0, -1:].float(), branching, config, with_replacement,
                 generator)


def _grow(model, cache, logits, branching, config, with_replacement, generator) -> TokenTree:
    """The levels of ``sample_tree`` after the prefill: ``logits`` ``[1, V]`` are the root's."""
    parents, tokens, logprobs, raw = [], [], [], []
    level = [-1]  # the nodes whose children are drawn next, in the order of the rows of logits
    for depth, k in enumerate(branching):
        if depth > 0:
            # One pass over the newest level: the cache holds the prompt and the levels before it.
            logits, cache = _forward_nodes(model, cache, parents, level[0], torch.cat(tokens)[level[0]:])
        children, lp, raw_lp = _draw_children(logits, k, config, with_replacement, generator)
        first = len(parents)
        parents += [p for p in level for _ in range(k)]  # the k children of each node, together
        tokens.append(children.flatten())
        logprobs.append(lp.flatten())
        raw.append(raw_lp.flatten())
        level = list(range(first, len(parents)))
    return TokenTree(parents, torch.cat(tokens), torch.cat(logprobs), torch.cat(raw))


def _draw_children(logits, k: int, config: SamplingConfig, with_replacement: bool, generator):
    """``k`` children for each row of ``logits`` ``[m, V]``: ids, sampled and raw log-probs, ``[m, k]`` each.

    The rules run under ``trusted()``: the level's logits, as the model gave them and as
    processed, are checked in its one read of the device, with the count of possible tokens."""
    with trusted():
        raw = log_softmax(logits)
        processed = logits if config.temperature == 0.0 else process_logits(logits, config)
    possible = (processed > float("-inf")).sum(dim=-1).min()
    bad = bad_logits(logits) if processed is logits else bad_logits(logits) | bad_logits(processed)  # T = 0: once
    invalid, possible = torch.stack([bad, possible]).tolist()
    if invalid:
        check_logits(logits, "the model's logits")  # raises, saying what is wrong
        check_logits(processed, "the processed logits")
    if config.temperature == 0.0:
        if k > logits.shape[-1]:
            raise ValueError(f"branching asks for {k} children, more than the vocabulary's {logits.shape[-1]} tokens")
        # A stable sort puts tied tokens in id order, so the first child is greedy()'s token.
        children = logits.sort(dim=-1, descending=True, stable=True).indices[:, :k]
        return children, torch.zeros(children.shape, device=logits.device), raw.gather(-1, children)
    with trusted():
        if with_replacement:
            # k independent draws per node: the node's row, repeated k times.
            children = sample(processed.repeat_interleave(k, dim=0), 1.0, generator).view(-1, k)
        elif k > possible:
            raise ValueError(f"branching asks for {k} distinct children, but truncation leaves only {possible} "
                             "possible tokens at some node; use with_replacement=True or loosen the truncation")
        else:
            children = gumbel_top_k(processed, k, generator)
        return children, log_softmax(processed).gather(-1, children), raw.gather(-1, children)



# --- Argument checks ---------------------------------------------------------------------------



def _check_tokens(tokens, n: int, model, device) -> torch.Tensor:
    if isinstance(tokens, (list, tuple)):
        tokens = torch.tensor(tokens, dtype=torch.long, device=device) if tokens else None
    if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long or tokens.shape != (n,):
        raise ValueError(f"tokens must be a LongTensor of shape [{n}], one token per node of parents")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    if (tokens < 0).any() or (vocab is not None and (tokens >= vocab).any()):
        raise ValueError(f"tokens must be token ids in [0, {vocab})")
    return tokens.to(device)
