"""Medusa heads: small extra heads on the target's last hidden state that guess further ahead.

Chapter 7 ("Typical acceptance") explains this module.

Medusa (Cai et al., 2024) drafts without a second model. The target's last hidden state ``h``
at the newest position already produces the next token through the output layer. Head ``k``
(k = 1, 2, ...) is one small residual block, ``h + SiLU(W_k h + b_k)``, followed by the same
output layer: it guesses the token ``k + 1`` places ahead from that same ``h``, without knowing
the tokens in between. A draft therefore costs almost nothing: K tiny blocks and K output
products, no transformer layer at all.

The output layer is SmolLM2's tied embedding, which the heads share (only the blocks are
trained and shipped). As for the draft model of chapter 6, they score only the 2048 tokens the
target uses most (``logitlab.train_draft.SubsetHead``), which keeps a draft cheap.

Two ways to verify the guesses, both here:

* as a **chain** in ``ll.speculative_generate``: ``ll.drafters.MedusaDrafter`` proposes each head's
  top token (or a sample), and any acceptance rule of the loop applies (rejection sampling,
  greedy matching, typical acceptance);
* as a **tree** in ``medusa_generate``: the top ``b_1`` tokens of head 1, each followed by the top
  ``b_2`` of head 2, and so on, all verified in one target pass with ``logitlab.tree``'s attention
  mask; the longest accepted path wins. Greedy matching at temperature 0, typical acceptance
  above (rejection sampling over a tree needs a multi-draft rule and is not covered).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from ._validate import check_generator
from .probs import softmax
from .sampling import SamplingConfig, process_logits
from .train_draft import SubsetHead
from .tree import _additive_mask, ancestors, tree_attention_mask, tree_position_ids

# Written by ``python -m logitlab.train_medusa``: the heads' blocks in float16 and the ids of the
# tokens their output layer scores (the output layer itself is the target's embedding).
PRETRAINED_HEADS = Path(__file__).parent / "data" / "medusa_smollm2_135m.safetensors"


class ResBlock(torch.nn.Module):
    """``h + SiLU(W h + b)``. W starts at zero, so an untrained head is the identity and its guess
    is the target's own next-token prediction: a sensible start for every head."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = torch.nn.Linear(hidden_size, hidden_size)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.nn.functional.silu(self.linear(h))


class MedusaHeads(torch.nn.Module):
    """``num_heads`` heads sharing the output layer ``embedding`` (frozen, not stored).

    ``forward(hidden [..., H]) -> logits [..., num_heads, V]``: head k (index k - 1) predicts the
    token k + 1 places after the position whose hidden state it reads. With ``vocab`` (token ids)
    the output layer scores only those tokens (the rest get -inf); ``small_logits`` gives the
    scores on ``vocab`` alone, for training.
    """

    def __init__(self, embedding: torch.Tensor, num_heads: int, vocab: torch.Tensor | None = None):
        super().__init__()
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
            raise ValueError(f"num_heads must be an integer >= 1, got {num_heads!r}")
        self.vocab_size, hidden = embedding.shape
        self.num_heads = num_heads
        self.blocks = torch.nn.ModuleList(ResBlock(hidden) for _ in range(num_heads))
        vocab = torch.arange(self.vocab_size) if vocab is None else vocab.long()
        self.output = SubsetHead(embedding, vocab)

    def states(self, hidden: torch.Tensor) -> torch.Tensor:
        """Each head's transformed state: ``[..., num_heads, H]``."""
        return torch.stack([block(hidden) for block in self.blocks], dim=-2)

    def small_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Scores on the head's vocabulary only: ``[..., num_heads, len(vocab)]``."""
        return self.states(hidden) @ self.output.rows.T

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(self.states(hidden))


def save_heads(heads: MedusaHeads, path: str) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().half().contiguous() for k, v in heads.blocks.state_dict().items()}
    state["vocab"] = heads.output.vocab.int().contiguous()
    save_file(state, path)


def load_heads(target, path: str | Path | None = None) -> MedusaHeads:
    """Heads saved by ``save_heads`` (the shipped ones by default), built on ``target``'s embedding."""
    from safetensors.torch import load_file

    _check_target(target)
    state = load_file(str(PRETRAINED_HEADS if path is None else path))
    vocab = state.pop("vocab").long()
    weight = target.lm_head.weight
    shapes = {tuple(v.shape) for k, v in state.items() if k.endswith("linear.weight")}
    if shapes != {(weight.shape[1], weight.shape[1])} or int(vocab.max()) >= weight.shape[0]:
        raise ValueError(f"target: these heads were trained for another model (block shapes {shapes}, token ids "
                         f"up to {int(vocab.max())}); the target has hidden size {weight.shape[1]} and "
                         f"{weight.shape[0]} tokens")
    num_heads = len({k.split(".")[0] for k in state})
    heads = MedusaHeads(weight, num_heads, vocab)
    heads.blocks.load_state_dict({k: v.float() for k, v in state.items()})
    return heads.to(device=weight.device, dtype=weight.dtype).eval()  # the target's device and dtype


def _check_target(target):
    if not (hasattr(target, "model") and hasattr(target, "lm_head") and hasattr(target.model, "embed_tokens")):
        raise ValueError("target must be a Hugging Face causal LM with .model (its body) and .lm_head, "
                         "such as the SmolLM2 model of ll.load(): the heads read the body's last hidden state")


def _check_heads(heads, target):
    if not isinstance(heads, MedusaHeads):
        raise ValueError(f"heads must be MedusaHeads (see logitlab.medusa.load_heads), got {type(heads).__name__}")
    if heads.vocab_size != target.lm_head.weight.shape[0]:
        raise ValueError(f"heads score a vocabulary of {heads.vocab_size} tokens, the target "
                         f"{target.lm_head.weight.shape[0]}: they must be built on the target's output layer")


def body_and_logits(target, logits_to_keep: int | None = None, **kwargs):
    """One target pass split in two: the body's output (cache, last hidden states ``[B, n, H]``)
    and the logits of the output layer on them (float32; on the last ``logits_to_keep``
    positions only, if given). The heads need the hidden states, which the usual call does not
    return. This assumes the model's logits are just ``lm_head(hidden)``, as for Llama models
    such as SmolLM2 (no logit soft-capping or scaling after the output layer)."""
    out = target.model(use_cache=True, **kwargs)
    hidden = out.last_hidden_state
    scored = hidden if logits_to_keep is None else hidden[:, -logits_to_keep:]
    return out.past_key_values, hidden, target.lm_head(scored).float()


# --- Tree verification -------------------------------------------------------------------------


def cartesian_tree(branching) -> list[int]:
    """Parents of the tree with a root (the pending token) and ``branching[d]`` children under
    every node of depth d + 1: the top tokens of head d + 1 under each path of the heads before."""
    if (not isinstance(branching, (tuple, list))
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in branching)):
        raise ValueError(f"branching must be a tuple of integers >= 1, got {branching!r}")
    parents, level = [-1], [0]  # () gives the root alone
    for b in branching:
        nxt = []
        for node in level:
            for _ in range(b):
                parents.append(node)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


@torch.inference_mode()
def medusa_generate(target, heads: MedusaHeads, input_ids, *, branching=(3, 2, 1), max_new_tokens: int,
                    temperature: float = 0.0, acceptance=None, eos_token_id=None, tokenizer=None,
                    generator: torch.Generator | None = None):
    """Generate one sequence with Medusa heads, verifying a tree of their guesses per target call.

    ``branching`` = (b_1, b_2, ...): the top b_1 tokens of head 1, under each the top b_2 of head
    2, and so on (at most ``heads.num_heads`` levels). At temperature 0 a node is accepted when it
    is the target's most likely token after its parent (the output is greedy decoding's, exactly);
    above 0, ``acceptance`` must be a ``ll.TypicalAcceptance``, applied to each node. The deepest
    accepted node wins (the first one in tree order on a tie) and the target's token after it
    is the next token. Returns a ``SpeculativeResult`` (one row).
    """
    from .generate import _check_counts
    from .speculative import SpeculativeResult, _eos_ids, _finished, _prompt_batch
    from .typical_acceptance import TypicalAcceptance, typical_threshold

    start_time = time.perf_counter()
    _check_target(target)
    _check_heads(heads, target)
    if not branching:
        raise ValueError("branching must have at least one level, got ()")
    cartesian_tree(branching)  # checks it
    if len(branching) > heads.num_heads:
        raise ValueError(f"branching has {len(branching)} levels but there are only {heads.num_heads} heads")
    if max(branching) > len(heads.output.vocab):
        raise ValueError(f"branching asks for {max(branching)} guesses per head, but the heads score only "
                         f"{len(heads.output.vocab)} tokens")
    _check_counts(max_new_tokens, 0, 1)
    config = SamplingConfig(temperature=temperature)
    if temperature > 0 and not isinstance(acceptance, TypicalAcceptance):
        raise ValueError("acceptance must be ll.TypicalAcceptance(...) when temperature > 0: a tree is verified "
                         "greedily (T = 0) or with typical acceptance; rejection sampling needs a chain")
    eos = _eos_ids(eos_token_id, target)
    device = target.model.embed_tokens.weight.device
    check_generator(generator, device)
    ids, mask = _prompt_batch(input_ids, None, tokenizer, device)
    if ids.shape[0] != 1:
        raise ValueError(f"input_ids must be one prompt for tree verification, got {ids.shape[0]}")

    cache, hidden, logits = body_and_logits(target, logits_to_keep=1, input_ids=ids)
    pending = _next(logits[0, -1], config, acceptance, generator)
    h = hidden[0, -1]
    output, reasons = [int(pending)], ["length"]
    rows = [output]  # the one row, in the form the loop's helper _finished takes
    result = SpeculativeResult([], [], reasons, None, [0], target_calls=1)
    only_row = torch.zeros(1, dtype=torch.long)

    while not _finished(rows, only_row, eos, max_new_tokens, reasons).item():
        # No deeper than the tokens still needed: a call yields its accepted drafts and one more.
        levels = branching[: max_new_tokens - len(output) - 1]
        parents = cartesian_tree(levels)
        n = len(parents)
        depth = tree_position_ids(parents)  # 0 for the root (the pending token), k for head k's guesses

        # 1. Draft: the top guesses of each head, placed in the tree.
        t0 = time.perf_counter()
        guesses = heads(h)  # [K, V]
        tops = [guesses[d].topk(b).indices for d, b in enumerate(levels)]
        tokens = torch.empty(n, dtype=torch.long, device=device)
        tokens[0] = pending
        rank = {}  # how many children each node has received so far: the child's rank in its head
        for i in range(1, n):
            r = rank.get(parents[i], 0)
            rank[parents[i]] = r + 1
            # The (r + 1)-th most likely token of this depth's head (the heads ignore the path).
            tokens[i] = tops[depth[i] - 1][r]
        t1 = time.perf_counter()

        # 2. One pass over the whole tree: each node sees the sequence so far and its ancestors.
        length = cache.get_seq_length()
        allowed = torch.ones(n, length + n, dtype=torch.bool)
        allowed[:, length:] = tree_attention_mask(parents)
        cache, hidden, logits = body_and_logits(
            target, input_ids=tokens[None], attention_mask=_additive_mask(allowed, target).to(device)[None, None],
            position_ids=(depth + length)[None].to(device), past_key_values=cache)
        logits, hidden = logits[0], hidden[0]  # [n, V], [n, H]
        result.target_calls += 1

        # 3. Which nodes pass, each judged by its parent's distribution; a node counts only if its
        #    parent does (parents come before their children in the list).
        ok = [True] + [False] * (n - 1)
        if n > 1:
            pa = torch.tensor(parents[1:])
            if temperature == 0:
                passes = logits[pa].argmax(-1) == tokens[1:]
            else:
                p = softmax(process_logits(logits[pa], config))
                bar = typical_threshold(p, acceptance.epsilon, acceptance.delta)
                passes = p.gather(-1, tokens[1:, None]).squeeze(-1).double() > bar
            for i in range(1, n):
                ok[i] = ok[parents[i]] and bool(passes[i - 1])
        best = 0  # the deepest accepted node; on a tie the first in the list
        for i in range(1, n):
            if ok[i] and depth[i] > depth[best]:
                best = i
        path = ancestors(parents, best)  # root first
        nxt = _next(logits[best], config, acceptance, generator)

        # 4. Keep only the path's entries in the cache: the other branches were guesses that lost.
        #    (Each layer of a transformers DynamicCache holds keys and values [B, heads, seq, dim].)
        keep = torch.cat([torch.arange(length), length + torch.tensor(path)]).to(device)
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys.index_select(2, keep), layer.values.index_select(2, keep)
        result.verify_seconds += time.perf_counter() - t1
        result.draft_seconds += t1 - t0
        result.accepted.append([len(path) - 1])
        result.drafted.append(len(levels))
        output += tokens[path[1:]].tolist() + [int(nxt)]
        pending, h = nxt, hidden[best]

    new = torch.tensor(output, dtype=torch.long, device=device)
    result.new_tokens = [new]
    result.sequences = [torch.cat([ids[0], new])]
    if tokenizer is not None:
        result.texts = [tokenizer.decode(output, skip_special_tokens=True)]
    # Counted like a draft model's steps (see SpeculativeResult.draft_step_seconds): one for the
    # prompt, here the target's prefill that gave the first hidden state, then one per head call.
    result.drafter_steps = result.target_calls
    result.seconds = time.perf_counter() - start_time
    return result


def _next(logits, config, acceptance, generator) -> torch.Tensor:
    """The target's token after the accepted path (``logits`` ``[V]``): its argmax at T = 0,
    otherwise the typical rule's choice (its argmax, or a sample of p)."""
    if config.temperature == 0:
        return logits.argmax(-1)
    return acceptance.next_from(softmax(process_logits(logits[None], config)), generator)[0]
