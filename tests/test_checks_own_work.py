"""A check fails an answer that runs the library's code where its exercise does not allow it:
the function the exercise asks for (directly, under another name, as a copy of its code, or
through another ``ll.*`` function that uses it) or any other library function, with a message
naming what ran; the library works normally again once the check is over."""

import pytest
import torch

import logitlab as ll
from logitlab.course import checks
from logitlab.constrained.index import build_index, fewest_tokens
from logitlab.decoding.generate import find_stop
from logitlab.speculative.pass_embeddings import single_call_layout
from logitlab.constrained.regex import ByteDFA, ByteNFA, determinize, utf8_ranges
from logitlab.speculative.pass_embeddings import training_layout
from logitlab.speculative.tree_verify import after_rejection


def subsets_by_library(symbols, moves, empty, start, accepting):
    nfa = ByteNFA()
    for _ in range(len(moves) + 1):
        nfa.state()
    for s in range(len(moves)):
        nfa.moves[s] = [(a, a, t) for a, t in moves[s]]
        nfa.empty[s] = list(empty[s]) + ([len(moves)] if s in accepting else [])
    dfa = determinize(nfa, start, len(moves))
    return dfa.table[:, :symbols].tolist(), dfa.accepting.tolist()


def best_gamma_by_library(alpha, c, v):
    return max(range(1, len(v) - 1), key=lambda g: ll.speculative.speedup(alpha, g, c, v[g + 1]))


SHORT_CUTS = {
    "check_softmax": lambda logits, t: ll.softmax(logits, t),
    "check_gumbel_max": lambda logits, generator: ll.gumbel_max(logits, generator=generator),
    "check_top_k": lambda logits, k: ll.sampling.truncation.top_k(logits, k),
    "check_top_p": lambda logits, p: ll.sampling.truncation.top_p(logits, p),
    "check_frequency_penalty": lambda logits, prev, penalty: ll.sampling.penalties.frequency_penalty(logits, prev, penalty),
    "check_stop_position": lambda pieces, stops: find_stop("".join(pieces), stops),
    "check_tree_mask": lambda parents: ll.tree_attention_mask(parents),
    "check_tree_positions": lambda parents, offset: ll.tree_position_ids(parents, offset),
    "check_verify": lambda d, q, p, generator: ll.speculative.verify(d[None], q[None], p[None], generator),
    "check_expected_tokens": lambda alpha, gamma: ll.speculative.expected_tokens(alpha, gamma),
    "check_match_probability": lambda p: ll.speculative.typical.match_probability(p),
    "check_typical_accept": lambda d, p, eps, delta: ll.speculative.typical.typical_accept(d[None], p[None], eps, delta)[0],
    "check_training_layout": lambda length, starts, k: training_layout(length, starts, k),
    "check_single_call_layout": lambda drafts, groups: single_call_layout(drafts, groups),
    "check_keep_best": lambda scores, parents, budget: ll.speculative.eagle.rerank(
        torch.arange(len(scores))[None], torch.tensor([scores]), torch.tensor([parents]), budget),
    "check_after_rejection": lambda r, token, q: after_rejection(r, token, q),
    "check_allowed_tokens": lambda table, vocab, state: build_index(ByteDFA(torch.tensor(table), torch.ones(len(table), dtype=torch.bool)), vocab),
    "check_fewest_tokens": lambda moves, accepting: fewest_tokens(
        torch.tensor(accepting), *torch.tensor([[s, t] for s, ts in enumerate(moves) for t in ts] or [[0, 0]]).T),
    "check_utf8_ranges": lambda lo, hi: utf8_ranges(lo, hi),
    "check_subset_construction": subsets_by_library,
    "check_best_gamma": best_gamma_by_library,
    "check_truncation_distance": lambda logits, kept: ll.tv_distance(torch.softmax(logits, -1), torch.softmax(kept, -1)),
}


@pytest.mark.parametrize("check", sorted(SHORT_CUTS))
def test_an_answer_that_calls_the_library_fails_and_says_why(check):
    with pytest.raises(checks.CheckFailed, match="your function ran the library's own code \\(ll\\..*asks for your own implementation"):
        getattr(checks, check)(SHORT_CUTS[check])


def test_the_library_is_out_of_reach_through_other_functions_and_except_clauses():
    # top_k reached through process_logits, which applies it
    def through_process_logits(logits, k):
        return ll.sampling.pipeline.process_logits(logits, ll.SamplingConfig(top_k=k))

    with pytest.raises(checks.CheckFailed, match=r"own code \(ll\.sampling\."):
        checks.check_top_k(through_process_logits)

    def swallowing(logits, t):  # a broad except clause does not hide the call
        try:
            return ll.softmax(logits, t)
        except Exception:
            return torch.softmax(logits, -1)

    with pytest.raises(checks.CheckFailed, match=r"own code \(ll\.probs\.softmax\)"):
        checks.check_softmax(swallowing)


def test_the_library_is_traced_under_any_name():
    """The library's code is seen when it runs, however it was reached: another function that
    gives the same answer, a copy of the asked-for function's code made before the check, a
    function defined with the library's code object."""
    import types

    with pytest.raises(checks.CheckFailed, match=r"own code \(ll\.probs\.log_softmax\)"):
        checks.check_softmax(lambda logits, t: ll.log_softmax(logits, t).exp())
    copy = types.FunctionType(ll.softmax.__code__, ll.softmax.__globals__, "mine", ll.softmax.__defaults__)
    with pytest.raises(checks.CheckFailed, match=r"own code \(ll\.probs\.softmax\)"):
        checks.check_softmax(copy)
    renamed = types.FunctionType(ll.softmax.__code__.replace(co_name="mine"), {"__name__": "__main__", **ll.probs.__dict__})
    with pytest.raises(checks.CheckFailed, match="own code"):  # its helpers are the library's
        checks.check_softmax(renamed)


def test_an_exercise_may_allow_a_library_function():
    """Chapter 12's z-score exercise gives ``green_mask``: an answer that uses it passes, and one
    that calls the detector it asks for does not."""
    from logitlab.watermark.green_list import detect, green_mask

    def z_score(tokens, vocab_size, gamma, key):
        pairs = list(dict.fromkeys(zip(tokens, tokens[1:])))
        green = sum(bool(green_mask(p, vocab_size, gamma, key)[t]) for p, t in pairs)
        n = len(pairs)
        return (green - gamma * n) / (n * gamma * (1 - gamma)) ** 0.5

    checks.check_green_z_score(z_score)
    with pytest.raises(checks.CheckFailed, match="own code"):
        checks.check_green_z_score(lambda tokens, v, gamma, key: detect(tokens, v, gamma, key).z)


def test_the_library_works_again_after_a_check(capsys):
    with pytest.raises(checks.CheckFailed):
        checks.check_softmax(lambda logits, t: ll.softmax(logits, t))
    assert torch.allclose(ll.softmax(torch.tensor([0.0, 0.0])), torch.tensor([0.5, 0.5]))
    # an answer of its own passes; one that uses the library for a part the exercise does not give fails
    checks.check_truncation_distance(lambda logits, kept: 0.5 * (torch.softmax(logits, -1) - torch.softmax(kept, -1)).abs().sum(-1))
    assert "passed" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed, match=r"own code \(ll\.probs\.softmax\)"):
        checks.check_truncation_distance(lambda logits, kept: 0.5 * (ll.softmax(logits) - ll.softmax(kept)).abs().sum(-1))
    assert ll.tv_distance(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])).item() == 1.0
