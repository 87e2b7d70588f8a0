"""What the speculative loops return (``SpeculativeResult``), and the output rows they fill as
they go (``Outputs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..decoding.result import GenerationResult, decode_texts, token_logprobs
from .theory import pooled_alpha


@dataclass(kw_only=True)
class SpeculativeResult(GenerationResult):
    """What the speculative loops return: a ``GenerationResult`` (``model_calls`` counts the
    target's passes, the prefill included; ``step_seconds`` holds each call) and the acceptance
    statistics. ``logprobs`` are under the target's processed distribution ``p``."""

    drafter_steps: int = 0  # the drafter's steps (Drafter.steps), its prompt counted as one
    # Per call, per active row: drafts accepted, and drafts examined (see call_counts: only those
    # the output keeps, none after its EOS).
    accepted: list[list[int]] = field(default_factory=list)
    examined: list[list[int]] = field(default_factory=list)
    drafted: list[int] = field(default_factory=list)  # per call: drafts proposed per row (g; a tree's depth)
    fed: list[int] = field(default_factory=list)  # per call: tokens the target's pass took per row (g + 1; n + 1)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

    @property
    def tokens_per_call(self) -> float:
        """New tokens per target call, the prefill counted as a call that yields one token."""
        rows = len(self.new_tokens)
        return sum(len(t) for t in self.new_tokens) / rows / max(1, self.calls_per_row)

    @property
    def calls_per_row(self) -> float:
        """Target calls each row took part in, on average (rows that finish early leave the batch)."""
        return (len(self.new_tokens) + sum(len(a) for a in self.accepted)) / len(self.new_tokens)

    @property
    def alpha(self) -> float:
        """The measured acceptance rate: drafts accepted / drafts examined. A call examines its
        drafts up to the first rejection (all of them if none is rejected)."""
        return pooled_alpha([self])

    @property
    def draft_step_seconds(self) -> float:
        """Mean wall time of one forward pass of the draft model while proposing (0 without one).
        Divided by the time of a plain decode step of the target, this is the cost ratio ``c``."""
        steps = self.drafter_steps - 1  # the drafter's prefill of the prompt is not a draft step
        return self.draft_seconds / steps if steps > 0 else 0.0

    @property
    def verify_call_seconds(self) -> float:
        """Mean wall time of one verification call (the target's pass over the pending token and
        the drafts, and the acceptance rule). Divided by a decode step's time, this is ``v``."""
        calls = self.model_calls - 1  # the prefill is not a verification
        return self.verify_seconds / calls if calls > 0 else 0.0

    def acceptance_counts(self, positions: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """For each draft position i, how many times verification kept it and how many times it
        reached it (all drafts before it kept); counts, so that several runs can be pooled.
        ``positions`` fixes the length (default: the most drafts of any call)."""
        g = max(self.drafted, default=0) if positions is None else positions
        reached, kept = torch.zeros(g, device="cpu"), torch.zeros(g, device="cpu")  # counts: host-side statistics
        for nums, gi in zip(self.accepted, self.drafted):
            for n in nums:
                reached[: min(n + 1, gi)] += 1
                kept[:n] += 1
        return kept, reached

    def acceptance_by_position(self) -> torch.Tensor:
        """For each draft position i, the share of calls that reached it and accepted it."""
        kept, reached = self.acceptance_counts()
        return kept / reached.clamp_min(1)


@dataclass
class CallLog:
    """What a speculative loop records of its calls, for its ``SpeculativeResult``: kept apart from
    the algorithm, which only hands each call's counts and clock readings to ``record``."""

    model_calls: int = 1  # the prefill
    prefill_seconds: float = 0.0
    accepted: list = field(default_factory=list)
    examined: list = field(default_factory=list)
    drafted: list = field(default_factory=list)
    fed: list = field(default_factory=list)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    step_seconds: list = field(default_factory=list)

    def record(self, counts: list[tuple[int, int]], drafted: int, start: float, drafted_at: float, end: float,
               fed: int | None = None):
        """One call: each row's ``(accepted, examined)`` (``theory.call_counts``), the drafts it
        proposed per row, and the clock when it began, when the drafts were ready and when it ended;
        ``fed``: the tokens its target pass took per row (default ``drafted + 1``, a chain's)."""
        self.model_calls += 1
        self.accepted.append([a for a, _ in counts])
        self.examined.append([e for _, e in counts])
        self.drafted.append(drafted)
        self.fed.append(drafted + 1 if fed is None else fed)
        self.draft_seconds += drafted_at - start
        self.verify_seconds += end - drafted_at
        self.step_seconds.append(end - start)


class Outputs:
    """The new tokens of each row of a speculative loop and their log-probabilities, cut at the
    first end-of-sequence token or at ``max_new_tokens``. Shared by every speculative loop."""

    def __init__(self, rows: int, eos: list[int], max_new_tokens: int):
        self.tokens, self.raw, self.sampled = ([[] for _ in range(rows)] for _ in range(3))
        self.reasons = ["length"] * rows
        self.eos, self.max_new_tokens = set(eos), max_new_tokens

    def add(self, rows: list[int], tokens, logits, p, counts: list[int]) -> None:
        """Row ``rows[i]`` gets ``tokens[i, :counts[i]]``; ``logits`` ``[B, m, V]`` are the target's
        raw logits there and ``p`` its processed probabilities (None at T = 0: log-prob 0)."""
        raw = token_logprobs(logits, tokens)
        sampled = torch.zeros_like(raw) if p is None else torch.log(p.gather(-1, tokens[..., None]).squeeze(-1))
        # One read from the device for all three (a token id is exact in float32 up to 2**24).
        dtype = torch.promote_types(raw.dtype, sampled.dtype)
        ids, raw, sampled = torch.stack([tokens.to(dtype), raw.to(dtype), sampled.to(dtype)]).tolist()
        for r, row_ids, lr, ls, c in zip(rows, ids, raw, sampled, counts):
            self.tokens[r] += [int(t) for t in row_ids[:c]]
            self.raw[r] += lr[:c]
            self.sampled[r] += ls[:c]

    def kept_since(self, rows: list[int], before: list[int]) -> list[int]:
        """How many of the tokens each of ``rows`` got since it held ``before`` tokens survive
        the cut at its first EOS and at ``max_new_tokens``: drafts after the cut are not output,
        so an acceptance rate must not count them."""
        kept = []
        for r, b in zip(rows, before):
            new = self.tokens[r][b:]
            stop = next((i + 1 for i, t in enumerate(new) if t in self.eos), len(new))
            kept.append(max(0, min(stop, self.max_new_tokens - b)))
        return kept

    def finished(self, rows: list[int]) -> list[bool]:
        """Cut each of ``rows`` at its first EOS or at max_new_tokens; which of them are done."""
        done = []
        for r in rows:
            row = self.tokens[r]
            cut = next((i + 1 for i, t in enumerate(row) if t in self.eos), None)
            if cut is not None and cut <= self.max_new_tokens:
                self.reasons[r] = "eos"
            cut = min(cut or len(row), self.max_new_tokens)
            for values in (row, self.raw[r], self.sampled[r]):
                del values[cut:]
            done.append(self.reasons[r] == "eos" or len(row) >= self.max_new_tokens)
        return done

    def result(self, prompts, prompt_index, tokenizer, device, log: CallLog, **stats) -> SpeculativeResult:
        new = [torch.tensor(t, dtype=torch.long, device=device) for t in self.tokens]
        return SpeculativeResult(
            sequences=[torch.cat([p, t]) for p, t in zip(prompts, new)], new_tokens=new,
            logprobs=[torch.tensor(v, device=device) for v in self.sampled],
            raw_logprobs=[torch.tensor(v, device=device) for v in self.raw],
            finish_reasons=self.reasons, texts=decode_texts(tokenizer, new), prompt_index=prompt_index,
            **vars(log), **stats)
