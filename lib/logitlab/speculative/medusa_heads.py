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
target uses most (``logitlab.speculative.subset_head.SubsetHead``), which keeps a draft cheap.

Two ways to verify the guesses, both in the one loop of ``ll.speculative_generate`` with
``ll.speculative.medusa.MedusaDrafter``:

* as a **chain**: each head's top token (or a sample), and any acceptance rule of the loop
  applies (rejection sampling, greedy matching, typical acceptance);
* as a **tree** (``MedusaDrafter(heads, tree=...)``, or ``medusa_generate`` here): the top ``b_1``
  tokens of head 1, each followed by the top ``b_2`` of head 2, and so on, all verified in one
  target pass with ``decoding.tree_shape``'s attention mask; the deepest accepted path wins. Greedy
  matching at temperature 0; above it, exact recursive rejection sampling over the siblings
  (``logitlab.speculative.tree_verify``, chapter 9) or typical acceptance at each node.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .._validate import check_body_and_head, check_int
from .loop import speculative_generate
from .medusa import MedusaDrafter
from .result import SpeculativeResult
from .subset_head import SubsetHead

# Written by ``python -m logitlab.training.medusa``: the heads' blocks in float16 and the ids of the
# tokens their output layer scores (the output layer itself is the target's embedding).
PRETRAINED_HEADS = Path(__file__).resolve().parents[1] / "data" / "medusa_smollm2_135m.safetensors"


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
        num_heads = check_int(num_heads, "num_heads", 1)
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


def load_pretrained(target, path: str | Path | None = None) -> MedusaHeads:
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
        raise ValueError(f"heads must be MedusaHeads (see logitlab.speculative.medusa_heads.load_pretrained), got {type(heads).__name__}")
    if heads.vocab_size != target.lm_head.weight.shape[0]:
        raise ValueError(f"heads score a vocabulary of {heads.vocab_size} tokens, the target "
                         f"{target.lm_head.weight.shape[0]}: they must be built on the target's output layer")


# --- Tree verification -------------------------------------------------------------------------


def medusa_generate(target, heads: MedusaHeads, input_ids, *, branching=(3, 2, 1), max_new_tokens: int,
                    temperature: float = 0.0, acceptance=None, eos_token_id=None, tokenizer=None,
                    generator: torch.Generator | None = None, constraint=None) -> SpeculativeResult:
    """Generate with Medusa heads, verifying a tree of their guesses per target call: the loop of
    ``ll.speculative_generate`` with ``ll.speculative.medusa.MedusaDrafter(heads, tree=branching)``.

    ``branching`` = (b_1, b_2, ...): the top b_1 tokens of head 1, under each the top b_2 of head
    2, and so on (at most ``heads.num_heads`` levels). At temperature 0 a node is accepted when it
    is the target's most likely token after its parent (the output is greedy decoding's, exactly).
    Above 0, ``acceptance`` is rejection sampling by default (exact: recursive rejection over the
    siblings, each guess a point mass since the heads' top tokens are chosen, not sampled), or
    ``ll.TypicalAcceptance(...)``, applied to each node. The deepest accepted node wins.
    ``constraint`` as in ``ll.speculative_generate``: each node is verified against the target
    masked in the state after its own path, and a guess the constraint forbids is rejected.
    """
    check_body_and_head(target)
    _check_heads(heads, target)
    if not branching:
        raise ValueError("branching must have at least one level, got ()")
    if len(branching) > heads.num_heads:
        raise ValueError(f"branching has {len(branching)} levels, but a level needs a head and there are only "
                         f"{heads.num_heads}: give at most {heads.num_heads} numbers, got {tuple(branching)!r}")
    return speculative_generate(target, MedusaDrafter(heads, tree=tuple(branching)), input_ids,
                                gamma=len(branching), max_new_tokens=max_new_tokens, temperature=temperature,
                                acceptance=acceptance, eos_token_id=eos_token_id, tokenizer=tokenizer,
                                generator=generator, constraint=constraint)
