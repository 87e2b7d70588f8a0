"""Masking is not conditioning: the two distributions of a constraint, computed exactly.

Chapter 11 ("When the output must match a pattern") explains this module.

Masking step by step (``ll.generate(..., constraint=)``) renormalises the model's next-token
distribution over the allowed tokens at every step:

    P_mask(t_1 .. t_n) = prod_i p(t_i | t_<i) / Z_i,   Z_i = sum of p over the tokens allowed at step i.

The model's own distribution *conditioned* on the output matching is instead

    P_cond(t_1 .. t_n) = prod_i p(t_i | t_<i) / Z,     Z = the probability that an output matches.

(EOS is the last t_i in both.) On an output y that matches and that the model can produce,
with the Z_i taken along y, the model's probabilities cancel:

    P_mask(y) / P_cond(y) = Z / prod_i Z_i,

so the two agree exactly when prod_i Z_i = Z for every such output. The same Z_i at every step
is not the condition: it is not sufficient when outputs differ in length (with the outputs
"A" + EOS and "AB" + EOS and every Z_i = a < 1, the products are a**2 and a**3, and at most one
of them can be Z), and not necessary (a pattern with a single token sequence has
Z_i = p(t_i | t_<i), whatever they are, and prod_i Z_i = Z). Masking favours the outputs with a
small product: those along which the model kept putting its probability on forbidden tokens,
which happens after the output has entered a path the model would not continue on its own.

Where a pattern has finitely many outputs, both are computed here exactly, from one batched
forward pass over every token sequence that matches (``token_paths``): for every sequence, its
probability under the model (EOS included) and under the masked sampler.
"""

from __future__ import annotations

import torch

from ..constrained.constraint import Constraint
from ..decoding.passes import forward
from ..devices import model_device


def token_paths(constraint: Constraint, max_tokens: int = 16, limit: int = 10_000) -> list[tuple[int, ...]]:
    """Every token sequence (EOS not included) that spells a complete match in at most
    ``max_tokens`` tokens: all the tokenisations of every matching string. ``ValueError`` past
    ``limit`` sequences (an infinite or very large pattern)."""
    paths, stack = [], [(0, ())]
    while stack:
        state, path = stack.pop()
        if constraint.is_complete(state):
            paths.append(path)
            if len(paths) > limit:
                raise ValueError(f"the pattern has more than limit={limit} token sequences")
        if len(path) < max_tokens:
            for token in constraint.allowed(state).tolist():
                if token not in constraint.eos:
                    stack.append((constraint.next_state(state, token), path + (token,)))
    return sorted(paths)


@torch.inference_mode()
def path_probabilities(model, prompt_ids: list[int], constraint: Constraint, paths, eos_token_id: int | None = None):
    """For each token sequence of ``paths`` (ended by EOS), ``(model, masked)``: its probability
    under the model after ``prompt_ids`` and under masked sampling (both at temperature 1).
    Returns two float tensors ``[len(paths)]``."""
    eos = constraint.eos[0] if eos_token_id is None else eos_token_id
    device = model_device(model)
    # The prompt once, its cache copied for every path; then all paths in one batched pass.
    step = forward(model, input_ids=torch.tensor([list(prompt_ids)], device=device))
    cache, first = step.cache, step.logits[:, -1:]
    cache.batch_repeat_interleave(len(paths))
    width = max(len(p) for p in paths)
    rows = torch.full((len(paths), width), eos, dtype=torch.long)
    for i, path in enumerate(paths):
        rows[i, : len(path)] = torch.tensor(list(path), dtype=torch.long)
    mask = torch.ones(len(paths), len(prompt_ids) + width, dtype=torch.long, device=device)
    positions = torch.arange(len(prompt_ids), len(prompt_ids) + width, device=device).expand(len(paths), -1)
    rest = forward(model, input_ids=rows.to(device), attention_mask=mask, position_ids=positions, cache=cache).logits
    logits = torch.cat([first.expand(len(paths), -1, -1), rest], dim=1)  # [paths, width + 1, V]
    logp = torch.log_softmax(logits.float().cpu(), dim=-1)
    model_lp, masked_lp = torch.zeros(len(paths)), torch.zeros(len(paths))
    for i, path in enumerate(paths):
        state = 0
        for step, token in enumerate(list(path) + [eos]):
            allowed = constraint.allowed(state)
            model_lp[i] += logp[i, step, token]
            masked_lp[i] += logp[i, step, token] - torch.logsumexp(logp[i, step, allowed], dim=0)
            state = constraint.next_state(state, token)
    return model_lp.exp(), masked_lp.exp()


def by_string(paths, probabilities: torch.Tensor, decode) -> dict[str, float]:
    """Add up the probabilities of the token sequences that spell the same string
    (``decode`` turns a token list into text), largest first."""
    totals: dict[str, float] = {}
    for path, prob in zip(paths, probabilities.tolist()):
        text = decode(list(path))
        totals[text] = totals.get(text, 0.0) + prob
    return dict(sorted(totals.items(), key=lambda item: -item[1]))
