"""Constrained decoding: from a byte automaton to one token mask per step.

Chapter 11 ("When the output must match a pattern") explains this module.

``regex`` turns a pattern into a deterministic automaton over bytes. A model emits *tokens*,
each a string of bytes, so ``index`` walks every token from every state of the automaton once:
the tokens that keep the output completable from a state are the ones whose walk ends in a live
state, and that state is where the token leads. Decoding is then a lookup per step: mask every
other token, choose, move on.

``Constraint`` is the object the book's loops take (``ll.generate(..., constraint=)``, beam
search, the speculative loop) and also a Hugging Face ``LogitsProcessor``.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from .index import build_index
from .regex import compile_regex
from .vocabulary import vocabulary_bytes


class Constraint(LogitsProcessor):
    """The outputs a pattern allows, compiled once for one vocabulary.

    ``Constraint(pattern, tokenizer)`` takes a regular expression (see ``regex``) and
    a byte-level BPE tokenizer; ``vocab=`` (the bytes of every token, ``None`` for tokens that
    are not text) replaces the tokenizer, as for the book's toy vocabularies. The end-of-sequence
    tokens (``eos_token_id``: an id or a list; default the tokenizer's) are allowed only where
    the output so far matches the whole pattern.

    A state is an ``int``, 0 at the start. The book's loops hold one state per row and call
    ``mask`` and ``advance``; called as ``(input_ids, scores)`` it is a Hugging Face
    ``LogitsProcessor`` that reads the state off the tokens after the prompt (the prompt is what
    the first call sees: use a new ``Constraint``, or ``reset()``, for each ``generate``).
    """

    def __init__(self, pattern: str, tokenizer=None, *, vocab=None, eos_token_id=None):
        if (tokenizer is None) == (vocab is None):
            raise ValueError("pass either tokenizer= or vocab= (the bytes of every token), not both")
        vocab = vocabulary_bytes(tokenizer) if vocab is None else list(vocab)
        if eos_token_id is None:
            eos_token_id = getattr(tokenizer, "eos_token_id", None)
        if eos_token_id is None:
            raise ValueError("eos_token_id is needed: an id or a list of ids of the end-of-sequence tokens")
        self.eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        if any(not 0 <= e < len(vocab) or vocab[e] for e in self.eos):
            raise ValueError(f"eos_token_id must be ids of tokens without text, got {eos_token_id}")
        self.pattern, self.vocab_size = pattern, len(vocab)
        self.dfa = compile_regex(pattern)
        self.index = build_index(self.dfa, vocab)
        if self.fewest_tokens >= torch.iinfo(torch.long).max // 2:
            raise ValueError(f"pattern {pattern!r}: no sequence of this vocabulary's tokens matches it")
        self.reset()

    def __repr__(self) -> str:
        return f"Constraint({self.pattern!r}, states={self.dfa.num_states})"

    @property
    def fewest_tokens(self) -> int:
        """The fewest tokens of any output that matches (EOS not counted)."""
        return int(self.index.remaining[0])

    def check_budget(self, max_new_tokens: int) -> None:
        if self.fewest_tokens > max_new_tokens:
            raise ValueError(f"max_new_tokens={max_new_tokens} is too few: every output that matches "
                             f"{self.pattern!r} takes at least {self.fewest_tokens} tokens")

    def allowed(self, state: int, tokens_left: int | None = None) -> torch.Tensor:
        """The token ids allowed in ``state`` (EOS included where the output is complete);
        with ``tokens_left`` (this one included), only those after which a match still fits."""
        if state < 0:  # off the pattern (only a Hugging Face loop gets there): end it
            return torch.tensor(self.eos)
        span = slice(int(self.index.offsets[state]), int(self.index.offsets[state + 1]))
        tokens = self.index.tokens[span]
        if tokens_left is not None:
            tokens = tokens[self.index.remaining[self.index.targets[span]] < tokens_left]
        if self.index.accepting[state]:
            tokens = torch.cat([tokens, torch.tensor(self.eos)])
        return tokens

    def next_state(self, state: int, token: int) -> int:
        """The state after ``token``; EOS keeps the state; -1 if ``token`` is not allowed."""
        if token in self.eos or state < 0:
            return state
        span = slice(int(self.index.offsets[state]), int(self.index.offsets[state + 1]))
        where = int(torch.searchsorted(self.index.tokens[span], token))
        if where < span.stop - span.start and int(self.index.tokens[span][where]) == token:
            return int(self.index.targets[span][where])
        return -1

    def is_complete(self, state: int) -> bool:
        return state >= 0 and bool(self.index.accepting[state])

    def reset(self) -> None:
        """Forget the prompt length and the states a Hugging Face loop has seen."""
        self.prompt_length, self.seen = None, {(): 0}

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.prompt_length is None:
            self.prompt_length = input_ids.shape[1]
        states = [self.state_of(tuple(row[self.prompt_length:].tolist())) for row in input_ids]
        return mask_rows([self] * len(states), states, scores)

    def state_of(self, generated: tuple) -> int:
        """The state after the tokens ``generated``, remembered for the next step's call. A loop
        (not recursion) from the longest prefix already seen: outputs can be thousands of tokens."""
        known = len(generated)
        while generated[:known] not in self.seen:
            known -= 1
        for end in range(known + 1, len(generated) + 1):
            self.seen[generated[:end]] = self.next_state(self.seen[generated[:end - 1]], generated[end - 1])
        return self.seen[generated]


def mask_rows(constraints, states, logits: torch.Tensor, tokens_left=None) -> torch.Tensor:
    """``logits`` ``[rows, vocab]`` with -inf wherever row i's constraint forbids the token in
    ``states[i]`` (a row whose constraint is None keeps its logits). ``tokens_left`` is one
    number for every row, or a list with one per row."""
    keep = torch.ones_like(logits, dtype=torch.bool)
    if not isinstance(tokens_left, (list, tuple)):
        tokens_left = [tokens_left] * len(states)
    for row, (constraint, state, left) in enumerate(zip(constraints, states, tokens_left)):
        if constraint is None:
            continue
        if constraint.vocab_size > logits.shape[-1]:
            raise ValueError(f"the constraint has {constraint.vocab_size} tokens, the logits {logits.shape[-1]}")
        keep[row] = False
        keep[row, constraint.allowed(state, left).to(logits.device)] = True
    return logits.masked_fill(~keep, float("-inf"))


def advance_rows(constraints, states, tokens: torch.Tensor) -> list[int]:
    """Each row's state after its chosen token; ``ValueError`` if a token was not allowed."""
    moved = []
    for constraint, state, token in zip(constraints, states, tokens.tolist()):
        if constraint is None:
            moved.append(state)
            continue
        moved.append(constraint.next_state(state, token))
        if moved[-1] < 0:
            raise ValueError(f"token {token} is not allowed in state {state} of {constraint!r}")
    return moved


def constraint_rows(constraint, prompts: int, copies: int, max_new_tokens: int) -> list | None:
    """The ``constraint=`` argument of the book's loops as one entry per row: one
    ``Constraint`` for every prompt, or a list with one (or None) per prompt, each repeated for
    the ``copies`` samples of its prompt."""
    if constraint is None:
        return None
    if isinstance(constraint, Constraint):
        constraint = [constraint] * prompts
    if not isinstance(constraint, (list, tuple)) or len(constraint) != prompts or \
            not all(c is None or isinstance(c, Constraint) for c in constraint):
        raise ValueError(f"constraint must be a Constraint or a list of {prompts} (one per prompt, None for none)")
    for c in constraint:
        if c is not None:
            c.check_budget(max_new_tokens)
    return [c for c in constraint for _ in range(copies)]


def state_after(constraint, state: int, token: int, tokens_left: int) -> int:
    """The state after ``token`` where ``constraint`` allows it with ``tokens_left`` tokens to go
    (this one included), as ``allowed`` says; -1 (off the pattern, where only EOS is allowed)
    where it does not, the budget included, so the next position always keeps a token. A row
    without a constraint (None) keeps its state."""
    if constraint is None:
        return state
    if token in constraint.eos:
        return state if constraint.is_complete(state) else -1
    moved = constraint.next_state(state, token)
    return moved if moved >= 0 and int(constraint.index.remaining[moved]) < tokens_left else -1


class DraftStates:
    """The automaton state of each row along the drafts of speculative decoding, ahead of what
    the row has kept: the drafter proposes them and the target scores them position by position. ``mask`` the logits of the next position, ``advance`` by the tokens placed
    there. A token the constraint forbids (a drafter that ignores it) sends its row off the
    pattern (-1), where only EOS is allowed: the target then rejects that draft. ``tree`` gives
    the state of every node of a tree of drafts, each after the path that leads to it."""

    def __init__(self, constraints, states, tokens_left):
        self.constraints, self.states, self.tokens_left = list(constraints), list(states), list(tokens_left)

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        return mask_rows(self.constraints, self.states, logits, self.tokens_left)

    def copy(self) -> "DraftStates":
        return DraftStates(self.constraints, self.states, self.tokens_left)

    def advance(self, tokens: torch.Tensor) -> None:
        self.states = [state_after(c, s, t, left)
                       for c, s, t, left in zip(self.constraints, self.states, tokens.tolist(), self.tokens_left)]
        self.tokens_left = [left - 1 for left in self.tokens_left]

    def tree(self, tokens: torch.Tensor, parents: list[list[int]]) -> "DraftStates":
        """Every node of each row's tree as a row of its own (``B * n`` rows, row b's nodes in
        order), in the state after the tokens on the path from the root to it. ``tokens`` ``[B, n]``
        and ``parents`` one list per row, in ``logitlab.speculative.tree_verify``'s form: node 0 is the
        root, the token these states already stand after."""
        constraints, states, tokens_left = [], [], []
        for c, state, left, row, ids in zip(self.constraints, self.states, self.tokens_left, parents, tokens.tolist()):
            node_states, node_left = [state], [left]
            for parent, token in zip(row[1:], ids[1:]):
                node_states.append(state_after(c, node_states[parent], token, node_left[parent]))
                node_left.append(node_left[parent] - 1)
            constraints += [c] * len(row)
            states += node_states
            tokens_left += node_left
        return DraftStates(constraints, states, tokens_left)
