"""The checks of chapter 4 (beam search): one beam step and following the parents back."""

from __future__ import annotations

import torch

from ...search.beam import beam_search
from .common import CheckFailed, asks_for, call, case_generator, draw_int, show


def _beam_step_reference(logprobs, beam_scores, num_beams):
    totals = (beam_scores[:, None] + logprobs).flatten()
    scores, index = totals.topk(num_beams)
    vocab = logprobs.shape[-1]
    return scores, index // vocab, index % vocab


def _beam_step_cases():
    gen = case_generator(4)  # the random log-probabilities: the same in a notebook, unseen while grading
    logp = lambda *shape: torch.log_softmax(2 * torch.randn(*shape, generator=gen), dim=-1)  # noqa: E731
    yield "the first step: one beam, two to keep", logp(1, 6), torch.zeros(1), 2, ""
    yield "three beams, three to keep", logp(3, 8), torch.tensor([-0.5, -1.2, -2.0]), 3, (
        "Add each beam's score to its row of log-probabilities before comparing across beams.")
    yield "a beam so far behind that none of its extensions survive", logp(2, 5), torch.tensor([-0.1, -50.0]), 2, ""
    yield "one beam whose two extensions are both kept", torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.4, 0.35, 0.25]])), \
        torch.tensor([0.0, -1.0]), 2, "The best extensions may all come from the same beam."
    yield "more beams to keep than beams in", logp(2, 7), torch.tensor([-1.0, -1.5]), 5, ""
    yield "a large vocabulary", logp(4, 1000), -torch.rand(4, generator=gen) * 3, 4, ""
    yield "more beams to keep than tokens in the vocabulary", logp(3, 2), torch.tensor([-0.2, -0.4, -0.3]), 4, (
        "num_beams may exceed V: rank all n * V extensions together (flatten, then topk), not the top "
        "num_beams of each row first (a row has only V).")


@asks_for(beam_search)
def check_beam_step(fn) -> None:
    """Check ``fn(logprobs, beam_scores, num_beams) -> (scores, parents, tokens)`` (chapter 4)."""
    cases = list(_beam_step_cases())
    for number, (name, logprobs, beam_scores, num_beams, hint) in enumerate(cases, start=1):
        label = f"Case {number} of {len(cases)} ({name})"
        got = call(fn, label, logprobs.clone(), beam_scores.clone(), num_beams)
        expected = _beam_step_reference(logprobs, beam_scores, num_beams)
        where = f"With beam_scores {show(beam_scores)}, logprobs of shape {tuple(logprobs.shape)} and num_beams={num_beams}"
        if not isinstance(got, tuple) or len(got) != 3 or not all(isinstance(t, torch.Tensor) for t in got):
            raise CheckFailed(f"{label}: return a tuple of three tensors (scores, parents, tokens).")
        for what, g, e in zip(("scores", "parents", "tokens"), got, expected):
            if g.shape != e.shape:
                raise CheckFailed(f"{label}: {where}, {what} has shape {tuple(g.shape)}, expected {tuple(e.shape)}.")
        scores, parents, tokens = (t.cpu() for t in got)  # a student's answer may be on another device
        if not torch.allclose(scores.double(), expected[0].double(), atol=1e-5) or not torch.equal(
                parents.long(), expected[1]) or not torch.equal(tokens.long(), expected[2]):
            raise CheckFailed(
                f"{label}: {where}, expected scores {show(expected[0])}, parents {show(expected[1])}, tokens "
                f"{show(expected[2])} (best first), got scores {show(scores)}, parents {show(parents)}, tokens "
                f"{show(tokens)}. {hint}".strip())
    print(f"check_beam_step: all {len(cases)} cases passed.")


@asks_for(beam_search)
def check_backtrack(fn) -> None:
    """Check ``fn(parents, tokens, beam)`` against the beams that ``ll.beam_search`` records
    (chapter 4): searches on toy models of fixed seeds, then on toy models drawn from the case
    generator."""
    cases = [(f"{beams} beams after {steps} steps, beam {beam}", *case)
             for seed, (beams, steps) in enumerate([(1, 3), (2, 4), (3, 6), (4, 8)])
             for beam, case in enumerate(_recorded(seed, beams, steps))]
    for number, (name, parents, tokens, beam, expected) in enumerate(cases, start=1):
        _compare_backtrack(fn, f"Case {number} of {len(cases)} ({name})", parents, tokens, beam, expected)
    gen = case_generator(5)
    random = []
    for _ in range(8):  # a search of random shape on a random toy model; one of its beams
        beams = draw_int(gen, 1, 5)
        recorded = _recorded(draw_int(gen, 0, 2**31), beams, draw_int(gen, 1, 9), vocab_size=draw_int(gen, 4, 12))
        random.append(recorded[draw_int(gen, 0, beams)])
    for number, (parents, tokens, beam, expected) in enumerate(random, start=1):
        where = f"parents {[p.tolist() for p in parents]}, tokens {[t.tolist() for t in tokens]}, beam {beam}"
        _compare_backtrack(fn, f"Random case {number} of {len(random)} ({where})", parents, tokens, beam, expected)
    print(f"check_backtrack: all {len(cases)} cases passed, and {len(random)} random ones.")


def _recorded(seed: int, beams: int, steps: int, vocab_size: int = 5) -> list[tuple]:
    """``(parents, tokens, beam, expected)`` for each beam of ``ll.beam_search`` on a toy model:
    the parents and last tokens it records at each step, and the beam's tokens at the end."""
    from ...toy import toy_model

    model = toy_model(vocab_size=vocab_size, order=2, seed=seed)
    history = beam_search(model, [[0]], num_beams=beams, max_new_tokens=steps, eos_token_id=[]).history
    parents = [h.parents[0] for h in history]
    tokens = [h.beams[0, :, -1] for h in history]
    return [(parents, tokens, beam, history[-1].beams[0, beam].tolist()) for beam in range(beams)]


def _compare_backtrack(fn, label: str, parents, tokens, beam: int, expected: list[int]) -> None:
    got = call(fn, label, [p.clone() for p in parents], [t.clone() for t in tokens], beam)
    got = got.tolist() if isinstance(got, torch.Tensor) else got
    if got != expected:
        raise CheckFailed(
            f"{label}: expected the tokens {expected}, got {got}. Start from the last step and follow "
            f"parents backwards: the token of step t belongs to the beam that parents[t + 1] points to.")
