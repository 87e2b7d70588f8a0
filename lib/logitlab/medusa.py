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
from .tree import _additive_mask, _ancestors, tree_attention_mask, tree_position_ids

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
    num_heads = len({k.split(".")[0] for k in state})
    heads = MedusaHeads(target.lm_head.weight, num_heads, vocab)
    heads.blocks.load_state_dict({k: v.float() for k, v in state.items()})
    return heads.to(target.lm_head.weight.device).eval()


def _check_target(target):
    if not (hasattr(target, "model") and hasattr(target, "lm_head") and hasattr(target.model, "embed_tokens")):
        raise ValueError("target must be a Hugging Face causal LM with .model (its body) and .lm_head, "
                         "such as the SmolLM2 model of ll.load(): the heads read the body's last hidden state")


def body_and_logits(target, **kwargs):
    """One target pass split in two: the body's output (cache, last hidden states ``[B, n, H]``)
    and the logits of the output layer on them (float32). The heads need the hidden states,
    which the usual call does not return."""
    out = target.model(use_cache=True, **kwargs)
    hidden = out.last_hidden_state
    return out.past_key_values, hidden, target.lm_head(hidden).float()


# --- Tree verification -------------------------------------------------------------------------


def cartesian_tree(branching) -> list[int]:
    """Parents of the tree with a root (the pending token) and ``branching[d]`` children under
    every node of depth d + 1: the top tokens of head d + 1 under each path of the heads before."""
    if (not isinstance(branching, (tuple, list)) or not branching
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in branching)):
        raise ValueError(f"branching must be a non-empty tuple of integers >= 1, got {branching!r}")
    parents, level = [-1], [0]
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
    parents = cartesian_tree(branching)
    if len(branching) > heads.num_heads:
        raise ValueError(f"branching has {len(branching)} levels but there are only {heads.num_heads} heads")
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

    cache, hidden, logits = body_and_logits(target, input_ids=ids)
    pending = _next(logits[0, -1], config, acceptance, generator)
    h = hidden[0, -1]
    output, reasons = [int(pending)], ["length"]
    result = SpeculativeResult([], [], reasons, None, [0], target_calls=1)
    n = len(parents)
    allowed_tree = tree_attention_mask(parents)
    depth_of = tree_position_ids(parents)  # depth - 1: 0 for the root, k for head k's guesses

    while not _finished([output], torch.zeros(1, dtype=torch.long), eos, max_new_tokens, reasons).item():
        t0 = time.perf_counter()
        guesses = heads(h)  # [K, V]
        tops = [guesses[d].topk(b).indices for d, b in enumerate(branching)]
        tokens = torch.empty(n, dtype=torch.long, device=device)
        tokens[0] = pending
        rank = {}  # how many children each node has received so far: the child's rank in its head
        for i in range(1, n):
            r = rank.get(parents[i], 0)
            rank[parents[i]] = r + 1
            # The (r + 1)-th most likely token of this depth's head (the heads ignore the path).
            tokens[i] = tops[depth_of[i] - 1][r]
        t1 = time.perf_counter()

        # One pass over the whole tree: each node sees the sequence so far and its ancestors.
        length = cache.get_seq_length()
        allowed = torch.ones(n, length + n, dtype=torch.bool)
        allowed[:, length:] = allowed_tree
        cache, hidden, logits = body_and_logits(
            target, input_ids=tokens[None], attention_mask=_additive_mask(allowed, target).to(device)[None, None],
            position_ids=(depth_of + length)[None].to(device), past_key_values=cache)
        logits, hidden = logits[0], hidden[0]  # [n, V], [n, H]
        result.target_calls += 1

        # Which nodes pass, each judged by its parent's distribution; a node counts only if its parent does.
        ok = torch.zeros(n, dtype=torch.bool)
        ok[0] = True
        pa = torch.tensor(parents[1:])
        if temperature == 0:
            passes = logits[pa].argmax(-1) == tokens[1:]
        else:
            p = softmax(process_logits(logits[pa], config))
            thr = typical_threshold(p, acceptance.epsilon, acceptance.delta)
            passes = p.gather(-1, tokens[1:, None]).squeeze(-1).double() > thr
        for i in range(1, n):
            ok[i] = ok[parents[i]] and bool(passes[i - 1])
        best = max(range(n), key=lambda i: (int(ok[i]) * (int(depth_of[i]) + 1), -i))
        path = _ancestors(parents, best) if best else [0]  # root first
        nxt = _next(logits[best], config, acceptance, generator)

        # Keep only the path's entries in the cache (the other branches were guesses that lost).
        keep = torch.cat([torch.arange(length), length + torch.tensor(path)]).to(device)
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[:, :, keep], layer.values[:, :, keep]
        result.verify_seconds += time.perf_counter() - t1
        result.draft_seconds += t1 - t0
        result.accepted.append([len(path) - 1])
        result.drafted.append(len(branching))
        output += tokens[path[1:]].tolist() + [int(nxt)]
        pending, h = nxt, hidden[best]

    new = torch.tensor(output, dtype=torch.long, device=device)
    result.new_tokens = [new]
    result.sequences = [torch.cat([ids[0], new])]
    if tokenizer is not None:
        result.texts = [tokenizer.decode(output, skip_special_tokens=True)]
    result.drafter_steps = result.target_calls
    result.seconds = time.perf_counter() - start_time
    return result


def _next(logits, config, acceptance, generator) -> torch.Tensor:
    """The target's token after the accepted path: its argmax at T = 0 or with Medusa's rule;
    a sample of p when the typical rule says ``next_token="sample"``."""
    if config.temperature == 0 or acceptance.next_token == "argmax":
        return logits.argmax(-1)
    p = softmax(process_logits(logits, config)).double()
    return torch.multinomial(p, 1, generator=generator).squeeze(-1)
