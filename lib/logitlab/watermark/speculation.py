"""Speculative sampling under a keyed watermark, with no loss of acceptance (chapter 12).

A watermark that changes the target's distribution (the green list) or makes it a point mass
given the key (the Gumbel-max watermark as a processor) lowers how often a draft is accepted:
speculative sampling then verifies drafts against a distribution the drafter does not know.
He et al. (2026) keep the acceptance: leave the target's distribution alone, and take *every*
random choice of speculative sampling from the key instead of from a generator (the mark's
evidence per token is then weaker than the Gumbel-max mark's on the target alone, as chapter 12
measures). Here:

* the drafter draws each proposal by the Gumbel-max rule from its own distribution ``q`` with
  the uniforms of key ``key`` at that context (``KeyedDraftModel``);
* the acceptance test ``u < p(d) / q(d)`` takes ``u`` from key ``key + 2`` at that context;
* a rejected position draws from the residual ``max(0, p - q)`` by the Gumbel-max rule with the
  uniforms of key ``key + 1``; the bonus token after a fully accepted chain, and the first token,
  from ``p`` with those of key ``key``.

At a context that already occurred in the text (``gumbel.seen_before``), each of these choices is
made with the loop's generator instead, as in plain speculative sampling: that context's uniforms
may already have chosen a token of the text, and reused they would repeat it. The drafter and the
rule ask the same question of the same text, so they always agree on which positions are keyed.

For a key drawn at random the keyed draws use independent uniforms, each context's at most once,
so this is ordinary speculative sampling: the output follows the target exactly and is accepted
as often.
For a fixed key, every token is a function of the key and the text before it, which is what makes
a watermark strong: each token was chosen, by key ``key`` or ``key + 1``, for a large uniform, and
``gumbel.detect(..., streams=2)`` scores it.
"""

from __future__ import annotations

import torch

from .._validate import check_int
from ..sampling.pipeline import target_probs
from ..speculative.acceptance import AcceptanceRule
from ..speculative.draft_model import DraftModelDrafter
from .green_list import KEY, check_key
from .gumbel import keyed_draw, keyed_uniforms, last_tokens, seen_before

DRAFT, RESIDUAL, ACCEPT = 0, 1, 2  # the key offsets of the three streams


def row_context(text: torch.Tensor, row: int, extra=(), width: int = 4) -> list[int]:
    """Row ``row`` of a loop's ``text`` followed by ``extra``, its last ``width`` tokens: the
    context a keyed draw at that position hashes (as ``GumbelWatermark`` would there)."""
    return last_tokens(text[row].tolist() + [int(t) for t in extra], width)


def keyed_here(text: torch.Tensor, row: int, extra=(), width: int = 4) -> bool:
    """Whether a draw after row ``row`` of ``text`` and ``extra`` is keyed: its context has not
    occurred in that text before (``gumbel.seen_before``)."""
    return not seen_before(text[row].tolist() + [int(t) for t in extra], width)


def generator_draw(p: torch.Tensor, generator) -> int:
    """One token from ``p`` ``[V]`` (unnormalised is fine) with the loop's generator."""
    return int(torch.multinomial(p.float(), 1, generator=generator))


def check_temperature(config) -> None:
    if config.temperature == 0:
        raise ValueError("temperature: keyed speculative sampling draws from the key, which needs temperature > 0 "
                         "(at temperature 0 every token is the argmax and carries no watermark)")


class KeyedDraftModel(DraftModelDrafter):
    """A draft model (``DraftModelDrafter``) whose proposals are Gumbel-max draws from its
    processed distribution ``q`` with the uniforms of ``key`` at each context, not a generator's
    (the generator's draw at a context seen before); ``q`` is reported as it is, since over keys
    each proposal is distributed as ``q``."""

    def __init__(self, model, key: int = KEY, context_width: int = 4):
        super().__init__(model)
        self.key, self.context_width = check_key(key), check_int(context_width, "context_width", 1)
        self.reads_text = True

    def sample(self, logits, config, generator, drafted):
        check_temperature(config)
        q, tokens = target_probs(logits, config), []
        for b in range(len(q)):
            extra = [t[b] for t in drafted]
            if keyed_here(self.text, b, extra, self.context_width):
                uniforms = keyed_uniforms(row_context(self.text, b, extra, self.context_width), self.vocab_size,
                                          self.key + DRAFT)
                tokens.append(keyed_draw(q[b], uniforms))
            else:
                tokens.append(generator_draw(q[b], generator))
        return torch.tensor(tokens, device=logits.device), q


class KeyedRejectionSampling(AcceptanceRule):
    """Speculative sampling's acceptance rule with every uniform taken from the key (module
    docstring). Exact for a random key; use it with ``KeyedDraftModel`` of the same ``key`` and
    ``context_width``. Chains only, temperature > 0."""

    reads_text = True

    def __init__(self, vocab_size: int, key: int = KEY, context_width: int = 4):
        self.vocab_size = check_int(vocab_size, "vocab_size", 2)
        self.key, self.context_width = check_key(key), check_int(context_width, "context_width", 1)

    def uniforms(self, row: int, extra, stream: int, size: int | None = None) -> torch.Tensor:
        """Stream ``stream``'s uniforms after row ``row``'s text and ``extra``: ``size`` of them
        (the vocabulary's by default; the acceptance test reads one)."""
        return keyed_uniforms(row_context(self.text, row, extra, self.context_width), size or self.vocab_size,
                              self.key + stream)

    def draw(self, p: torch.Tensor, row: int, extra, stream: int, generator) -> int:
        """A token from ``p`` after row ``row``'s text and ``extra``: keyed by stream ``stream``
        where that context is new to the text, with the generator where it is not."""
        if keyed_here(self.text, row, extra, self.context_width):
            return keyed_draw(p, self.uniforms(row, extra, stream))
        return generator_draw(p, generator)

    def first_token(self, logits, config, generator=None):
        check_temperature(config)
        p = target_probs(logits, config)
        return torch.tensor([self.draw(p[b], b, (), DRAFT, generator) for b in range(len(p))], device=logits.device)

    def __call__(self, draft_tokens, q, p, target_logits, config, generator):
        check_temperature(config)
        num, nxt = [], []
        for b, drafts in enumerate(draft_tokens.tolist()):
            kept = 0
            for i, d in enumerate(drafts):
                if keyed_here(self.text, b, drafts[:i], self.context_width):
                    u = float(self.uniforms(b, drafts[:i], ACCEPT, size=1))
                else:
                    u = float(torch.rand(1, generator=generator, device=p.device))
                if not u * float(q[b, i, d]) < float(p[b, i, d]):  # accept with probability min(1, p/q)
                    break
                kept += 1
            if kept < len(drafts):  # the residual max(0, p - q); all of p where rounding left none
                residual = (p[b, kept] - q[b, kept]).clamp_min(0)
                residual = residual if float(residual.sum()) > 0 else p[b, kept]
                token = self.draw(residual, b, drafts[:kept], RESIDUAL, generator)
            else:
                token = self.draw(p[b, kept], b, drafts, DRAFT, generator)
            num.append(kept)
            nxt.append(token)
        device = draft_tokens.device
        return torch.tensor(num, device=device), torch.tensor(nxt, device=device)
