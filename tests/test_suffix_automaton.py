"""The suffix automaton and its drafter (logitlab.speculative.suffix_automaton): every answer against a
brute-force search on random sequences, the size bounds that make it linear, and the drafter exact
through the speculative loop (greedy equality, and a chi-square test of sampled outputs)."""

import random

import pytest
import torch

import logitlab as ll
from logitlab.speculative.suffix_automaton import SEPARATOR, SuffixAutomaton, SuffixDrafter

from test_speculative import P_MIN, chi_square_pvalue, exact_sequence_probs, tiny_llama


def longest_earlier_suffix(s):
    """Brute force: the longest suffix of s that also ends before its last position, and where
    its first occurrence ends."""
    n = len(s)
    for length in range(n - 1, 0, -1):
        for i in range(n - length):
            if s[i:i + length] == s[n - length:]:
                return length, i + length - 1
    return 0, -1


def substrings(s):
    return {tuple(s[i:j]) for i in range(len(s)) for j in range(i + 1, len(s) + 1)}


@pytest.mark.parametrize("seed", range(20))
def test_the_automaton_answers_as_a_brute_force_search(seed):
    rng = random.Random(seed)
    alphabet = rng.choice([2, 3, 5])
    s = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 40))]
    automaton = SuffixAutomaton()
    for n, token in enumerate(s, 1):
        automaton.extend(token)
        assert automaton.longest_repeat() == longest_earlier_suffix(s[:n])
    every = substrings(s)
    assert all(automaton.accepts(sub) for sub in every)
    for _ in range(50):  # and nothing else
        probe = tuple(rng.randrange(alphabet) for _ in range(rng.randrange(1, 8)))
        assert automaton.accepts(probe) == (probe in every)
    # at most 2n - 1 states and 3n - 4 transitions (n >= 3): the automaton is linear in the text
    assert len(automaton) <= max(2 * len(s) - 1, 2)
    assert sum(len(t) for t in automaton.next) <= max(3 * len(s) - 4, len(s))


def test_a_worked_example():
    automaton = SuffixAutomaton([1, 2, 3, 1, 2])
    assert automaton.longest_repeat() == (2, 1)  # "1 2" ended at position 1 before; 3 followed it
    assert automaton.continuation(automaton.link[automaton.last], 2) == [3, 1]
    assert automaton.accepts([3, 1, 2]) and not automaton.accepts([2, 1])
    assert SuffixAutomaton().longest_repeat() == (0, -1)
    assert SuffixAutomaton([7]).longest_repeat() == (0, -1)


@pytest.mark.parametrize("seed", range(10))
def test_following_another_text_finds_its_longest_suffix_in_the_corpus(seed):
    rng = random.Random(seed)
    corpus = [rng.randrange(3) for _ in range(30)]
    automaton = SuffixAutomaton(corpus)
    text = [rng.randrange(3) for _ in range(30)]
    inside = substrings(corpus)
    state, length = 0, 0
    for n, token in enumerate(text, 1):
        state, length = automaton.follow(state, length, token)
        expected = next((k for k in range(n, 0, -1) if tuple(text[n - k:n]) in inside), 0)
        assert length == expected
        if length:  # the state's strings end where its first occurrence does
            end = automaton.first_end[state]
            assert corpus[end - length + 1:end + 1] == text[n - length:n]


def drafts_after(drafter, prompt, next_token, gamma=4):
    ids = torch.tensor([prompt])
    drafter.start(ids, torch.ones_like(ids))
    tokens, q = drafter.propose(torch.tensor([next_token]), gamma, ll.SamplingConfig())
    assert torch.equal(q.argmax(-1), tokens) and torch.equal(q.sum(-1), torch.ones(tokens.shape))  # one-hot
    return tokens[0].tolist()


def test_the_drafter_copies_what_followed_the_longest_earlier_match():
    # "5 6 7" occurred before (followed by 8 9), "7" alone also (followed by 1): the longest wins
    assert drafts_after(SuffixDrafter(10), [7, 1, 5, 6, 7, 8, 9, 2, 5, 6], 7) == [8, 9, 2, 5]
    assert drafts_after(SuffixDrafter(10), [1, 2, 3], 4) == []  # nothing occurred before
    assert drafts_after(SuffixDrafter(10, min_match=2), [4, 2, 3, 1, 3], 4) == []  # only "4" occurred before
    # the corpus gives the draft when its match is longer
    corpus = [[0, 5, 6, 7, 3, 3, 3], [9, 9]]
    assert drafts_after(SuffixDrafter(10, corpus=corpus), [7, 1, 5, 6], 7) == [3, 3, 3]  # stops at the text's end
    # "9 9" is in the corpus but ends its text: the shorter match in the row's own text drafts
    assert drafts_after(SuffixDrafter(10, corpus=corpus), [9], 9) == [9]


def test_a_corpus_text_never_runs_into_the_next():
    drafter = SuffixDrafter(10, corpus=[[1, 2], [3, 4]])
    assert drafter.corpus.tokens == [1, 2, SEPARATOR, 3, 4, SEPARATOR]
    assert drafts_after(drafter, [0], 1) == [2]  # not 2, then 3 4 of the next text


@pytest.mark.parametrize("corpus", [None, [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8]]], ids=["own text", "corpus"])
def test_greedy_output_is_the_targets_own(corpus):
    target = tiny_llama(2, 0, vocab=10)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5, 4]]
    plain = ll.generate(target, prompts, max_new_tokens=24, eos_token_id=[], temperature=0)
    out = ll.speculative_generate(target, SuffixDrafter(10, corpus=corpus), prompts, gamma=4, max_new_tokens=24,
                                  eos_token_id=[], temperature=0)
    assert [t.tolist() for t in out.new_tokens] == [t.tolist() for t in plain.new_tokens]
    assert out.model_calls < 25  # some drafts were kept: fewer calls than tokens
    # A chain's pass takes the pending token and its drafts: what the result records as fed.
    assert out.fed == [g + 1 for g in out.drafted] and len(out.fed) == out.model_calls - 1 and max(out.drafted) > 0


@pytest.mark.statistical
def test_sampled_output_follows_the_target_exactly():
    target = ll.toy_model(vocab_size=4, order=2, seed=3)
    prompt = [1, 2, 3, 1, 2]
    rows = 20_000
    out = ll.speculative_generate(target, SuffixDrafter(4, corpus=[[2, 0, 0, 1]]), [prompt], gamma=3,
                                  max_new_tokens=3, eos_token_id=[], num_return_sequences=rows,
                                  generator=torch.Generator().manual_seed(6))
    assert chi_square_pvalue(out.new_tokens, exact_sequence_probs(target, prompt, 3, ll.SamplingConfig())) > P_MIN
    assert out.alpha > 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(vocab_size=0), "vocab_size must be an integer >= 1"),
    (dict(vocab_size=5, min_match=0), "min_match must be an integer >= 1"),
    (dict(vocab_size=5, corpus=[1, 2, 3]), "corpus must be a list of token-id lists"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SuffixDrafter(**kwargs)
