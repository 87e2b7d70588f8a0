"""Exercise checkers: run a student's function against the library on many cases.

Each ``check_*`` function calls the student's function on a list of cases (ordinary ones first,
then the edge cases that catch real mistakes), compares with the library's reference, and
either prints how many cases passed (and returns nothing) or raises :class:`CheckFailed` describing the first case
that differs, in words: the input, what was expected, what came back, and a hint.

An exercise that has not been written yet (``raise NotImplementedError``) is not caught: the
error goes through unchanged, so a student sees exactly which exercise is still open.
"""

from __future__ import annotations

import torch

from .probs import softmax


class CheckFailed(AssertionError):
    """A student's function gave a wrong answer on one case (the message says which)."""


def _show(t: torch.Tensor) -> str:
    """Small tensors written out (4 decimals), large ones by their shape."""
    if t.numel() > 12:
        return f"a tensor of shape {tuple(t.shape)}"
    return str(torch.round(t.double(), decimals=4).tolist()) if t.is_floating_point() else str(t.tolist())


def _call(fn, case: str, *args):
    try:
        return fn(*args)
    except NotImplementedError:
        raise
    except Exception as exc:  # the student's error, reported with the case that caused it
        raise CheckFailed(f"{case}: your function raised {type(exc).__name__}: {exc}") from exc


def _as_list(got):
    """A parents list as a plain list, whether a student returned a list, a tuple or a tensor."""
    if isinstance(got, torch.Tensor):
        return got.tolist()
    return list(got) if isinstance(got, (list, tuple)) else got


def _softmax_cases():
    gen = torch.Generator().manual_seed(0)
    yield "a small row", torch.tensor([[1.0, 2.0, 3.0]]), 1.0, ""
    yield "a batch of random rows", torch.randn(4, 10, generator=gen), 1.0, "Work along the last dimension."
    yield "temperature 0.5", torch.tensor([[0.0, 1.0, 2.0]]), 0.5, "Divide the logits by T before the softmax."
    yield "temperature 3", torch.randn(3, 7, generator=gen), 3.0, "Divide the logits by T before the softmax."
    yield "very large logits", torch.tensor([[1000.0, 999.0, 0.0]]), 1.0, (
        "exp(1000) overflows; subtract the row maximum before exponentiating (it changes nothing else)."
    )
    yield "very negative logits", torch.tensor([[-1000.0, -1001.0]]), 1.0, (
        "exp(-1000) underflows to 0 and 0/0 is NaN; subtract the row maximum first."
    )
    yield "a -inf logit (a removed token)", torch.tensor([[0.0, float("-inf"), 1.0]]), 0.7, (
        "A -inf logit must get probability exactly 0."
    )
    yield "temperature 0 (greedy)", torch.tensor([[0.5, 3.0, -1.0], [2.0, 1.0, 0.0]]), 0.0, (
        "T = 0 cannot divide; return the one-hot on the argmax."
    )
    yield "temperature 0 with a tie", torch.tensor([[1.0, 4.0, 4.0]]), 0.0, (
        "Ties at T = 0 go to the lowest token id, like torch.argmax."
    )
    yield "a tiny temperature", torch.tensor([[1.0, 1.5, 0.0]]), 1e-3, "Subtract the maximum: logits / 0.001 are large."
    yield "one row without a batch dimension", torch.tensor([2.0, 0.0, -2.0]), 1.0, "Use dim=-1, not dim=1."
    yield "a three-dimensional batch", torch.randn(2, 3, 5, generator=gen), 1.3, "Use dim=-1, not dim=1."


def check_softmax(fn) -> None:
    """Check ``fn(logits, temperature)`` against :func:`logitlab.softmax` (chapter 1)."""
    cases = list(_softmax_cases())
    for number, (name, logits, temperature, hint) in enumerate(cases, start=1):
        label = f"Case {number} of {len(cases)} ({name})"
        original = logits.clone()
        got = _call(fn, label, logits, temperature)
        expected = softmax(original, temperature)
        where = f"With logits {_show(original)} and temperature {temperature}"
        if not torch.equal(logits, original):
            raise CheckFailed(f"{label}: your function changed the logits it was given (work on a copy).")
        if not isinstance(got, torch.Tensor):
            raise CheckFailed(f"{label}: {where}, your function returned a {type(got).__name__}, not a tensor.")
        if got.shape != expected.shape:
            raise CheckFailed(
                f"{label}: {where}, your function returned shape {tuple(got.shape)}, "
                f"expected {tuple(expected.shape)}. {hint}"
            )
        if not torch.allclose(got.double(), expected.double(), atol=1e-5, rtol=1e-4):
            raise CheckFailed(
                f"{label}: {where}, your function returned {_show(got)}, "
                f"the right answer is {_show(expected)}. {hint}"
            )
    print(f"check_softmax: all {len(cases)} cases passed.")


def check_gumbel_max(fn, samples: int = 40_000) -> None:
    """Check ``fn(logits, generator)`` samples like ``softmax(logits)`` (chapter 1).

    Deterministic checks first (shape, dtype, same seed gives same tokens, impossible tokens
    never drawn), then a chi-square test of the frequencies against the exact probabilities.
    The test rejects a correct sampler with probability 1e-4 (its false-positive rate); the seed
    is fixed, so a correct function passes every time.
    """
    from scipy.stats import chisquare

    logits = torch.tensor([1.5, 1.0, 0.0, -0.5, float("-inf"), -2.0])
    batch = torch.stack([logits, logits.flip(0)])
    label = "Case 1 of 4 (shape and dtype)"
    got = _call(fn, label, batch, torch.Generator().manual_seed(0))
    if not isinstance(got, torch.Tensor) or got.shape != (2,) or got.dtype != torch.long:
        shown = f"shape {tuple(got.shape)}, dtype {got.dtype}" if isinstance(got, torch.Tensor) else type(got).__name__
        raise CheckFailed(f"{label}: for logits of shape [2, 6] return token ids of shape [2] and dtype long; got {shown}.")

    label = "Case 2 of 4 (reproducibility)"
    a = _call(fn, label, batch.repeat(50, 1), torch.Generator().manual_seed(1))
    b = _call(fn, label, batch.repeat(50, 1), torch.Generator().manual_seed(1))
    if not torch.equal(a, b):
        raise CheckFailed(f"{label}: the same seed gave different tokens. Draw all noise from the generator you are given.")

    label = "Case 3 of 4 (impossible tokens)"
    rows = batch.repeat(samples // 2, 1)
    tokens = _call(fn, label, rows, torch.Generator().manual_seed(2)).reshape(-1, 2)
    if (tokens[:, 0] == 4).any() or (tokens[:, 1] == 1).any():
        raise CheckFailed(f"{label}: a token whose logit is -inf was drawn; it must have probability 0.")

    label = "Case 4 of 4 (the distribution)"
    for column, row in enumerate(batch):
        probs = softmax(row.double())
        counts = torch.bincount(tokens[:, column], minlength=6).double()
        possible = probs > 0
        expected = probs[possible] / probs[possible].sum() * counts.sum()
        pvalue = chisquare(counts[possible].numpy(), expected.numpy()).pvalue
        if pvalue < 1e-4:
            freq = (counts / counts.sum()).tolist()
            raise CheckFailed(
                f"{label}: for logits {_show(row)} the frequencies of your samples "
                f"{[round(f, 3) for f in freq]} differ from the probabilities "
                f"{[round(p, 3) for p in probs.tolist()]} (chi-square p-value {pvalue:.1e}). "
                "Gumbel noise is -log(-log(U)) with U uniform on (0, 1), added to the logits."
            )
    print("check_gumbel_max: all 4 cases passed.")


def _check_truncation(fn, reference, cases, name: str) -> None:
    """Shared by the truncation checks: same removed tokens (-inf) and same kept logits."""
    for number, (label, logits, arg, hint) in enumerate(cases, start=1):
        case = f"Case {number} of {len(cases)} ({label})"
        original = logits.clone()
        got = _call(fn, case, logits, arg)
        expected = reference(original, arg)
        where = f"With logits {_show(original)} and {name} = {arg}"
        if not torch.equal(logits, original):
            raise CheckFailed(f"{case}: your function changed the logits it was given (work on a copy).")
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            shown = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise CheckFailed(f"{case}: {where}, expected a tensor of shape {tuple(expected.shape)}, got {shown}.")
        kept, should_keep = ~got.isneginf(), ~expected.isneginf()
        if not torch.equal(kept, should_keep):
            raise CheckFailed(
                f"{case}: {where}, your function keeps tokens {_kept(kept)}, "
                f"the right answer keeps {_kept(should_keep)}. {hint}"
            )
        if not torch.equal(got[kept], original[kept]):
            raise CheckFailed(f"{case}: {where}, the kept tokens' logits changed; leave them as they are.")
    print(f"check_{name.replace('-', '_')}: all {len(cases)} cases passed.")


def _kept(mask: torch.Tensor) -> str:
    rows = mask.reshape(-1, mask.shape[-1])
    ids = [row.nonzero().squeeze(-1).tolist() for row in rows]
    return str(ids[0] if mask.dim() == 1 else ids)


def check_top_k(fn) -> None:
    """Check ``fn(logits, k)`` against :func:`logitlab.processors.top_k` (chapter 2)."""
    from .processors import top_k

    gen = torch.Generator().manual_seed(0)
    inf = float("-inf")
    cases = [
        ("a small row", torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2, "Keep the k largest logits, set the rest to -inf."),
        ("k = 1 is greedy", torch.tensor([[0.5, -1.0, 2.5]]), 1, ""),
        ("a batch", torch.randn(3, 20, generator=gen), 5, "Each row keeps its own k largest (dim=-1)."),
        ("k larger than the vocabulary", torch.tensor([[1.0, 2.0]]), 5, "With k >= vocabulary size keep everything."),
        ("a tie at the k-th place", torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0]]), 2, (
            "Tokens tied with the k-th largest logit are all kept: remove only logits strictly "
            "below the k-th largest value."
        )),
        ("-inf entries", torch.tensor([[inf, 1.0, inf, 0.5, 0.0]]), 2, ""),
        ("one row without a batch dimension", torch.tensor([0.1, 0.4, 0.3]), 2, "Use dim=-1."),
    ]
    _check_truncation(fn, top_k, cases, "top-k")


def check_top_p(fn) -> None:
    """Check ``fn(logits, p)`` against :func:`logitlab.processors.top_p` (chapter 2)."""
    import math

    from .processors import top_p

    gen = torch.Generator().manual_seed(0)
    log = math.log
    # probabilities 1/2, 1/4, 3/16, 1/16: sums of these are exact in floating point
    dyadic = torch.tensor([[log(0.5), log(0.25), log(0.1875), log(0.0625)]])
    cases = [
        ("a small row", torch.tensor([[2.0, 1.0, 0.0, -1.0]]), 0.8, (
            "Sort by probability, keep the most likely tokens until their total reaches p."
        )),
        ("a prefix whose mass is exactly p", dyadic, 0.75, (
            "1/2 + 1/4 reaches 0.75 exactly, so the third token is not needed: keep a token only "
            "while the mass of the more likely tokens is still below p."
        )),
        ("p just above a prefix", dyadic, 0.76, "1/2 + 1/4 is below 0.76: one more token is needed."),
        ("p = 1 keeps every possible token", dyadic, 1.0, ""),
        ("tiny p keeps only the top token", torch.tensor([[0.0, 2.0, 1.0]]), 1e-6, "Always keep at least one token."),
        ("a batch of different rows", 3 * torch.randn(4, 30, generator=gen), 0.9, "Each row has its own nucleus."),
        ("-inf entries", torch.tensor([[float("-inf"), 1.0, 0.0, float("-inf"), 2.0]]), 0.7, (
            "Removed tokens have probability 0 and stay removed."
        )),
        ("unsorted input", torch.tensor([[0.0, 3.0, 1.0, 2.0]]), 0.9, "Return the logits in the original token order."),
    ]
    _check_truncation(fn, top_p, cases, "top-p")


def check_frequency_penalty(fn) -> None:
    """Check ``fn(logits, prev_tokens, penalty)`` against
    :func:`logitlab.penalties.frequency_penalty` (chapter 3)."""
    from .penalties import frequency_penalty

    gen = torch.Generator().manual_seed(0)
    inf = float("-inf")
    row = torch.tensor([[1.0, 2.0, -1.0, 0.5]])
    count_hint = "Subtract penalty * count, where count is how often the token occurs in prev_tokens."
    cases = [
        ("each earlier token once", row, torch.tensor([[0, 2]]), 0.5, count_hint),
        ("a token seen three times", row, torch.tensor([[1, 3, 1, 1]]), 0.5, (
            "The frequency penalty grows with the count: a token seen 3 times loses 3 * penalty "
            "(subtracting once per distinct token is the presence penalty)."
        )),
        ("padding (-1) in prev_tokens", row, torch.tensor([[-1, -1, 2, 2]]), 1.0, (
            "Negative entries are padding and must not be counted (as an index, -1 is the last token)."
        )),
        ("an empty history", row, torch.empty(1, 0, dtype=torch.long), 0.7, (
            "With no earlier token nothing changes; prev_tokens has shape [batch, 0]."
        )),
        ("a batch: each row counts its own history", torch.zeros(2, 4), torch.tensor([[0, 0, 1], [3, -1, 3]]), 1.0, (
            "Row i is penalised by the tokens of prev_tokens[i] only."
        )),
        ("a negative penalty", row, torch.tensor([[1, 1, 2]]), -0.5, (
            "A negative penalty raises the logits of earlier tokens: still logits - penalty * count."
        )),
        ("-inf logits", torch.tensor([[inf, 1.0, inf, 0.0]]), torch.tensor([[0, 0, 1, 2]]), 0.5, (
            "A removed token (logit -inf) stays removed."
        )),
        ("a random batch with padding", 3 * torch.randn(4, 50, generator=gen),
         torch.randint(-1, 50, (4, 30), generator=gen), 0.3, count_hint),
    ]
    for number, (name, logits, prev_tokens, penalty, hint) in enumerate(cases, start=1):
        label = f"Case {number} of {len(cases)} ({name})"
        original, original_prev = logits.clone(), prev_tokens.clone()
        got = _call(fn, label, logits, prev_tokens, penalty)
        expected = frequency_penalty(original, original_prev, penalty)
        where = f"With logits {_show(original)}, prev_tokens {_show(original_prev)} and penalty {penalty}"
        if not torch.equal(logits, original) or not torch.equal(prev_tokens, original_prev):
            raise CheckFailed(f"{label}: your function changed its inputs (work on a copy).")
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            shown = f"shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else f"a {type(got).__name__}"
            raise CheckFailed(f"{label}: {where}, expected a tensor of shape {tuple(expected.shape)}, got {shown}.")
        same = (got == expected) | (got - expected).abs().le(1e-5)  # -inf == -inf counts as the same
        if not bool(same.all()):
            r, i = (~same).nonzero()[0].tolist()
            raise CheckFailed(
                f"{label}: {where}, your function returned {_show(got)}, the right answer is "
                f"{_show(expected)} (first difference: row {r}, token {i}: {got[r, i].item():.4f} "
                f"instead of {expected[r, i].item():.4f}). {hint}"
            )
    print(f"check_frequency_penalty: all {len(cases)} cases passed.")


def check_stop_position(fn) -> None:
    """Check ``fn(pieces, stops)`` against :func:`logitlab.generate.find_stop` applied to
    ``"".join(pieces)`` (chapter 3)."""
    from .generate import find_stop

    spans = "The stop string is split over several tokens: search the joined text, not each piece."
    cases = [
        ("a stop inside one piece", ["Hello", " world", ".\n\n", "Next"], ["\n\n"], ""),
        ("a stop spanning two pieces", [" Paris", ".", "\n", "\n", "The"], ["\n\n"], spans),
        ("a stop spanning three pieces", [" Berlin", ".", "\n", "Question", ":", " What"], ["\nQuestion:"], spans),
        ("a stop starting in the middle of a piece", [" Paris", ".", "\n"], ["ris."], (
            "A stop string can start anywhere, also inside a piece; return a character index."
        )),
        ("two stops, the later-listed one starts earlier", ["one", " two", " three"], [" three", " two"], (
            "Return where the earliest stop string starts, whichever stop it is, not the first stop of the list."
        )),
        ("a stop that occurs twice", ["a", "X", "b", "X"], ["X"], "Return the first occurrence."),
        ("an empty piece", ["Hi", "", "\n", "", "\n", "there"], ["\n\n"], "Some tokens decode to no text."),
        ("no stop", ["The", " end", "."], ["\n\n", "###"], "Return -1 when no stop string occurs."),
        ("a stop at the very start", ["\n", "\n", "Next"], ["\n\n"], "0 is a position like any other."),
        ("no pieces yet", [], ["\n\n"], "Return -1 when no stop string occurs."),
    ]
    for number, (name, pieces, stops, hint) in enumerate(cases, start=1):
        label = f"Case {number} of {len(cases)} ({name})"
        got = _call(fn, label, list(pieces), list(stops))
        expected = find_stop("".join(pieces), stops)
        where = f"With pieces {pieces!r} and stops {stops!r}"
        if isinstance(got, bool) or not isinstance(got, int):
            raise CheckFailed(f"{label}: {where}, your function returned {got!r}, not an int. {hint}")
        if got != expected:
            raise CheckFailed(f"{label}: {where}, your function returned {got}, the right answer is {expected}. {hint}")
    print(f"check_stop_position: all {len(cases)} cases passed.")


def _tree_cases():
    """(name, parents, hint) for check_tree_mask: small shapes first, then the book's tree, then random ones."""
    ancestors_only = "A node attends to itself and its ancestors only, not to its siblings or cousins."
    yield "a single node", [-1], "A node must attend to itself: the diagonal is True."
    yield "a chain (one path)", [-1, 0, 1, 2, 3], (
        "In a chain every earlier node is an ancestor: the mask is the causal (lower-triangular) one."
    )
    yield "a star (children of the root only)", [-1, -1, -1, -1], (
        "Children of the root are siblings: each sees only itself (and the prompt)."
    )
    yield "two branches", [-1, 0, 0, 1, 2], ancestors_only
    yield "ancestors two levels up", [-1, -1, 0, 1, 2, 3, 2], (
        "A node sees its parent, its parent's parent, and so on up to the root, not just its parent."
    )
    yield "nodes not in level order", [-1, 0, -1, 1, 2, 0], (
        "Parents come before their children, but the levels may interleave: follow the parents, not the positions."
    )
    parents, level = [], [-1]  # the (4, 4, 2) tree of the chapter: 52 nodes
    for k in (4, 4, 2):
        first = len(parents)
        parents += [p for p in level for _ in range(k)]
        level = list(range(first, len(parents)))
    yield "the (4, 4, 2) tree", parents, ancestors_only
    gen = torch.Generator().manual_seed(0)
    for n in (7, 12, 30):
        parents = [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(n)]
        yield f"a random tree of {n} nodes", parents, ancestors_only


def check_tree_mask(fn) -> None:
    """Check ``fn(parents)`` against :func:`logitlab.tree.tree_attention_mask` (chapter 5).

    ``parents`` is a list: ``parents[i]`` is node i's parent, -1 for a child of the root. The
    answer is an ``[n, n]`` tensor, True (or 1) at ``[i, j]`` when node j is node i or one of
    its ancestors.
    """
    from .tree import ancestors

    from .tree import tree_attention_mask

    cases = list(_tree_cases())
    for number, (name, parents, hint) in enumerate(cases, start=1):
        label = f"Case {number} of {len(cases)} ({name})"
        given = list(parents)
        got = _call(fn, label, given)
        expected = tree_attention_mask(parents)
        n = len(parents)
        where = f"With parents {parents}" if n <= 12 else f"With parents of {n} nodes"
        if given != parents:
            raise CheckFailed(f"{label}: your function changed the parents list it was given (work on a copy).")
        if not isinstance(got, torch.Tensor) or got.shape != (n, n):
            shown = f"shape {tuple(got.shape)}" if isinstance(got, torch.Tensor) else f"a {type(got).__name__}"
            raise CheckFailed(f"{label}: {where}, expected a tensor of shape ({n}, {n}), got {shown}.")
        if got.dtype != torch.bool and not bool(((got == 0) | (got == 1)).all()):
            raise CheckFailed(f"{label}: {where}, return True/False (or 1/0) entries, not other values.")
        got = got.bool()
        if not torch.equal(got, expected):
            i, j = (got != expected).nonzero()[0].tolist()
            path = ancestors(parents, i)  # the root-to-node path, node included
            if expected[i, j]:
                why = f"node {j} is node {i} itself" if i == j else f"node {j} is an ancestor of node {i}"
            else:
                why = f"node {j} is not node {i} nor one of its ancestors"
            causal = torch.ones(n, n, dtype=torch.bool).tril()
            if torch.equal(got, causal):
                hint = ("This is a plain causal mask: it lets each node see every earlier node, siblings and "
                        "cousins too. " + hint)
            raise CheckFailed(
                f"{label}: {where}, entry [{i}, {j}] is {bool(got[i, j])} but should be {bool(expected[i, j])}: "
                f"{why} (the path from the root to node {i} is {path}). {hint}"
            )
    print(f"check_tree_mask: all {len(cases)} cases passed.")


# --------------------------------------------------------------------------- chapter 4


def _beam_step_reference(logprobs, beam_scores, num_beams):
    totals = (beam_scores[:, None] + logprobs).flatten()
    scores, index = totals.topk(num_beams)
    vocab = logprobs.shape[-1]
    return scores, index // vocab, index % vocab


def _beam_step_cases():
    gen = torch.Generator().manual_seed(4)
    logp = lambda *shape: torch.log_softmax(2 * torch.randn(*shape, generator=gen), dim=-1)  # noqa: E731
    yield "the first step: one beam, two to keep", logp(1, 6), torch.zeros(1), 2, ""
    yield "three beams, three to keep", logp(3, 8), torch.tensor([-0.5, -1.2, -2.0]), 3, (
        "Add each beam's score to its row of log-probabilities before comparing across beams.")
    yield "a beam so far behind that none of its extensions survive", logp(2, 5), torch.tensor([-0.1, -50.0]), 2, ""
    yield "one beam whose two extensions are both kept", torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.4, 0.35, 0.25]])), \
        torch.tensor([0.0, -1.0]), 2, "The best extensions may all come from the same beam."
    yield "more beams to keep than beams in", logp(2, 7), torch.tensor([-1.0, -1.5]), 5, ""
    yield "a large vocabulary", logp(4, 1000), -torch.rand(4, generator=gen) * 3, 4, ""


def check_beam_step(fn) -> None:
    """Check ``fn(logprobs, beam_scores, num_beams) -> (scores, parents, tokens)`` (chapter 4)."""
    cases = list(_beam_step_cases())
    for number, (name, logprobs, beam_scores, num_beams, hint) in enumerate(cases, start=1):
        label = f"Case {number} of {len(cases)} ({name})"
        got = _call(fn, label, logprobs.clone(), beam_scores.clone(), num_beams)
        expected = _beam_step_reference(logprobs, beam_scores, num_beams)
        where = f"With beam_scores {_show(beam_scores)}, logprobs of shape {tuple(logprobs.shape)} and num_beams={num_beams}"
        if not isinstance(got, tuple) or len(got) != 3 or not all(isinstance(t, torch.Tensor) for t in got):
            raise CheckFailed(f"{label}: return a tuple of three tensors (scores, parents, tokens).")
        for what, g, e in zip(("scores", "parents", "tokens"), got, expected):
            if g.shape != e.shape:
                raise CheckFailed(f"{label}: {where}, {what} has shape {tuple(g.shape)}, expected {tuple(e.shape)}.")
        scores, parents, tokens = got
        if not torch.allclose(scores.double(), expected[0].double(), atol=1e-5) or not torch.equal(
                parents.long(), expected[1]) or not torch.equal(tokens.long(), expected[2]):
            raise CheckFailed(
                f"{label}: {where}, expected scores {_show(expected[0])}, parents {_show(expected[1])}, tokens "
                f"{_show(expected[2])} (best first), got scores {_show(scores)}, parents {_show(parents)}, tokens "
                f"{_show(tokens)}. {hint}".strip())
    print(f"check_beam_step: all {len(cases)} cases passed.")


def check_backtrack(fn) -> None:
    """Check ``fn(parents, tokens, beam)`` against the beams that ``ll.beam_search`` records (chapter 4)."""
    from .beam import beam_search
    from .toy import toy_model

    cases = []
    for seed, (beams, steps) in enumerate([(1, 3), (2, 4), (3, 6), (4, 8)]):
        model = toy_model(vocab_size=5, order=2, seed=seed)
        history = beam_search(model, [[0]], num_beams=beams, max_new_tokens=steps, eos_token_id=[]).history
        parents = [h.parents[0] for h in history]
        tokens = [h.beams[0, :, -1] for h in history]
        for beam in range(beams):
            cases.append((f"{beams} beams after {steps} steps, beam {beam}", parents, tokens, beam,
                          history[-1].beams[0, beam].tolist()))
    for number, (name, parents, tokens, beam, expected) in enumerate(cases, start=1):
        label = f"Case {number} of {len(cases)} ({name})"
        got = _call(fn, label, [p.clone() for p in parents], [t.clone() for t in tokens], beam)
        got = got.tolist() if isinstance(got, torch.Tensor) else got
        if got != expected:
            raise CheckFailed(
                f"{label}: expected the tokens {expected}, got {got}. Start from the last step and follow "
                f"parents backwards: the token of step t belongs to the beam that parents[t + 1] points to.")
    print(f"check_backtrack: all {len(cases)} cases passed.")


def check_tree_positions(fn) -> None:
    """Check ``fn(parents, offset)`` against :func:`logitlab.tree.tree_position_ids` (chapter 5)."""
    from .tree import tree_position_ids

    cases = [(name, parents, offset) for (name, parents, _) in _tree_cases() for offset in (0, 7)]
    for number, (name, parents, offset) in enumerate(cases, start=1):
        label = f"Case {number} of {len(cases)} ({name}, offset {offset})"
        got = _call(fn, label, list(parents), offset)
        expected = tree_position_ids(parents, offset)
        if not isinstance(got, torch.Tensor) or got.shape != expected.shape or not torch.equal(got.long(), expected):
            shown = _show(got) if isinstance(got, torch.Tensor) else repr(got)
            raise CheckFailed(
                f"{label}: with parents {parents} after a prompt of {offset} tokens, expected the positions "
                f"{expected.tolist()}, got {shown}. A node sits one place after its parent; the children "
                f"of the prompt sit at position {offset}, and siblings share a position.")
    print(f"check_tree_positions: all {len(cases)} cases passed.")


# --------------------------------------------------------------------------- chapter 6


def check_verify(fn, trials: int = 20_000) -> None:
    """Check ``fn(draft_tokens, q, p, generator) -> (num_accepted, next_token)`` for one sequence
    (chapter 6): hand cases first, then a statistical test of the tokens it outputs.

    ``draft_tokens`` is ``[g]``, ``q`` ``[g, V]``, ``p`` ``[g + 1, V]``. The statistical part draws
    drafts from ``q``, calls ``fn`` ``trials`` times, and checks with chi-square tests (each
    failing by chance with probability 1e-4) that the first output token follows ``p[0]`` and,
    when the first draft was accepted, the second follows ``p[1]``.
    """
    from scipy.stats import chisquare

    def as_ints(got, label):
        if not isinstance(got, tuple) or len(got) != 2:
            raise CheckFailed(f"{label}: return a tuple (num_accepted, next_token).")
        return int(got[0]), int(got[1])

    gen = torch.Generator().manual_seed(0)
    hand = []
    drafts = torch.tensor([1, 4, 5])
    p = torch.zeros(4, 10)
    p[0, 1] = p[1, 4] = p[2, 8] = p[3, 0] = 1.0
    hand.append(("the target agrees twice, then wants token 8", drafts, torch.eye(10)[drafts], p, (2, 8),
                 "Accept while p/q allows it; at the first rejection draw from max(0, p - q), normalised."))
    p = torch.zeros(3, 6)
    p[0, 2] = p[1, 3] = p[2, 5] = 1.0
    hand.append(("every draft is what the target wants: the bonus token comes from the last row of p",
                 torch.tensor([2, 3]), torch.eye(6)[[2, 3]], p, (2, 5),
                 "After accepting all g drafts, draw the next token from p[g]."))
    p = torch.zeros(3, 6)
    p[0, 1] = 1.0
    p[1:, 0] = 1.0
    hand.append(("the first draft has target probability 0", torch.tensor([2, 0]), torch.eye(6)[[2, 0]], p, (0, 1),
                 "A draft the target gives probability 0 is always rejected, even if later ones would match."))
    for number, (name, d, q, p, expected, hint) in enumerate(hand, start=1):
        label = f"Hand case {number} of {len(hand)} ({name})"
        got = as_ints(_call(fn, label, d.clone(), q.clone(), p.clone(), gen), label)
        if got != expected:
            raise CheckFailed(f"{label}: expected (num_accepted, next_token) = {expected}, got {got}. {hint}")

    vocab = 4
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.2, 0.5, 0.05, 0.25], [0.4, 0.3, 0.2, 0.1]])
    first, second = torch.zeros(vocab), torch.zeros(vocab)
    label = "The statistical test"
    for _ in range(trials):
        d = torch.stack([torch.multinomial(q[i], 1, generator=gen)[0] for i in range(2)])
        num, nxt = as_ints(_call(fn, label, d, q, p, gen), label)
        if not 0 <= num <= 2:
            raise CheckFailed(f"{label}: num_accepted must be between 0 and g = 2, got {num}.")
        out = d[:num].tolist() + [nxt]
        first[out[0]] += 1
        if num >= 1:
            second[out[1]] += 1
    for what, counts, target, hint in [
        ("the first output token", first, p[0], "Check the acceptance test u < p(d) / q(d) and the residual "
         "max(0, p - q) at the first rejection."),
        ("the second output token, after an accepted first draft", second, p[1], "After an accepted draft, the "
         "next position uses the next rows of p and q."),
    ]:
        expected = counts.sum() * target.double() / target.double().sum()
        pvalue = chisquare(counts.double(), expected).pvalue
        if pvalue < 1e-4:
            raise CheckFailed(
                f"{label}: over {int(counts.sum())} draws, {what} came out with frequencies "
                f"{_show(counts / counts.sum())}, but it must follow the target's {_show(target)} "
                f"(chi-square p-value {pvalue:.1e}). {hint}")
    print(f"check_verify: all {len(hand)} hand cases and the statistical test ({trials} calls) passed.")


def check_expected_tokens(fn) -> None:
    """Check ``fn(alpha, gamma) -> float``, the expected tokens per target call (chapter 6)."""
    cases = [(0.0, 3, 1.0, "alpha = 0: every first draft is rejected, the call yields its one replacement token"),
             (0.5, 1, 1.5, "gamma = 1: 1 + alpha"),
             (0.6, 4, (1 - 0.6 ** 5) / 0.4, "the general case"),
             (0.9, 10, (1 - 0.9 ** 11) / 0.1, "a long draft"),
             (1.0, 4, 5.0, "alpha = 1: all gamma drafts and the bonus token (the closed form is 0/0 here)")]
    for alpha, gamma, expected, name in cases:
        label = f"expected_tokens({alpha}, {gamma}) ({name})"
        got = _call(fn, label, alpha, gamma)
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise CheckFailed(f"{label}: return a number, got {type(got).__name__}.") from None
        if not abs(got - expected) <= 1e-9 * max(1.0, expected):
            raise CheckFailed(f"{label}: expected {expected:.6f}, got {got:.6f}.")
    print(f"check_expected_tokens: all {len(cases)} cases passed.")


def check_match_probability(fn) -> None:
    """Check ``fn(p) -> [...]``: the probability that two independent draws from ``p`` ``[..., V]``
    are the same token (chapter 7)."""
    cases = [("one certain token", torch.tensor([0.0, 1.0, 0.0]), 1.0),
             ("four equally likely tokens", torch.full((4,), 0.25), 0.25),
             ("the hand case of the chapter", torch.tensor([0.5, 0.3, 0.2]), 0.38),
             ("two rows at once", torch.tensor([[0.9, 0.1], [0.5, 0.5]]), [0.82, 0.5])]
    for name, p, expected in cases:
        label = f"Case {name}"
        got = _call(fn, label, p.clone())
        got = torch.as_tensor(got, dtype=torch.float64)
        want = torch.tensor(expected, dtype=torch.float64)
        if got.shape != want.shape:
            raise CheckFailed(f"{label}: expected shape {tuple(want.shape)} (one number per row of p), "
                              f"got {tuple(got.shape)}.")
        if not torch.allclose(got, want, atol=1e-6):
            raise CheckFailed(f"{label}: expected {want.tolist()}, got {got.tolist()}. Both draws give token x "
                              "with probability p(x) * p(x); add over x.")
    print(f"check_match_probability: all {len(cases)} cases passed.")


def check_typical_accept(fn) -> None:
    """Check ``fn(draft_tokens, p, epsilon, delta) -> num_accepted`` for one sequence (chapter 7)
    against :func:`logitlab.typical_acceptance.typical_accept`: ``draft_tokens`` ``[g]``, ``p``
    ``[g, V]``."""
    from .typical_acceptance import typical_accept

    sure, flat = [0.97, 0.01, 0.01, 0.01], [0.25, 0.25, 0.25, 0.25]
    cases = [("a sure target agrees, then a flat one: both pass", [0, 3], [sure, flat], 0.09, 0.3,
              "Under a flat p the bar is delta * exp(-H) = 0.3 / 4, below 0.25."),
             ("the first draft fails: nothing after it counts", [1, 0], [sure, sure], 0.09, 0.3,
              "Keep drafts only up to the first one that fails."),
             ("0.05 against epsilon = 0.04 and then 0.09", [2], [[0.5, 0.45, 0.05, 0.0]], 0.04, 0.3,
              "The bar is min(epsilon, delta * exp(-H)), H the entropy of p in nats."),
             ("the same with epsilon 0.09", [2], [[0.5, 0.45, 0.05, 0.0]], 0.09, 0.3,
              "The bar is min(epsilon, delta * exp(-H)), H the entropy of p in nats."),
             ("a draft of probability 0 never passes", [3, 0], [[0.5, 0.45, 0.05, 0.0], sure], 0.09, 0.3,
              "A token the target gives probability 0 is below any bar."),
             ("zero entries in p: 0.28 against a bar of 0.276", [1], [[0.72, 0.28, 0.0, 0.0]], 0.3, 0.5,
              "Entropy: 0 * log 0 counts as 0 (torch.xlogy does that); a NaN entropy breaks the bar."),
             ]
    gen = torch.Generator().manual_seed(0)
    for i in range(12):  # random cases of every length
        g, vocab = 1 + i % 4, 3 + i % 5
        p = torch.softmax(3 * torch.randn(g, vocab, generator=gen), dim=-1)
        d = torch.multinomial(p, 1, generator=gen).squeeze(-1)
        eps = [0.05, 0.09, 0.3][i % 3]
        cases.append((f"random case {i + 1} (g = {g}, V = {vocab})", d.tolist(), p.tolist(), eps, eps ** 0.5,
                      "Compare your threshold with min(epsilon, delta * exp(-H)) position by position."))
    for name, d, p, eps, delta, hint in cases:
        label = f"Case {name}"
        d, p = torch.tensor(d), torch.tensor(p, dtype=torch.float32)
        expected = int(typical_accept(d[None], p[None], eps, delta)[0])
        got = _call(fn, label, d.clone(), p.clone(), eps, delta)
        try:
            got = int(got)
        except (TypeError, ValueError):
            raise CheckFailed(f"{label}: return the number of accepted drafts, an int; got {type(got).__name__}.") from None
        if got != expected:
            raise CheckFailed(f"{label}: expected {expected} accepted drafts, got {got}. {hint}")
    print(f"check_typical_accept: all {len(cases)} cases passed.")


def check_training_layout(fn) -> None:
    """Check ``fn(length, starts, k) -> parents`` (chapter 8) against
    :func:`logitlab.lookahead.training_layout`: a sequence of ``length`` tokens as a chain, then
    ``k`` look-ahead slots in a chain after each context end ``t`` in ``starts``."""
    from .lookahead import training_layout

    cases = [("one token, one slot", 1, [0], 1), ("the chapter's drawing", 5, [1, 3], 2),
             ("two groups after the same token", 4, [2, 2], 3), ("no groups", 3, [], 2)]
    for name, length, starts, k in cases:
        label = f"Case {name} (length={length}, starts={starts}, k={k})"
        got = _call(fn, label, length, list(starts), k)
        want = training_layout(length, starts, k)
        got = _as_list(got)
        if got != want:
            raise CheckFailed(f"{label}: expected parents {want}, got {got}. The tokens come first, each the child "
                              "of the one before; then each group: its first slot hangs from token t, each "
                              "later slot from the slot before it.")
    print(f"check_training_layout: all {len(cases)} cases passed.")


def check_single_call_layout(fn) -> None:
    """Check ``fn(num_drafts, groups) -> parents`` (chapter 8) against
    :func:`logitlab.lookahead.single_call_layout`: the pending token, the drafts as a chain, then a
    chain of ``groups[j]`` slots after each prefix length ``j`` (in increasing order of j)."""
    from .lookahead import single_call_layout

    cases = [("no drafts, three slots", 0, {0: 3}), ("two drafts, slots after every prefix", 2, {0: 2, 1: 2, 2: 2}),
             ("slots after the full prefix only", 3, {3: 2}), ("groups given out of order", 2, {2: 1, 0: 1}),
             ("no slots at all", 2, {})]
    for name, m, groups in cases:
        label = f"Case {name} (num_drafts={m}, groups={groups})"
        got = _call(fn, label, m, dict(groups))
        want = single_call_layout(m, groups)
        got = _as_list(got)
        if got != want:
            raise CheckFailed(f"{label}: expected parents {want}, got {got}. Node 0 is the pending token (parent -1), "
                              "draft i is node i (parent i - 1); the group for prefix j starts at node j and "
                              "groups come in increasing j.")
    print(f"check_single_call_layout: all {len(cases)} cases passed.")
