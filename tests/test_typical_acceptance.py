"""Typical acceptance (Medusa's rule): the criterion by hand, against a plain loop, greedy at
temperature 0, and its (inexactness) on the toy model."""

import math

import pytest
import torch

import logitlab as ll
from logitlab.speculative.draft_model import DraftModelDrafter
from logitlab.speculative.loop import speculative_generate
from logitlab.measure.exactness import output_counts, output_distance, output_pvalue
from logitlab.speculative.typical import TypicalAcceptance, typical_accept, typical_threshold

SURE = [0.97, 0.01, 0.01, 0.01]  # low entropy: the bar is epsilon
FLAT = [0.25, 0.25, 0.25, 0.25]  # entropy log 4: the bar is delta / 4 = 0.075
SPLIT = [0.5, 0.45, 0.05, 0.0]


def test_threshold_by_hand():
    p = torch.tensor([SURE, FLAT, SPLIT])
    h_sure = -(0.97 * math.log(0.97) + 3 * 0.01 * math.log(0.01))
    expected = [min(0.09, 0.3 * math.exp(-h_sure)), 0.3 / 4, 0.09]
    torch.testing.assert_close(typical_threshold(p, 0.09, 0.3), torch.tensor(expected, dtype=torch.float64))
    # Twelve equally likely tokens: each has 1/12 = 0.083 < epsilon, but the bar falls to 0.3/12.
    assert typical_threshold(torch.full((12,), 1 / 12), 0.09, 0.3).item() == pytest.approx(0.025)


def test_typical_accept_keeps_the_prefix_that_passes():
    p = torch.tensor([[SURE, FLAT, FLAT],  # row 0: 0.97 passes, 0.25 passes (bonus position ignored)
                      [SURE, FLAT, FLAT],  # row 1: 0.01 fails at once
                      [SPLIT, SURE, FLAT]])  # row 2: 0.45 passes, then 0.01 fails
    drafts = torch.tensor([[0, 1], [1, 0], [1, 1]])
    assert typical_accept(drafts, p, 0.09, 0.3).tolist() == [2, 0, 1]
    assert typical_accept(drafts, p[:, :2], 0.09, 0.3).tolist() == [2, 0, 1]  # without the bonus position
    # 0.05 is under epsilon = 0.09 but over 0.04: the bar moves with epsilon.
    assert typical_accept(torch.tensor([[2]]), torch.tensor([[SPLIT]]), 0.09, 0.3).item() == 0
    assert typical_accept(torch.tensor([[2]]), torch.tensor([[SPLIT]]), 0.04, 0.3).item() == 1


def test_typical_accept_matches_a_plain_loop_on_random_cases():
    gen = torch.Generator().manual_seed(0)
    for epsilon, delta in [(0.09, 0.3), (0.3, 0.5), (0.01, 0.1)]:
        p = torch.distributions.Dirichlet(torch.full((6,), 0.3)).sample((50, 5))
        drafts = torch.randint(0, 6, (50, 4), generator=gen)
        expected = []
        for b in range(50):
            n = 0
            for i, d in enumerate(drafts[b].tolist()):
                probs = p[b, i].double()
                h = -sum(x * math.log(x) for x in probs.tolist() if x > 0)
                if probs[d].item() > min(epsilon, delta * math.exp(-h)):
                    n += 1
                else:
                    break
            expected.append(n)
        assert typical_accept(drafts, p, epsilon, delta).tolist() == expected


@pytest.mark.parametrize("next_token", ["argmax", "sample"])
def test_typical_acceptance_is_greedy_decoding_at_temperature_zero(next_token):
    target = ll.toy_model(vocab_size=6, order=2, seed=0)
    drafter = ll.speculative.draft_model.DraftModelDrafter(ll.toy_model(vocab_size=6, order=2, seed=1))
    prompts = [[1], [2, 3], [4, 0, 5]]
    ref = ll.generate(target, prompts, max_new_tokens=12, temperature=0, eos_token_id=[])
    out = speculative_generate(target, drafter, prompts, gamma=3, max_new_tokens=12, temperature=0, eos_token_id=[],
                               acceptance=TypicalAcceptance(next_token=next_token))
    assert [t.tolist() for t in out.new_tokens] == [t.tolist() for t in ref.new_tokens]
    assert 0 < out.alpha < 1  # some drafts were kept and some were not


def sequence_tv(target, drafter, acceptance):
    if isinstance(drafter, torch.nn.Module):
        drafter = ll.speculative.draft_model.DraftModelDrafter(drafter)
    return output_distance(target, drafter, acceptance, prompt=[1], length=3, samples=20_000, gamma=2)


@pytest.mark.statistical
def test_typical_acceptance_shifts_the_distribution_less_as_epsilon_grows():
    # With delta large the bar is epsilon itself; with next_token="sample", epsilon -> 1 accepts
    # (almost) nothing and every token is a sample of p: the rule's exact limit. Sampling noise
    # alone gives a TV of about 0.01 here (rejection sampling, exact, is the reference). Measured:
    # 0.26, 0.15 and 0.01 for epsilon = 0.09, 0.4, 0.99.
    target, drafter = ll.toy_model(vocab_size=4, order=2, seed=0), ll.toy_model(vocab_size=4, order=2, seed=1)
    noise = sequence_tv(target, drafter, ll.speculative.RejectionSampling())
    tvs = [sequence_tv(target, drafter, TypicalAcceptance(eps, 100.0, next_token="sample")) for eps in (0.09, 0.4, 0.99)]
    assert tvs[0] > tvs[1] > tvs[2] and tvs[0] > 10 * noise
    assert tvs[2] < 1.5 * noise + 0.01
    # Medusa's argmax next token has no exact limit: accepting nothing leaves greedy decoding.
    assert sequence_tv(target, drafter, TypicalAcceptance(0.99, 100.0, next_token="argmax")) > 10 * noise


@pytest.mark.parametrize("kwargs, match", [
    (dict(epsilon=0.0), "epsilon"), (dict(epsilon=1.0), "epsilon"), (dict(epsilon=True), "epsilon"),
    (dict(delta=0.0), "delta"), (dict(delta=-1), "delta"), (dict(next_token="top"), "next_token"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TypicalAcceptance(**kwargs)


def test_bad_shapes_raise():
    p = torch.tensor([[SURE, FLAT]])
    with pytest.raises(ValueError, match="draft_tokens"):
        typical_accept(torch.tensor([[0.5]]), p, 0.09, 0.3)
    with pytest.raises(ValueError, match="p must have shape"):
        typical_accept(torch.tensor([[0, 1, 2]]), p, 0.09, 0.3)
    with pytest.raises(ValueError, match="token ids"):
        typical_accept(torch.tensor([[7]]), p, 0.09, 0.3)
    with pytest.raises(ValueError, match="p"):
        typical_accept(torch.tensor([[0]]), torch.tensor([[[0.5, 0.6, 0.0, 0.0]]]), 0.09, 0.3)


@pytest.mark.statistical
def test_the_chi_square_passes_rejection_sampling_and_fails_typical_acceptance():
    # The false-positive rate of the first assertion is 1e-3 (the p-value of an exact loop is uniform).
    # A flat toy (scale 0.5), so that every continuation is expected more than 5 times.
    target, small = ll.toy_model(4, 2, seed=0, scale=0.5), ll.toy_model(4, 2, seed=1, scale=0.5)
    exact, counts = output_counts(target, DraftModelDrafter(small), None, prompt=[1], length=3)
    assert counts.sum() == 20_000 and exact.sum().item() == pytest.approx(1.0) and (exact * 20_000).min() > 5
    assert output_pvalue(target, DraftModelDrafter(small), ll.speculative.RejectionSampling(), prompt=[1]) > 1e-3
    assert output_pvalue(target, DraftModelDrafter(small), TypicalAcceptance(), prompt=[1]) < 1e-6


def test_output_distance_refuses_a_vocabulary_too_large_to_enumerate():
    big = ll.toy_model(vocab_size=50, order=2, seed=0)
    with pytest.raises(ValueError, match="vocab_size"):
        output_distance(big, ll.speculative.draft_model.DraftModelDrafter(big), TypicalAcceptance(), length=3)


def test_match_probability_is_the_collision_probability():
    p = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]])
    assert torch.allclose(ll.speculative.typical.match_probability(p), torch.tensor([0.38, 1.0]))
    with pytest.raises(ValueError, match="p"):
        ll.speculative.typical.match_probability(torch.tensor([0.5, 0.6]))


def test_a_tree_judges_each_node_by_its_own_parents_bar():
    from logitlab.sampling.pipeline import SamplingConfig
    from logitlab.speculative.tree_verify import deepest_path

    # Oracle: each child's bar computed from its own parent's row, one node at a time.
    rule, config = TypicalAcceptance(0.09, 0.3), SamplingConfig(temperature=1.0)
    parents = [-1, 0, 0, 0, 1, 1, 2, 3, 4, 6]
    gen = torch.Generator().manual_seed(0)
    differs = 0
    for _ in range(200):
        sharpness = torch.rand(len(parents), 1, generator=gen) * 6  # flat to peaked rows: bars differ
        p = torch.softmax(torch.randn(len(parents), 6, generator=gen) * sharpness, dim=-1)
        tokens = torch.randint(0, 6, (len(parents),), generator=gen)
        passes = [True] + [bool(p[a, t] > typical_threshold(p[a], 0.09, 0.3))
                           for a, t in zip(parents[1:], tokens[1:])]
        expected = deepest_path(parents, passes)
        path, after = rule.tree(parents, tokens, None, p, None, config, None)
        assert path == expected and int(after) == int(p[expected[-1]].argmax())
        differs += len(expected) > 1
    assert 20 < differs < 200  # both outcomes occur: some trees keep drafts, some keep none
