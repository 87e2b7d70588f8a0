"""Sampling: exact behaviour on small cases and statistical tests of the distributions.

Statistical tests: each draws N samples with a fixed seed and runs a chi-square goodness-of-fit
test against the exact probabilities. With a correct sampler a test fails for a fraction
ALPHA = 1e-4 of seeds (the false-positive rate); the seeds are fixed, so a run is repeatable.
``test_chi_square_catches_a_small_bias`` shows that the same test with the same N rejects a
sampler whose temperature is off by 5%, so these tests can fail when the code is wrong.
"""

import pytest
import torch
from scipy.stats import chisquare

import logitlab as ll

ALPHA = 1e-4
N = 200_000
LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, float("-inf")])


def chi_square_pvalue(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of "tokens were drawn from probs", over the tokens with nonzero probability."""
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    possible = probs > 0
    assert counts[~possible].sum() == 0, "a token of probability 0 was drawn"
    expected = probs[possible].double()
    expected = expected / expected.sum() * tokens.numel()
    return chisquare(counts[possible].numpy(), expected.numpy()).pvalue


@pytest.mark.parametrize("sampler", [ll.sample, ll.gumbel_max])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_samplers_match_softmax(sampler, temperature):
    gen = torch.Generator().manual_seed(1234)
    tokens = sampler(LOGITS.expand(N, -1), temperature=temperature, generator=gen)
    assert tokens.shape == (N,) and tokens.dtype == torch.long
    assert chi_square_pvalue(tokens, ll.softmax(LOGITS.double(), temperature)) > ALPHA


def test_chi_square_catches_a_small_bias():
    gen = torch.Generator().manual_seed(1234)
    biased = ll.sample(LOGITS.expand(N, -1), temperature=1.05, generator=gen)
    assert chi_square_pvalue(biased, ll.softmax(LOGITS.double(), 1.0)) < ALPHA


def test_each_row_uses_its_own_logits():
    logits = torch.tensor([[0.0, 0.0, float("-inf")], [float("-inf"), float("-inf"), 0.0]])
    gen = torch.Generator().manual_seed(0)
    for sampler in (ll.sample, ll.gumbel_max):
        tokens = sampler(logits.repeat(1000, 1), generator=gen).reshape(1000, 2)
        assert set(tokens[:, 0].tolist()) == {0, 1}
        assert set(tokens[:, 1].tolist()) == {2}


def test_greedy_and_temperature_zero():
    logits = torch.tensor([[0.1, 2.0, -1.0], [5.0, 0.0, 5.0]])
    assert ll.greedy(logits).tolist() == [1, 0]
    assert ll.sample(logits, temperature=0).tolist() == [1, 0]
    assert ll.gumbel_max(logits, temperature=0).tolist() == [1, 0]


def test_same_seed_same_tokens_different_seed_different_tokens():
    logits = torch.randn(64, 1000, generator=torch.Generator().manual_seed(0))
    for sampler in (ll.sample, ll.gumbel_max):
        a = sampler(logits, generator=torch.Generator().manual_seed(7))
        b = sampler(logits, generator=torch.Generator().manual_seed(7))
        c = sampler(logits, generator=torch.Generator().manual_seed(8))
        assert torch.equal(a, b)
        assert not torch.equal(a, c)


def test_shapes_follow_leading_dimensions():
    logits = torch.randn(2, 3, 10)
    assert ll.sample(logits).shape == (2, 3)
    assert ll.gumbel_max(logits).shape == (2, 3)
    assert ll.sample(torch.randn(10)).shape == ()


def test_half_precision_logits_are_sampled():
    logits = LOGITS.expand(N, -1).half()
    tokens = ll.sample(logits, generator=torch.Generator().manual_seed(3))
    assert chi_square_pvalue(tokens, ll.softmax(LOGITS.double(), 1.0)) > ALPHA


def test_bad_generator_raises():
    with pytest.raises(ValueError, match="generator"):
        ll.sample(torch.zeros(1, 3), generator=42)
    with pytest.raises(ValueError, match="generator"):
        ll.gumbel_max(torch.zeros(1, 3), generator="seed")


def test_inverse_transform_hand_cases():
    from logitlab.sampling.draw import inverse_transform

    # probabilities (0, 1/3, 0, 2/3, 0): cumulative 0, 1, 1, 3, 3
    cumulative = torch.tensor([[0.0, 1.0, 1.0, 3.0, 3.0]], dtype=torch.float64)
    for u, token in [(0.0, 1), (0.999, 1), (1.0, 3), (2.999, 3), (3.0, 3)]:
        # u == 3.0, the total, happens only by rounding; it must not pick the empty last token
        assert inverse_transform(cumulative, torch.tensor([[u]], dtype=torch.float64)).item() == token


def test_sample_never_draws_a_removed_token_at_either_end():
    logits = torch.tensor([[float("-inf"), 0.0, 1.0, float("-inf")]]).expand(20_000, -1)
    tokens = ll.sample(logits, generator=torch.Generator().manual_seed(5))
    assert set(tokens.tolist()) == {1, 2}
