"""What every loop returns: ``GenerationResult`` (tokens, texts, timings, and optionally each
token's log-probability, ``token_logprobs``), with ``decode_texts`` for the texts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)`` at ``tokens``: logits ``[..., V]`` and tokens ``[...]`` give ``[...]``."""
    # torch's own: the loops call this every step on logits that were checked already.
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[..., None]).squeeze(-1)


@dataclass(kw_only=True)
class GenerationResult:
    """What every decoding loop returns. Row ``r`` continues prompt ``prompt_index[r]``.

    Speculative loops (``logitlab.speculative.result.SpeculativeResult``) add their acceptance statistics.
    """

    sequences: list[torch.Tensor]  # prompt (without padding) followed by the new tokens
    new_tokens: list[torch.Tensor]
    logprobs: list[torch.Tensor]  # each new token's log-probability under the sampled distribution
    raw_logprobs: list[torch.Tensor]  # ... and under the model's own distribution (T = 1, no rules)
    finish_reasons: list[str]  # "eos", "stop" or "length"
    texts: list[str] | None = None  # decoded new text, cut before a stop string (needs a tokenizer)
    prompt_index: list[int]
    model_calls: int = 0  # forward passes of the model, the prefill included
    seconds: float = 0.0  # the whole call
    prefill_seconds: float = 0.0
    step_seconds: list[float] = field(default_factory=list)  # each decode step (or each speculative call)

    @property
    def decode_seconds_per_token(self) -> float:
        """Mean time of one step of the loop: for ``ll.generate`` one token (a choice and one
        forward pass); for the speculative loops, whose steps are calls, one call."""
        return sum(self.step_seconds) / max(1, len(self.step_seconds))


def decode_texts(tokenizer, new_tokens) -> list[str] | None:
    """Each row's new tokens as text (None without a tokenizer)."""
    if tokenizer is None:
        return None
    return [tokenizer.decode(t.tolist(), skip_special_tokens=True) for t in new_tokens]
