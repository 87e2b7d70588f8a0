"""Rows for chapter 11: building a constraint's token index, and what the mask costs per step."""

from __future__ import annotations

import statistics
import time
from importlib.metadata import version

import torch

from ..constrained.constraint import Constraint, mask_rows
from ..constrained.json_schema import to_regex
from ..constrained.vocabulary import vocabulary_bytes
from ..decoding.generate import generate
from ..measure.table import Table
from ..measure.timing import median_time
from .prompts import chat

# A typical structured-output request (four required fields, one a short array), and the same
# with length bounds on its strings, which unroll into many more automaton states.
TYPICAL = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}, "city": {"type": "string"},
    "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
    "required": ["name", "age", "city", "hobbies"]}
BOUNDED = {**TYPICAL, "properties": {
    "name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0},
    "city": {"type": "string", "maxLength": 24},
    "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 3}}}
QUESTION = "Describe a fictional person as JSON with name, age, city and hobbies."


def bench_constrained(table: Table, model, tokenizer, repeat: int = 3) -> None:
    constraint = index_rows(table, tokenizer, "a typical JSON schema", to_regex(TYPICAL), repeat)
    index_rows(table, tokenizer, "the same with bounded string lengths", to_regex(BOUNDED), repeat)
    # The mask inside the loop: 48 greedy tokens with and without the constraint, taking turns,
    # each step timed by the loop itself (its step_seconds include the masking). The outputs
    # differ, so the rows compare the time of a step, not of an answer.
    prompt = chat(tokenizer, QUESTION)
    steps = {False: [], True: []}
    for _ in range(repeat):
        for constrained in (False, True):
            out = generate(model, prompt, max_new_tokens=48, temperature=0, eos_token_id=[],
                           constraint=constraint if constrained else None)
            steps[constrained] += out.step_seconds[1:]  # the first step warms up
            if constrained:
                answer = out.new_tokens[0]
    free, bound = statistics.median(steps[False]), statistics.median(steps[True])
    table.add("ll.generate, a greedy decode step (median of the loop's own step times)", free)
    table.add("... the same step under the typical JSON schema's constraint", bound, bound / free,
              "the time of an unconstrained step")
    # Those two differ by the machine's noise as much as by the mask, so the mask's own work is
    # also timed alone: replayed over the constrained answer, step by step as the loop does it.
    mask = replay_seconds(constraint, answer, model.config.vocab_size, repeat)
    table.add(f"the constraint's own work per step, replayed: mask the logits, move the state "
              f"({mask / free:.1%} of a decode step)", mask)


def replay_seconds(constraint: Constraint, tokens: torch.Tensor, vocab: int, repeat: int) -> float:
    """The median time of one step's masking (with the token budget and the check that a token
    is left) and state move, over the states an answer passes through."""
    logits, times = torch.randn(1, vocab), []
    for _ in range(repeat):
        state = 0
        for i, token in enumerate(tokens.tolist()):
            start = time.perf_counter()
            masked = mask_rows([constraint], [state], logits, len(tokens) - i)
            bool(torch.isinf(masked).all(dim=-1).any())
            state = constraint.next_state(state, token)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def index_rows(table: Table, tokenizer, name: str, pattern: str, repeat: int) -> Constraint:
    """The time to build a constraint (pattern to token index), and outlines-core's for the same
    pattern and vocabulary where it is installed. Returns the last constraint built."""
    built = []
    ours = median_time(lambda: built.append(Constraint(pattern, tokenizer)), repeat=repeat, warmup=0)
    constraint = built[-1]
    what = f"constraint index for {name} ({constraint.dfa.num_states} states, {len(constraint.index.tokens):,} pairs)"
    try:
        import outlines_core
    except ImportError:  # an optional oracle: its row is left out where it is not installed
        table.add(what, ours)
        return constraint
    by_bytes = {}
    for token_id, data in enumerate(vocabulary_bytes(tokenizer)):
        if data:
            by_bytes.setdefault(data, []).append(token_id)
    vocab = outlines_core.Vocabulary(tokenizer.eos_token_id, by_bytes)
    theirs = median_time(lambda: outlines_core.Index(pattern, vocab), repeat=repeat, warmup=0)
    table.add(what, ours, theirs / ours, "faster than outlines-core")
    table.add(f"... the same index built by outlines-core {version('outlines-core')}", theirs)
    return constraint
