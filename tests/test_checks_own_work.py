"""A check fails an answer that hands the exercise back to the library: calling the function the
exercise asks for (directly, or through another ``ll.*`` function that uses it) fails with a
message saying so, and the library works normally again once the check is over."""

import pytest
import torch

import logitlab as ll
from logitlab.course import checks
from logitlab.constrained.index import build_index, fewest_tokens
from logitlab.decoding.generate import find_stop
from logitlab.speculative.pass_embeddings import single_call_layout
from logitlab.constrained.regex import ByteNFA, determinize, utf8_ranges
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
    "check_keep_best": lambda scores, parents, budget: ll.speculative.eagle.rerank(scores, parents, budget),
    "check_after_rejection": lambda r, token, q: after_rejection(r, token, q),
    "check_allowed_tokens": lambda table, vocab, state: build_index(table, vocab)[state],
    "check_fewest_tokens": lambda moves, accepting: fewest_tokens(moves, accepting),
    "check_utf8_ranges": lambda lo, hi: utf8_ranges(lo, hi),
    "check_subset_construction": subsets_by_library,
    "check_best_gamma": best_gamma_by_library,
    "check_truncation_distance": lambda logits, kept: ll.tv_distance(torch.softmax(logits, -1), torch.softmax(kept, -1)),
}


@pytest.mark.parametrize("check", sorted(SHORT_CUTS))
def test_an_answer_that_calls_the_library_fails_and_says_why(check):
    with pytest.raises(checks.CheckFailed, match="your function called ll\\..*asks for your own implementation"):
        getattr(checks, check)(SHORT_CUTS[check])


def test_the_library_is_out_of_reach_through_other_functions_and_except_clauses():
    # top_k reached through process_logits, which applies it
    def through_process_logits(logits, k):
        return ll.sampling.pipeline.process_logits(logits, ll.SamplingConfig(top_k=k))

    with pytest.raises(checks.CheckFailed, match="called ll.sampling.truncation.top_k"):
        checks.check_top_k(through_process_logits)

    def swallowing(logits, t):  # a broad except clause does not hide the call
        try:
            return ll.softmax(logits, t)
        except Exception:
            return torch.softmax(logits, -1)

    with pytest.raises(checks.CheckFailed, match="called ll.probs.softmax"):
        checks.check_softmax(swallowing)


def test_the_library_works_again_after_a_check(capsys):
    with pytest.raises(checks.CheckFailed):
        checks.check_softmax(lambda logits, t: ll.softmax(logits, t))
    assert torch.allclose(ll.softmax(torch.tensor([0.0, 0.0])), torch.tensor([0.5, 0.5]))
    # an answer of its own passes, and may use the library for anything else
    checks.check_truncation_distance(lambda logits, kept: 0.5 * (ll.softmax(logits) - ll.softmax(kept)).abs().sum(-1))
    assert "passed" in capsys.readouterr().out
    assert ll.tv_distance(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])).item() == 1.0
