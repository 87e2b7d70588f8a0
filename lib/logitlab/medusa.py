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
target uses most (``logitlab.drafters.SubsetHead``), which keeps a draft cheap.

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

from pathlib import Path

import torch

from ._validate import check_generator
from .decoding import (check_body_and_head, check_counts, eos_ids, forward, keep_cache_positions, masked_forward,
                       one_prompt, target_probs)
from .devices import model_device, now
from .drafters import SubsetHead
from .sampling import SamplingConfig
from .speculative import GreedyMatching, Outputs, SpeculativeResult
from .tree import ancestors, depths, tree_attention_mask, tree_position_ids
from .typical_acceptance import TypicalAcceptance, typical_threshold

# Written by ``python -m logitlab.training.medusa``: the heads' blocks in float16 and the ids of the
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
        vocab = torch.arange(self.vocab_size, device=embedding.device) if vocab is None else vocab.long()
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

    check_body_and_head(target)
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


def _check_heads(heads, target):
    if not isinstance(heads, MedusaHeads):
        raise ValueError(f"heads must be MedusaHeads (see logitlab.medusa.load_heads), got {type(heads).__name__}")
    if heads.vocab_size != target.lm_head.weight.shape[0]:
        raise ValueError(f"heads score a vocabulary of {heads.vocab_size} tokens, the target "
                         f"{target.lm_head.weight.shape[0]}: they must be built on the target's output layer")


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
                    generator: torch.Generator | None = None) -> SpeculativeResult:
    """Generate one sequence with Medusa heads, verifying a tree of their guesses per target call.

    ``branching`` = (b_1, b_2, ...): the top b_1 tokens of head 1, under each the top b_2 of head
    2, and so on (at most ``heads.num_heads`` levels). At temperature 0 a node is accepted when it
    is the target's most likely token after its parent (the output is greedy decoding's, exactly);
    above 0, ``acceptance`` must be a ``ll.TypicalAcceptance``, applied to each node. The deepest
    accepted node wins (the first one in tree order on a tie) and the target's token after it
    is the next token. Returns a ``SpeculativeResult`` (one row).
    """
    config, rule = _check_tree_arguments(target, heads, branching, temperature, acceptance)
    max_new_tokens = check_counts(max_new_tokens)[0]
    eos = eos_ids(eos_token_id, target)
    device = model_device(target)
    check_generator(generator, device)
    ids = one_prompt(input_ids, tokenizer, target)
    began, out = now(device), Outputs(1, eos, max_new_tokens)
    step = forward(target, input_ids=ids, logits_to_keep=1, hidden=True)
    cache, h = step.cache, step.hidden[0, -1]
    pending = rule.first_token(step.logits[:, -1], config, generator)
    out.add([0], pending[:, None], step.logits[:, -1:], target_probs(step.logits[:, -1:], config), [1])
    stats = dict(model_calls=1, accepted=[], drafted=[], draft_seconds=0.0, verify_seconds=0.0, step_seconds=[],
                 prefill_seconds=now(device) - began)

    while not out.finished([0])[0]:
        # No deeper than the tokens still needed: a call yields its accepted drafts and one more.
        levels = branching[: max_new_tokens - len(out.tokens[0]) - 1]
        t0 = now(device)
        parents, tokens = _draft_tree(heads, h, pending, levels)  # 1. the heads' guesses as a tree
        t1 = now(device)
        length = cache.get_seq_length()  # 2. one pass over the whole tree
        step = masked_forward(target, cache, tree_attention_mask(parents), tree_position_ids(parents, length),
                              input_ids=tokens, hidden=True)
        path, nxt = _accept_path(step.logits, parents, tokens, config, rule, generator)  # 3. the best path
        # 4. Keep only the path's entries in the cache: the other branches were guesses that lost.
        path_t = torch.tensor(path, device=device)
        keep_cache_positions(step.cache, torch.cat([torch.arange(length, device=device), length + path_t]))
        emitted = torch.cat([tokens[path_t[1:]], nxt])[None]
        out.add([0], emitted, step.logits[path_t][None], target_probs(step.logits[path_t][None], config),
                [len(path)])
        t2 = now(device)
        stats["model_calls"] += 1
        stats["accepted"].append([len(path) - 1])
        stats["drafted"].append(len(levels))
        stats["draft_seconds"] += t1 - t0
        stats["verify_seconds"] += t2 - t1
        stats["step_seconds"].append(t2 - t0)
        cache, pending, h = step.cache, nxt, step.hidden[path[-1]]
    # Head calls are counted like a draft model's steps (SpeculativeResult.draft_step_seconds):
    # one for the prompt (the target's prefill gave the first hidden state), then one per call.
    return out.result([ids[0]], [0], tokenizer, device, seconds=now(device) - began,
                      drafter_steps=stats["model_calls"], **stats)


def _check_tree_arguments(target, heads, branching, temperature, acceptance):
    """The sampling config and the rule of a tree verification, after checking every argument."""
    check_body_and_head(target)
    _check_heads(heads, target)
    if not branching:
        raise ValueError("branching must have at least one level, got ()")
    cartesian_tree(branching)  # checks it
    if len(branching) > heads.num_heads:
        raise ValueError(f"branching has {len(branching)} levels but there are only {heads.num_heads} heads")
    if max(branching) > len(heads.output.vocab):
        raise ValueError(f"branching asks for {max(branching)} guesses per head, but the heads score only "
                         f"{len(heads.output.vocab)} tokens")
    config = SamplingConfig(temperature=temperature)
    if temperature > 0 and not isinstance(acceptance, TypicalAcceptance):
        raise ValueError("acceptance must be ll.TypicalAcceptance(...) when temperature > 0: a tree is verified "
                         "greedily (T = 0) or with typical acceptance; rejection sampling needs a chain")
    return config, GreedyMatching() if temperature == 0 else acceptance


def _draft_tree(heads, h, pending, levels):
    """The tree's parents and tokens: the pending token as the root, then the top guesses of
    each head, placed level by level (the heads ignore the path: siblings' subtrees are alike)."""
    parents = cartesian_tree(levels)
    depth = depths(parents)  # 1 for the root (the pending token), k + 1 for head k's guesses
    guesses = heads(h)  # [K, V]
    tops = [guesses[d].topk(b).indices.tolist() for d, b in enumerate(levels)]
    tokens, rank = [int(pending)], {}  # rank: how many children each node has received so far
    for i in range(1, len(parents)):
        r = rank.get(parents[i], 0)
        rank[parents[i]] = r + 1
        tokens.append(tops[depth[i] - 2][r])  # the (r + 1)-th most likely token of this depth's head
    return parents, torch.tensor(tokens, dtype=torch.long, device=h.device)


def _accept_path(logits, parents, tokens, config, rule, generator):
    """Which nodes pass, each judged by its parent's distribution (a node counts only if its parent
    does); returns the root-to-deepest-accepted-node path (the first in list order on a tie) and
    the target's next token after it ``[1]``."""
    n = len(parents)
    ok = [True] + [False] * (n - 1)
    if n > 1:
        pa = torch.tensor(parents[1:], device=logits.device)
        if config.temperature == 0:
            passes = logits[pa].argmax(-1) == tokens[1:]
        else:
            p = target_probs(logits[pa], config)
            bar = typical_threshold(p, rule.epsilon, rule.delta)
            passes = p.gather(-1, tokens[1:, None]).squeeze(-1).to(bar.dtype) > bar
        passes = passes.tolist()
        for i in range(1, n):  # parents come before their children in the list
            ok[i] = ok[parents[i]] and passes[i - 1]
    depth = depths(parents)
    best = max((i for i in range(n) if ok[i]), key=lambda i: (depth[i], -i))
    return ancestors(parents, best), rule.first_token(logits[best][None], config, generator)
