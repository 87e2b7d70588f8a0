"""The keyed samplers (logitlab.watermark.gumbel, .synthid): each is the model's distribution
over random keys (a chi-square test, with a biased variant as the control the test must reject),
and each detector's false-positive rate and power on a small model."""

import math

import pytest
import torch
from scipy.stats import binom, chisquare

from logitlab.watermark import gumbel, synthid

PROBS = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05])
LOGITS = PROBS.log()
KEYS = range(1, 20_001)  # every token expected at least 1,000 times
CONTEXT = (3, 1, 4)


def pvalue(tokens) -> float:
    counts = torch.bincount(torch.tensor(tokens), minlength=len(PROBS)).double()
    expected = PROBS.double() / PROBS.double().sum() * len(tokens)
    return float(chisquare(counts.numpy(), expected.numpy()).pvalue)


# Each exactness test fails an exact sampler with probability 0.001 (its p-value is uniform);
# each control is a biased sampler that must be rejected at 1e-6.
@pytest.mark.statistical
def test_the_gumbel_choice_over_random_keys_is_the_models_distribution():
    chosen = [gumbel.keyed_choice(LOGITS, gumbel.keyed_uniforms(CONTEXT, 5, key)) for key in KEYS]
    assert pvalue(chosen) > 1e-3


def test_a_wrong_exponent_is_caught():
    # argmax u_i ** p_i (instead of u_i ** (1 / p_i)) favours unlikely tokens.
    chosen = [int((gumbel.keyed_uniforms(CONTEXT, 5, key).log() * PROBS).argmax()) for key in KEYS]
    assert pvalue(chosen) < 1e-6


@pytest.mark.statistical
def test_the_gumbel_choice_follows_the_temperature():
    hot = torch.softmax(LOGITS.double() / 2.0, dim=-1)
    chosen = [gumbel.keyed_choice(LOGITS, gumbel.keyed_uniforms(CONTEXT, 5, key), temperature=2.0) for key in KEYS]
    counts = torch.bincount(torch.tensor(chosen), minlength=5).double()
    assert chisquare(counts.numpy(), (hot / hot.sum() * len(chosen)).numpy()).pvalue > 1e-3


@pytest.mark.statistical
def test_the_tournament_over_random_keys_is_the_models_distribution():
    generator = torch.Generator().manual_seed(0)
    chosen = [int(torch.multinomial(synthid.tournament_probs(PROBS, synthid.g_values(CONTEXT, 5, 3, key)), 1,
                                    generator=generator)) for key in KEYS]
    assert pvalue(chosen) > 1e-3


def test_a_tournament_without_its_centring_is_caught():
    # p (1 + g) renormalised: a plausible shortcut, biased towards tokens whose g is often 1 together.
    generator = torch.Generator().manual_seed(0)
    chosen = []
    for key in KEYS:
        probs = PROBS
        for row in synthid.g_values(CONTEXT, 5, 3, key):
            probs = probs * (1 + row)
            probs = probs / probs.sum()
        chosen.append(int(torch.multinomial(probs, 1, generator=generator)))
    assert pvalue(chosen) < 1e-6


def test_one_round_is_the_two_candidate_tournament():
    # Enumerate both candidates and the tie's coin: the winner's exact distribution.
    g = torch.tensor([[1.0, 0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    probs = PROBS.double() / PROBS.double().sum()
    exact = torch.zeros(5, dtype=torch.float64)
    for a in range(5):
        for b in range(5):
            weight = float(probs[a] * probs[b])
            if g[0, a] == g[0, b]:
                exact[a] += weight / 2
                exact[b] += weight / 2
            else:
                exact[a if g[0, a] > g[0, b] else b] += weight
    assert synthid.tournament_probs(probs, g) == pytest.approx(exact, abs=1e-12)


def markov_text(generator, length, pick):
    """A text from a bigram model over 50 tokens; ``pick(context, probs)`` chooses each token."""
    table = torch.softmax(torch.randn(50, 50, generator=torch.Generator().manual_seed(5)) * 1.5, dim=-1)
    text = [0]
    for _ in range(length):
        text.append(pick(tuple(text[-4:]), table[text[-1]]))
    return text[1:]


@pytest.mark.parametrize("scheme", ["gumbel", "tournament"])
def test_false_positive_rate_and_power_on_a_small_model(scheme):
    vocab, generator = 50, torch.Generator().manual_seed(1)
    plain = lambda context, probs: int(torch.multinomial(probs, 1, generator=generator))  # noqa: E731
    if scheme == "gumbel":
        marked = lambda context, probs: gumbel.keyed_choice(probs.log(), gumbel.keyed_uniforms(context, vocab))  # noqa: E731
        found = lambda text: gumbel.detect(text, vocab).p_value  # noqa: E731
    else:
        marked = lambda context, probs: int(torch.multinomial(  # noqa: E731
            synthid.tournament_probs(probs, synthid.g_values(context, vocab, 10)), 1, generator=generator))
        found = lambda text: synthid.detect(text, vocab, layers=10).p_value  # noqa: E731
    p_plain = [found(markov_text(generator, 40, plain)) for _ in range(60)]
    alarms = sum(p < 0.05 for p in p_plain)
    # A detector whose false-positive rate really were 0.05 exceeds this count once in 1,000 runs.
    assert binom.sf(alarms - 1, len(p_plain), 0.05) > 1e-3, alarms
    p_marked = [found(markov_text(generator, 40, marked)) for _ in range(20)]
    assert sum(p < 0.05 for p in p_marked) >= 15, p_marked


def test_each_distinct_context_and_token_is_scored_once():
    # width 1, prompt [5]: 5 after (5,), 6 after (5,), 5 after (6,), then 6 after (5,) again
    assert gumbel.scored_pairs([5, 6, 5, 6], 10, 1, prompt=[5]) == [((5,), 5), ((5,), 6), ((6,), 5)]
    assert gumbel.scored_pairs([1, 2, 3], 10, 2) == [((), 1), ((1,), 2), ((1, 2), 3)]
    found = gumbel.detect([5, 6, 5, 6], 10, context_width=1, prompt=[5])
    assert found.scored == 3
    u = [float(gumbel.keyed_uniforms(c, 10)[t]) for c, t in [((5,), 5), ((5,), 6), ((6,), 5)]]
    assert found.score == pytest.approx(sum(-math.log(1 - x) for x in u))
    assert synthid.detect([5, 6, 5, 6], 10, layers=4, context_width=1, prompt=[5]).scored == 3


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match=r"tokens must be at least 1 token id in \[0, 10\)"):
        gumbel.detect([], 10)
    with pytest.raises(ValueError, match=r"tokens must be at least 1 token id in \[0, 10\)"):
        synthid.detect([3, 10], 10)
    with pytest.raises(ValueError, match="context_width must be an integer >= 1"):
        gumbel.detect([3], 10, context_width=0)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        gumbel.GumbelWatermark(10, temperature=0)
    with pytest.raises(ValueError, match="layers must be an integer >= 1"):
        synthid.TournamentWatermark(10, layers=0)
    with pytest.raises(ValueError, match="scores must have vocab_size = 10 columns"):
        synthid.TournamentWatermark(10)(torch.tensor([[1]]), torch.zeros(1, 9))


def test_the_processors_hand_the_sampler_their_choice():
    scores, ids = torch.randn(2, 10), torch.tensor([[1, 2, 3], [4, 5, 6]])
    out = gumbel.GumbelWatermark(10, context_width=2)(ids, scores)
    for row in range(2):  # one finite entry: the keyed choice after the row's last two tokens
        choice = gumbel.keyed_choice(scores[row], gumbel.keyed_uniforms(ids[row, -2:].tolist(), 10))
        assert torch.isfinite(out[row]).nonzero().flatten().tolist() == [choice]
    tournament = synthid.TournamentWatermark(10, layers=3, context_width=2)(ids, scores)
    expected = synthid.tournament_probs(torch.softmax(scores[0], -1), synthid.g_values([2, 3], 10, 3))
    assert torch.softmax(tournament[0], -1) == pytest.approx(expected, abs=1e-6)


def test_the_tournament_equals_hugging_faces_synthid_rounds():
    # Hugging Face's SynthID-Text processor hashes contexts its own way, but its tournament, given
    # the g-values, is the same closed form: fed the same bits, the two agree to float rounding.
    from transformers import SynthIDTextWatermarkLogitsProcessor

    hf = SynthIDTextWatermarkLogitsProcessor(ngram_len=5, keys=list(range(1, 31)), sampling_table_size=2**16,
                                             sampling_table_seed=0, context_history_size=1024, device="cpu")
    generator = torch.Generator().manual_seed(0)
    scores = 3 * torch.randn(4, 50, generator=generator)
    g = (torch.rand(4, 30, 50, generator=generator) < 0.5).float()  # [batch, rounds, V]
    theirs = hf.update_scores(scores, g.transpose(1, 2))
    ours = torch.stack([synthid.tournament_probs(torch.softmax(s, dim=-1), rows) for s, rows in zip(scores, g)])
    # Probabilities compared (Hugging Face writes log 0 as the float minimum; 30 rounds over 50
    # tokens leave many at 0), relatively, down to 1e-30.
    assert torch.allclose(ours, theirs.exp(), rtol=1e-4, atol=1e-30)
    assert (ours == 0).any() and (ours > 0.5).any()
