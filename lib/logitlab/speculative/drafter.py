"""The drafter interface: what ``ll.speculative_generate`` asks of whoever proposes tokens.

Chapter 6 ("Speculative sampling") introduces it. The loop depends on this interface only;
the drafters themselves live beside it, each in its own module: a draft model in
``logitlab.speculative.draft_model`` and prompt lookup in ``logitlab.speculative.prompt_lookup``
(chapter 6), Medusa heads in ``logitlab.speculative.medusa`` (chapter 7), PaSS look-ahead
embeddings in ``logitlab.speculative.pass_embeddings`` (chapter 8), the feature-level drafter in
``logitlab.speculative.eagle`` (chapter 9).

A call of the loop goes: ``propose`` (up to ``gamma`` tokens and the distributions they were
drawn from), the target's verification pass, then ``rollback`` with how many proposals each row
kept. Any proposal keeps the output exact (verification sees to that), so a drafter is judged
only by how often its proposals are accepted and by what it costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..decoding.tree_shape import depths


@dataclass
class DraftTree:
    """What ``propose`` returns for a *tree* of drafts instead of a chain: several candidates for
    one place, all verified in one target pass (chapter 9).

    ``tokens`` ``[B, n]``: the drafted nodes of each row. ``parents``: the parent of each node, a
    list of n indices (the same tree for every row) or a LongTensor ``[B, n]``; -1 is the pending
    token (the tree's root), and every parent comes before its children. ``q``: ``[B, n, V]``, the
    distribution each node was drawn from given the tree drafted before it, or None when every node
    was chosen deterministically (a drafter's top-k: each ``q`` a point mass on its own token).
    ``depth`` is the number of levels (the most drafts one call can keep).
    """

    tokens: torch.Tensor
    parents: list[int] | torch.Tensor
    q: torch.Tensor | None = None
    read_rows: list[list[int]] | None = field(default=None, repr=False, compare=False)  # rows(), once read

    def rows(self) -> list[list[int]]:
        """Each row's parents, with the root as node 0 (``logitlab.speculative.tree_verify``'s form).
        Parents on the device are read once (a GPU waits for its queue at every read)."""
        if self.read_rows is None:
            per_row = self.parents.tolist() if isinstance(self.parents, torch.Tensor) else (
                [list(self.parents)] * len(self.tokens))
            self.read_rows = [[-1] + [a + 1 for a in row] for row in per_row]
        return self.read_rows

    @property
    def depth(self) -> int:
        return max(max(depths(row)) - 1 for row in self.rows())  # the root has depth 1 there


class Drafter:
    """Base class of every drafter. Subclasses implement ``propose`` and, if they keep state per
    row, ``start``, ``rollback`` and ``select_rows``.

    ``vocab_size`` must equal the target's. ``steps`` counts the drafter's drafting steps, its
    prompt counted as one (for a draft model, its forward passes; for Medusa heads, one per call;
    0 for prompt lookup, which costs no pass); the loop reports it.
    """

    vocab_size: int
    steps: int = 0
    # A drafter that reads the target's last hidden state (Medusa heads, feature-level drafters)
    # sets this; the loop then hands it that state after every target pass (``observe``).
    reads_hidden_state: bool = False
    # ... and, for a drafter that fuses several of the target's layers (chapter 9), which ones: the
    # states it is handed (``observe_states``) are then those layers' outputs, concatenated.
    feature_layers: tuple[int, ...] | None = None
    # A drafter that learns from the target's own guesses (Token Recycling) sets this; the loop
    # then hands it the target's logits after every token of every pass (``observe_logits``).
    reads_logits: bool = False
    # Set by the loop before each call when the output is constrained (chapter 11): the rows'
    # ``logitlab.constrained.constraint.DraftStates``. A drafter that samples its proposals token by token
    # passes its logits through ``constrained`` and its tokens to ``drafted``, so that it
    # proposes only tokens the constraint allows (its q is then the masked distribution). A
    # drafter that ignores it stays exact: the target rejects what the constraint forbids. The
    # tree drafters (EAGLE's and Medusa's trees) ignore it: the loop masks the target after each
    # node in the state after that node's path (``DraftStates.tree``), and a forbidden node is rejected.
    constraint = None
    # A drafter whose proposals depend on the text so far (a keyed watermark's draws, processors
    # of its logits) sets this; the loop then sets ``text`` before each call: each row's tokens
    # so far ``[B, L]``, prompt first, left-padded with -1, the pending token last.
    reads_text: bool = False
    text = None

    def constrained(self, logits: torch.Tensor) -> torch.Tensor:
        if self.constraint is None:
            return logits
        masked = self.constraint.mask(logits)
        # A drafter that scores only some tokens (a subset head) may give every allowed token
        # -inf: that row then drafts uniformly among the allowed tokens (still exact: q is known).
        stuck = torch.isinf(masked).all(dim=-1, keepdim=True)
        return torch.where(stuck, self.constraint.mask(torch.zeros_like(logits)), masked)

    def drafted(self, tokens: torch.Tensor) -> None:
        if self.constraint is not None:
            self.constraint.advance(tokens)

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, target, cache) -> None:
        """Called once, after the target's prefill of the (left-padded) prompts; ``cache`` is the
        target's cache then (PaSS copies it: it drafts with the target itself)."""

    def propose(self, next_tokens: torch.Tensor, gamma: int, config, generator=None):
        """``next_tokens`` ``[B]``: the token the target has just produced for each row, not yet
        in its cache. Returns ``(tokens [B, g], q [B, g, V])`` with ``0 <= g <= gamma`` (the same
        for every row; ``g = 0`` means no proposal, and the call gives the target's own token):
        the proposals and the distribution each was drawn from (one-hot for a deterministic
        proposal). A drafter may return a ``DraftTree`` of depth at most ``gamma`` instead.
        ``config`` is the loop's ``SamplingConfig``."""
        raise NotImplementedError

    def observe(self, hidden: torch.Tensor) -> None:
        """The target's last hidden state ``[B, H]`` where it predicted ``next_tokens`` (only
        called when ``reads_hidden_state``)."""

    def observe_states(self, states: torch.Tensor, tokens: torch.Tensor, kept: torch.Tensor) -> None:
        """(Only called when ``reads_hidden_state``.) Every position the target has just kept:
        its last hidden states ``[B, m, H]`` there, the tokens at those positions ``[B, m]`` and
        which of them row b kept ``[B, m]`` (after the prefill: the prompts and their attention
        mask; after a call: the pending token and the accepted drafts). A feature-level drafter
        (chapter 9) reads the whole history; Medusa heads need only the last (``observe``)."""

    def observe_logits(self, tokens: torch.Tensor, logits: torch.Tensor) -> None:
        """(Only called when ``reads_logits``.) The tokens the target was just fed ``[B, m]`` and
        its logits after each ``[B, m, V]``: every node of a verified tree or chain, kept or not
        (after the prefill: each prompt's last token)."""

    def kept_path(self, paths: list[list[int]]) -> None:
        """(Only after a ``DraftTree``, before ``rollback``.) Each row's kept path through the
        tree, root first, as indices into ``[pending token] + tree nodes`` (0 is the pending
        token): ``rollback`` says only how many drafts were kept, which for a tree does not say
        which; a drafter that follows the text (``copy_or_recycle``) reads them here."""

    def rollback(self, num_accepted: torch.Tensor, kept: list[int] | None = None) -> None:
        """The target kept the first ``num_accepted[b]`` proposals of row b. ``kept``: the same
        counts as a list, where the loop has read them from the device already (a drafter that
        needs them on the host takes them from here rather than reading the tensor again: on a
        GPU every read waits for the queued work)."""

    def select_rows(self, keep: torch.Tensor) -> None:
        """Only the rows ``keep`` go on (the others have finished)."""


def host_counts(num_accepted: torch.Tensor, kept: list[int] | None) -> list[int]:
    """``Drafter.rollback``'s counts as a list: ``kept`` where the loop passed them, else read."""
    return num_accepted.tolist() if kept is None else list(kept)


def padded_chains(found: list[list[int]], last: list[int], vocab_size: int, device):
    """Deterministic proposals of different lengths, one per row, as one chain proposal: each
    padded to the longest with its own last token (``last[b]``, the row's last token, when it
    proposed nothing; any proposal is allowed, a bad one is just rejected). Returns the padded
    lists, the tokens ``[B, g]`` and their one-hot ``q`` ``[B, g, V]``."""
    g = max(len(f) for f in found)
    padded = [f + [f[-1] if f else t] * (g - len(f)) for f, t in zip(found, last)]
    tokens = torch.tensor(padded, dtype=torch.long, device=device).view(len(found), g)
    return padded, tokens, torch.nn.functional.one_hot(tokens, vocab_size).float()


def check_drafter(drafter, target_vocab: int) -> Drafter:
    """A ``Drafter`` with the target's vocabulary, or a clear error saying how to make one."""
    if isinstance(drafter, type):
        raise ValueError(f"drafter must be a drafter object, got the class {drafter.__name__}: call it, "
                         f"e.g. {drafter.__name__}(...)")
    if isinstance(drafter, torch.nn.Module) and not isinstance(drafter, Drafter):
        raise ValueError("drafter must be a Drafter: wrap a draft model as ll.speculative.draft_model.DraftModelDrafter(model)")
    if not isinstance(drafter, Drafter):
        raise ValueError(f"drafter must be a Drafter (see logitlab.speculative.drafter), got {type(drafter).__name__}")
    if drafter.vocab_size != target_vocab:
        raise ValueError(f"drafter has a vocabulary of {drafter.vocab_size} tokens, the target {target_vocab}: "
                         "they must share the tokenizer")
    return drafter
