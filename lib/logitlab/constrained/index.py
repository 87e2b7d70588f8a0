"""The token index: every token walked from every state of a byte automaton, once (chapter 11).

A model emits tokens, each a string of bytes. ``build_index`` walks every token from every state
of the automaton in one vectorised pass (tokens whose bytes the automaton cannot tell apart are
walked once for all); ``fewest_tokens`` then counts how many tokens each state still needs to
reach an accepting one. ``constraint.Constraint`` is built on the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .regex import ByteDFA


@dataclass
class TokenIndex:
    """For every state of the automaton, the tokens allowed there (sorted) and where each leads:
    those of state ``s`` are ``tokens[offsets[s]:offsets[s + 1]]`` and ``targets[...]`` (the
    compressed-sparse-row layout). ``remaining[s]`` is the fewest tokens that complete a match
    from ``s`` (0 in an accepting state)."""
    offsets: torch.Tensor    # [states + 1] long
    tokens: torch.Tensor     # [pairs] long
    targets: torch.Tensor    # [pairs] long
    accepting: torch.Tensor  # [states] bool
    remaining: torch.Tensor  # [states] long


def byte_classes(dfa: ByteDFA) -> tuple[torch.Tensor, torch.Tensor]:
    """Bytes that every state treats alike form one class (for a date, the ten digits are one):
    ``(the class of each byte [256], the move table per class [states, classes])``."""
    moves, byte_class = torch.unique(dfa.table.T, dim=0, return_inverse=True)
    return byte_class, moves.T.contiguous()


def token_shapes(vocab: list[bytes | None], byte_class: torch.Tensor):
    """Each token as its sequence of byte classes. Tokens with the same sequence walk alike, so
    only the distinct sequences (the *shapes*, often far fewer than the tokens) are walked.
    Returns ``(shapes [distinct, longest], lengths, shape of each token [vocab])``, longest
    shapes first."""
    lengths = torch.tensor([len(data) if data else 0 for data in vocab])
    padded = torch.full((len(vocab), max(int(lengths.max()), 1)), -1, dtype=torch.long)
    flat = torch.frombuffer(bytearray(b"".join(data for data in vocab if data)), dtype=torch.uint8).long()
    padded[torch.arange(padded.shape[1]) < lengths[:, None]] = byte_class[flat]
    shapes, shape_of = torch.unique(padded, dim=0, return_inverse=True)
    shape_lengths = (shapes >= 0).sum(dim=1)
    order = shape_lengths.argsort(descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))
    return shapes[order], shape_lengths[order], rank[shape_of]


def shape_trie(shapes: torch.Tensor, lengths: torch.Tensor, classes: int) -> list:
    """The shapes as a trie: many tokens share their first bytes (BPE builds long tokens from
    shorter ones), so walking each distinct *prefix* once does far less work than walking every
    token to its end. One entry per depth: ``(parent, byte class, ending)``, the prefixes of that
    many bytes as their parent's index in the level above (level 0's parent is the root, 0) and
    their last byte's class, and ``ending = (first, last, nodes)``: shapes ``first..last - 1``
    (longest first, so those that end here are consecutive) end at these prefixes."""
    levels, node = [], torch.zeros(len(shapes), dtype=torch.long)
    for depth in range(shapes.shape[1]):
        count = int((lengths > depth).sum())
        prefixes, node = torch.unique(node[:count] * classes + shapes[:count, depth], return_inverse=True)
        first = int((lengths > depth + 1).sum())
        levels.append((prefixes // classes, prefixes % classes, (first, count, node[first:count])))
    return levels


def token_walks(moves: torch.Tensor, trie: list, lengths: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """Where each shape ends when read from each state of ``states`` (``moves``: the move table
    per byte class; ``trie``: ``shape_trie``'s levels): ``[len(states), shapes]``, -1 where the
    walk leaves the live states."""
    dead, classes = moves.shape  # -1 becomes a state of its own (number ``dead``) that stays dead
    table = torch.cat([moves.long(), torch.full((1, classes), -1)])
    table = table.masked_fill(table < 0, dead).flatten()
    here, ends = states[:, None], torch.full((len(states), len(lengths)), dead)
    for parent, byte_class, (first, last, nodes) in trie:
        here = table[here[:, parent] * classes + byte_class]  # the state after every prefix this long
        ends[:, first:last] = here[:, nodes]
    return ends.masked_fill(ends == dead, -1)  # an empty token (length 0) stays dead: never allowed


def build_index(dfa: ByteDFA, vocab: list[bytes | None], chunk: int = 64) -> TokenIndex:
    """Walk every (state, token shape) pair once (``chunk`` states at a time, to bound memory),
    then read each token's result off its shape."""
    byte_class, moves = byte_classes(dfa)
    shapes, lengths, shape_of = token_shapes(vocab, byte_class)
    trie = shape_trie(shapes, lengths, moves.shape[1])
    rows, tokens, targets = [], [], []
    for first in range(0, dfa.num_states, chunk):
        ends = token_walks(moves, trie, lengths, torch.arange(first, min(first + chunk, dfa.num_states)))
        ends = ends[:, shape_of]  # [chunk, vocab], in token order
        state, token = (ends >= 0).nonzero(as_tuple=True)
        rows.append(state + first)
        tokens.append(token)
        targets.append(ends[state, token])
    rows, tokens, targets = torch.cat(rows), torch.cat(tokens), torch.cat(targets)
    offsets = torch.zeros(dfa.num_states + 1, dtype=torch.long)
    offsets[1:] = torch.bincount(rows, minlength=dfa.num_states).cumsum(0)
    return TokenIndex(offsets, tokens, targets, dfa.accepting, fewest_tokens(dfa.accepting, rows, targets))


def fewest_tokens(accepting: torch.Tensor, sources: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Shortest paths in tokens to an accepting state (Bellman-Ford: relax every edge until
    nothing changes). States that cannot finish keep a huge value."""
    far = torch.iinfo(torch.long).max // 2
    # Many tokens join the same two states: the distances need each pair of states once.
    pairs = torch.unique(sources * len(accepting) + targets)
    sources, targets = pairs // len(accepting), pairs % len(accepting)
    distance = torch.where(accepting, 0, far)
    while True:
        through = torch.full_like(distance, far).scatter_reduce(0, sources, distance[targets] + 1, reduce="amin")
        shorter = torch.minimum(distance, through)
        if torch.equal(shorter, distance):
            return distance
        distance = shorter
