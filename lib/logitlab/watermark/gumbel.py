"""The Gumbel-max watermark (Aaronson 2022): a sample whose randomness is the key's.

Chapter 1's Gumbel-max trick draws a token from ``p`` as ``argmax_i log(u_i) / p_i`` for
independent uniforms ``u_i`` (the same as ``argmax_i (log p_i + g_i)`` with Gumbel noise ``g_i =
-log(-log u_i)``). Here the uniforms are not fresh: a keyed hash of the last ``context_width``
tokens fixes them. For a key drawn at random they are independent uniforms, so the token is an
exact sample of ``p``; but whoever holds the key can recompute them, and the chosen tokens
are the ones whose ``u`` was large: for text written without the key, ``-log(1 - u)`` of each
token is an exponential variable of mean 1; for marked text, larger.

A context that comes back would give the same uniforms, so the same token: the text would no
longer follow the model (a loop, once entered, would never be left). So at a context that already
occurred in the text, the keyed schemes step aside (``seen_before``) and the sampler after them
draws with its own generator, as production engines do (Hugging Face's SynthID processor, vLLM's
``deduplicate_contexts``); every context's uniforms then choose at most one token of a text, and
the detector scores each context's first occurrence only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._validate import check_int, check_logits, check_number
from ..sampling.hf_processor import Processor
from .green_list import KEY, check_key


def context_seed(context, key: int) -> int:
    """An integer seed from the key and the context's token ids (a polynomial hash modulo the
    Mersenne prime 2**61 - 1): the same on every machine and every run."""
    seed = key % (2**61 - 1)
    for token in context:
        seed = (seed * 1_000_003 + int(token) + 1) % (2**61 - 1)
    return seed


def last_tokens(ids, width: int) -> list[int]:
    """The last ``width`` token ids of ``ids`` (a list or a 1-d tensor), padding (-1, as the
    book's loops hand their processors) left out: a keyed draw's context, the same for a row
    whatever the padding of the batch it is in."""
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
    return [int(t) for t in ids if t >= 0][-width:]


def contexts(text, width: int) -> list[tuple[int, ...]]:
    """The context of every position of ``text`` and of the one after it: the (up to) ``width``
    tokens before each, ``len(text) + 1`` tuples."""
    return [tuple(text[max(0, i - width):i]) for i in range(len(text) + 1)]


def seen_before(ids, width: int) -> bool:
    """Whether the context a keyed draw after ``ids`` hashes (its last ``width`` tokens, padding
    left out) is already the context of an earlier position of ``ids``: its uniforms may then have
    chosen a token of this text, and a second draw from them would not be a fresh sample."""
    *earlier, now = contexts(last_tokens(ids, len(ids)), width)  # last_tokens drops the padding
    return now in earlier


def keyed_uniforms(context, vocab_size: int, key: int = KEY) -> torch.Tensor:
    """``[vocab_size]`` uniforms in (0, 1), float32 on the CPU, fixed by the key and the context."""
    generator = torch.Generator(device="cpu").manual_seed(context_seed(context, key))
    return torch.rand(vocab_size, generator=generator).clamp_(min=1e-12, max=1 - 1e-7)


def keyed_choice(logits: torch.Tensor, uniforms: torch.Tensor, temperature: float = 1.0) -> int:
    """The token ``argmax_i log(u_i) / p_i`` for ``p = softmax(logits / temperature)``: the
    Gumbel-max draw with the given uniforms."""
    return keyed_draw(torch.softmax(logits.float() / temperature, dim=-1), uniforms)


def keyed_draw(p: torch.Tensor, uniforms: torch.Tensor) -> int:
    """The token ``argmax_i log(u_i) / p_i`` of a distribution ``p`` ``[V]`` (unnormalised is
    fine: scaling p scales every score alike); tokens of probability 0 never win."""
    p = p.float()
    score = torch.where(p > 0, uniforms.to(p.device).log() / p, float("-inf"))
    return int(score.argmax())


class GumbelWatermark(Processor):
    """The watermark as a logits processor: each row's token is chosen by ``keyed_choice`` from
    its last ``context_width`` tokens, and every other token's logit set to ``-inf``, so that any
    sampler after it (``ll.generate`` at any temperature) returns that token. The temperature of
    the distribution it samples is this processor's ``temperature``. Where that context already
    occurred in the row (``seen_before``), the row's scores are returned at that temperature, for
    the sampler after it to draw (at temperature 1: from the same distribution)."""

    def __init__(self, vocab_size: int, key: int = KEY, temperature: float = 1.0, context_width: int = 4):
        self.vocab_size = check_int(vocab_size, "vocab_size", 2)
        self.key = check_key(key)
        self.temperature = check_number(temperature, "temperature", "a finite number > 0",
                                        lambda v: 0 < v < math.inf)
        self.context_width = check_int(context_width, "context_width", 1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        if scores.shape[-1] != self.vocab_size:
            raise ValueError(f"scores must have vocab_size = {self.vocab_size} columns, got {scores.shape[-1]}")
        out = torch.full_like(scores, float("-inf"))
        for row, (ids, logits) in enumerate(zip(input_ids.tolist(), scores)):
            if seen_before(ids, self.context_width):
                out[row] = logits / self.temperature
                continue
            u = keyed_uniforms(last_tokens(ids, self.context_width), self.vocab_size, self.key).to(scores.device)
            out[row, keyed_choice(logits, u, self.temperature)] = 0.0
        return out


@dataclass
class GumbelDetection:
    """``scored`` (context, token) pairs, their ``score`` (the sum of ``-log(1 - u)``), and the
    p-value: the chance that text written without the key scores at least as high (the sum of
    ``scored`` exponential variables is Gamma(scored, 1))."""

    scored: int
    score: float
    p_value: float


def scored_pairs(tokens, vocab_size: int, context_width: int, prompt=()) -> list[tuple[tuple[int, ...], int]]:
    """The (context, token) pairs a keyed detector scores: each token of ``tokens`` with the
    ``context_width`` tokens before it (``prompt`` first), where that context occurs for the first
    time in the text (the prompt included): the keyed schemes draw with a generator at a context
    seen before (``seen_before``), so a later occurrence carries no evidence."""
    tokens = [int(t) for t in (tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens)]
    text = [int(t) for t in (prompt.tolist() if isinstance(prompt, torch.Tensor) else prompt)] + tokens
    context_width = check_int(context_width, "context_width", 1)
    if not tokens or not all(0 <= t < vocab_size for t in text):
        raise ValueError(f"tokens must be at least 1 token id in [0, {vocab_size}) (and prompt's too), "
                         f"got {tokens[:8]!r}")
    start, seen, pairs = len(text) - len(tokens), set(), []
    for i, (context, token) in enumerate(zip(contexts(text, context_width), text)):
        if context not in seen and i >= start:
            pairs.append((context, token))
        seen.add(context)
    return pairs


def detect(tokens, vocab_size: int, key: int = KEY, context_width: int = 4, prompt=(), streams: int = 1
           ) -> GumbelDetection:
    """Score ``tokens`` (the generated ones; ``prompt``: the tokens before them, whose last
    ``context_width`` seed the first uniforms) for the Gumbel watermark.

    ``streams``: how many keyed streams may have chosen a token (keys ``key``, ``key + 1``, ...;
    the keyed speculative sampling of ``watermark.speculation`` uses two). Each token then scores
    its largest uniform ``m`` over the streams: for text written without the key, ``m ** streams``
    is uniform, so ``-log(1 - m ** streams)`` is again exponential of mean 1."""
    from scipy.special import gammaincc

    vocab_size, key = check_int(vocab_size, "vocab_size", 2), check_key(key)
    streams = check_int(streams, "streams", 1)
    pairs = scored_pairs(tokens, vocab_size, context_width, prompt)
    score = 0.0
    for context, token in pairs:
        largest = max(float(keyed_uniforms(context, vocab_size, key + s)[token]) for s in range(streams))
        score -= math.log1p(-largest ** streams)
    return GumbelDetection(len(pairs), score, float(gammaincc(len(pairs), score)))
