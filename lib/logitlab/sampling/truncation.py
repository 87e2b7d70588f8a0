"""Truncation: which tokens may come next (top-k, top-p, min-p, locally typical sampling).

Chapter 2 ("Truncation") explains every function here. The repetition penalties of chapter 3
live in ``logitlab.sampling.penalties``.

Every rule is a pure function on logits ``[..., vocab]`` (usually ``[batch, vocab]``) that
returns *new* logits: a removed token gets ``-inf`` (probability 0 after softmax), a kept token
keeps its logit, and the input is never modified. Each rule is also a class (``TopK``,
``TopP``, ``MinP``, ``Typical``) that subclasses Hugging Face's ``LogitsProcessor``, so it works
in ``model.generate(logits_processor=LogitsProcessorList([TopK(50), TopP(0.9)]))``.

The rules keep the tokens that Hugging Face's warpers keep, computed in the same
floating-point arithmetic; the tests use those warpers as the oracle. ``top_p`` says how it
breaks ties and how it avoids HF's sort of the whole vocabulary without changing the result.
"""

from __future__ import annotations

import torch

from .._validate import check_int, check_logits, check_number
from ..devices import exact_dtype
from .hf_processor import Processor

_NEG_INF = float("-inf")
# top_p decides a row among this many most likely tokens, else among more, else sorts it all;
_CANDIDATES = (256, 4096)
# and only where rounding errors of this many float epsilons could not change the answer
# (the largest difference seen between its sums and Hugging Face's: 2 epsilons).
_SLACK = 16


def top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest logits of each row; every other token gets ``-inf`` (chapter 2).

    A token whose logit equals the k-th largest is kept too, so a tie at the boundary keeps
    more than ``k`` tokens (as Hugging Face's ``TopKLogitsWarper``); ``k >= vocab`` keeps all.

    >>> top_k(torch.tensor([1.0, 3.0, 2.0, 0.0]), 2)
    tensor([-inf, 3., 2., -inf])
    """
    check_logits(logits)
    k = check_int(k, "k", minimum=1)
    kth_largest = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth_largest, _NEG_INF)


def top_p(logits: torch.Tensor, p: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Nucleus sampling (Holtzman et al. 2020): keep the smallest set of most likely tokens
    whose probability reaches ``p``; the rest get ``-inf`` (chapter 2).

    A token is kept when the tokens ranked above it hold less than ``p`` of the probability,
    so the most likely token is always kept, and so are the ``min_tokens_to_keep`` most
    likely ones. ``p`` is in (0, 1]; ``p = 1`` keeps every token.

    The same tokens as Hugging Face's ``TopPLogitsWarper``, which sorts the row, takes its
    softmax and removes a token when the cumulative probability from the least likely token
    up to it is ``<= 1 - p`` (in exact arithmetic: when the tokens above hold ``>= p``).
    Two differences. Ties: among equal logits the higher token id ranks first (a stable
    ascending sort read from the end); HF's sort is stable on a CPU for rows of up to 16
    tokens, and on longer rows it keeps as many tied tokens as we do, but which ones depends
    on its sort. At ``p = 1`` HF also removes tokens whose probability underflows to 0.

    Speed: sorting the vocabulary is what makes HF's top-p slow, and the kept tokens are
    usually few. So a row is decided among its 256 most likely tokens (``torch.topk``), else
    among 4096, else by a full sort in HF's own arithmetic. The first row goes alone, and the
    others start at the size it needed (rows of a batch are usually alike). A row is decided
    among candidates only when that is certain: every token tied with the last kept one is a
    candidate, and rounding errors of 16 float epsilons could not change the answer (HF adds
    the softmax's exponentials in float32 in sorted order, we add them unsorted in float64,
    so the last bits can differ; tested on a CPU). Half-precision rows, too coarse for that,
    are sorted.

    >>> top_p(torch.log(torch.tensor([0.5, 0.25, 0.125, 0.125])), 0.75)
    tensor([-0.6931, -1.3863,    -inf,    -inf])
    """
    check_logits(logits)
    p = check_number(p, "p", "a number in (0, 1]", lambda v: 0 < v <= 1)
    m = check_int(min_tokens_to_keep, "min_tokens_to_keep", minimum=1)
    if p == 1.0:
        return logits.clone()
    vocab = logits.shape[-1]
    rows = logits.reshape(-1, vocab)
    out = torch.empty_like(rows)
    sizes = sorted({min(vocab, max(size, m)) for size in _CANDIDATES} | {vocab})
    first = 0
    if rows.element_size() < 4:
        sizes = [vocab]
    elif rows.shape[0] > 1:
        needed = _top_p_rows(rows[:1], out[:1], p, m, sizes)
        sizes, first = [size for size in sizes if size >= needed], 1
    _top_p_rows(rows[first:], out[first:], p, m, sizes)
    return out.reshape(logits.shape)


def _top_p_rows(rows: torch.Tensor, out: torch.Tensor, p: float, m: int, sizes) -> int:
    """Top-p of ``rows [n, vocab]`` written into ``out`` (same shape), trying the candidate
    ``sizes`` in turn; returns the last size tried."""
    vocab = rows.shape[-1]
    undecided = torch.arange(rows.shape[0], device=rows.device)
    parts = None
    for size in sizes:
        every = undecided.numel() == rows.shape[0]  # no copy while no row is decided
        values, ids = _most_likely_first(rows if every else rows[undecided], size)
        if size == vocab:
            n_kept, decided = _nucleus_as_hf(values, p, m), torch.ones_like(undecided, dtype=torch.bool)
        else:
            if parts is None:
                # After top_k every finite logit is a candidate: the softmax needs no others.
                complete = bool((values[:, -1] == _NEG_INF).all())
                # The exponentials of whole rows go to `out`, not yet written: one tensor less.
                parts = _softmax_parts(values if complete else rows, scratch=None if complete else out)
            n_kept, decided = _nucleus(values, [part[undecided] for part in parts], p, m)
            _order_split_ties(values, ids, n_kept, decided)
        if size == sizes[0]:
            out.fill_(_NEG_INF)
        kept = values.masked_fill(torch.arange(size, device=rows.device) >= n_kept, _NEG_INF)
        # Write the decided rows' kept logits into `out`, seen as one long row.
        where = undecided[decided].unsqueeze(-1) * vocab + ids[decided]
        out.view(-1).scatter_(0, where.flatten(), kept[decided].flatten())
        undecided = undecided[~decided]
        if undecided.numel() == 0:
            break
    return size


def _most_likely_first(rows: torch.Tensor, size: int):
    """The ``size`` largest logits of each row and their ids, largest first."""
    if size < rows.shape[-1]:
        return torch.topk(rows, size, dim=-1)  # ties in any order: see _order_split_ties
    # The whole row in HF's order: an ascending sort read from the end. Stable, so that equal
    # logits have one order: the higher id first.
    values, ids = torch.sort(rows, dim=-1, stable=True)
    return values.flip(-1), ids.flip(-1)


def _nucleus_as_hf(values: torch.Tensor, p: float, m: int) -> torch.Tensor:
    """How many tokens of each whole row (ranked in ``values``) top-p keeps, ``[n, 1]``,
    computed exactly as HF does: softmax of the sorted row, cumulative sum from the bottom."""
    from_bottom = torch.softmax(values.flip(-1), dim=-1).cumsum(dim=-1).flip(-1)
    return (from_bottom > 1 - p).sum(dim=-1, keepdim=True).clamp_min(min(m, values.shape[-1]))


def _softmax_parts(logits: torch.Tensor, scratch: torch.Tensor | None = None):
    """The pieces of ``softmax(logits)``, ``[n, 1]`` each: the row maximum, ``1 / sum(exp(
    logits - max))`` and the sum of the probabilities.

    The sum of exponentials is accumulated in float64: HF adds it up in float32 over its
    sorted row, and the float64 sum rounded to float32 is what it comes closest to. The
    exponentials are written to ``scratch`` if given.
    """
    top = logits.amax(dim=-1, keepdim=True)
    exp = torch.sub(logits, top, out=scratch).exp_()
    # In slices: a float64 copy of the whole row would cost more than the sum itself.
    exp_sum = sum(part.sum(dim=-1, keepdim=True, dtype=exact_dtype(exp.device)) for part in exp.split(1024, dim=-1))
    inverse = 1 / exp_sum.to(logits.dtype)
    # Each probability is rounded, but over a whole row the roundings cancel out.
    return top, inverse, exp_sum * inverse


def _nucleus(values, parts, p: float, m: int):
    """How many of the ranked candidates ``values`` top-p keeps, ``n_kept [n, 1]``, and
    ``decided [n]``: whether that is certain, that is, whether every token tied with the last
    kept one is a candidate and rounding errors of ``_SLACK`` epsilons would not change it.
    """
    top, inverse, total = parts
    mass = (torch.exp(values - top) * inverse).to(total.dtype)
    # HF's number: the cumulative probability from the least likely token up to this one.
    # It decreases down the ranking, so the kept tokens are a prefix: count them.
    from_bottom = total - (mass.cumsum(dim=-1) - mass)
    slack = _SLACK * torch.finfo(values.dtype).eps
    low, high = (
        ((from_bottom * factor).to(values.dtype) > 1 - p).sum(dim=-1, keepdim=True).clamp_min(min(m, values.shape[-1]))
        for factor in (1 - slack, 1 + slack)
    )
    last_kept = values.gather(-1, low - 1)
    decided = (low == high) & ((last_kept > values[:, -1:]) | (last_kept == _NEG_INF))
    return low, decided.squeeze(-1)


def _order_split_ties(values, ids, n_kept, decided) -> None:
    """Where the boundary splits tied logits, put the higher ids first (in place), as the full
    sort does, so that the kept ones are the same whichever way topk ordered them."""
    size = values.shape[-1]
    next_value = values.gather(-1, n_kept.clamp_max(size - 1))
    split = decided & ((next_value == values.gather(-1, n_kept - 1)) & (n_kept < size)).squeeze(-1)
    if split.any():
        ranked, order = torch.sort(ids[split], dim=-1, descending=True)
        by_value = torch.sort(values[split].gather(-1, order), dim=-1, descending=True, stable=True)
        ids[split] = ranked.gather(-1, by_value.indices)


def min_p(logits: torch.Tensor, p: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Keep the tokens whose probability is at least ``p`` times the top probability
    (Nguyen et al. 2024); the rest get ``-inf`` (chapter 2).

    ``p`` is in [0, 1]: 0 keeps every token, 1 keeps only the most likely (and its ties).
    The ``min_tokens_to_keep`` most likely tokens are always kept, chosen by ``torch.topk``
    on the probabilities exactly as Hugging Face's ``MinPLogitsWarper`` does.

    >>> min_p(torch.tensor([0.5, 0.25, 0.15, 0.1]).log(), 0.5)
    tensor([-0.6931, -1.3863,    -inf,    -inf])
    """
    check_logits(logits)
    p = check_number(p, "p", "a number in [0, 1]", lambda v: 0 <= v <= 1)
    m = check_int(min_tokens_to_keep, "min_tokens_to_keep", minimum=1)
    probs = torch.softmax(logits, dim=-1)
    remove = probs < p * probs.amax(dim=-1, keepdim=True)
    most_likely = torch.topk(probs, min(m, logits.shape[-1]), dim=-1).indices
    remove.scatter_(-1, most_likely, False)
    return logits.masked_fill(remove, _NEG_INF)


def typical(logits: torch.Tensor, mass: float, min_tokens_to_keep: int = 1) -> torch.Tensor:
    """Locally typical sampling (Meister et al. 2023): keep the tokens whose surprisal
    ``-log p_i`` is closest to the entropy, until they hold ``mass``; the rest get ``-inf``
    (chapter 2).

    The most likely token can be removed: when it is far more likely than the distribution's
    average, it is atypical. ``mass`` is in (0, 1]; 1 keeps every token (Hugging Face's
    ``TypicalLogitsWarper`` accepts only ``mass < 1``). Otherwise the same arithmetic and the
    same sort as HF, so the same tokens, ties included.
    """
    check_logits(logits)
    mass = check_number(mass, "mass", "a number in (0, 1]", lambda v: 0 < v <= 1)
    m = check_int(min_tokens_to_keep, "min_tokens_to_keep", minimum=1)
    if mass == 1.0:
        return logits.clone()
    vocab = logits.shape[-1]
    rows = logits.reshape(-1, vocab)
    log_probs = torch.log_softmax(rows, dim=-1)
    # 0 * -inf is NaN for removed tokens; nansum counts them as 0, their limit.
    entropy = -(log_probs * log_probs.exp()).nansum(dim=-1, keepdim=True)
    distance, order = torch.sort((-log_probs - entropy).abs(), dim=-1)  # most typical first
    cumulative = torch.softmax(rows.gather(-1, order), dim=-1).cumsum(dim=-1)
    # The first token (in this order) at which the cumulative probability reaches `mass`.
    last = (cumulative < mass).sum(dim=-1, keepdim=True).clamp_max(vocab - 1)
    remove = distance > distance.gather(-1, last)
    remove[:, :m] = False
    remove = remove.scatter(-1, order, remove)
    return rows.masked_fill(remove, _NEG_INF).reshape(logits.shape)



class TopK(Processor):
    """``top_k`` as a logits processor: ``TopK(50)``."""

    def __init__(self, k: int):
        self.k = check_int(k, "k", minimum=1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        return top_k(scores, self.k)


class TopP(Processor):
    """``top_p`` as a logits processor: ``TopP(0.9)``."""

    def __init__(self, p: float, min_tokens_to_keep: int = 1):
        self.p = check_number(p, "p", "a number in (0, 1]", lambda v: 0 < v <= 1)
        self.min_tokens_to_keep = check_int(min_tokens_to_keep, "min_tokens_to_keep", minimum=1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        return top_p(scores, self.p, self.min_tokens_to_keep)


class MinP(Processor):
    """``min_p`` as a logits processor: ``MinP(0.05)``."""

    def __init__(self, p: float, min_tokens_to_keep: int = 1):
        self.p = check_number(p, "p", "a number in [0, 1]", lambda v: 0 <= v <= 1)
        self.min_tokens_to_keep = check_int(min_tokens_to_keep, "min_tokens_to_keep", minimum=1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        return min_p(scores, self.p, self.min_tokens_to_keep)


class Typical(Processor):
    """``typical`` as a logits processor: ``Typical(0.9)``."""

    def __init__(self, mass: float, min_tokens_to_keep: int = 1):
        self.mass = check_number(mass, "mass", "a number in (0, 1]", lambda v: 0 < v <= 1)
        self.min_tokens_to_keep = check_int(min_tokens_to_keep, "min_tokens_to_keep", minimum=1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        check_logits(scores, "scores")
        return typical(scores, self.mass, self.min_tokens_to_keep)
