"""The keyed samplers (logitlab.watermark.gumbel, .synthid): each is the model's distribution
over random keys (a chi-square test, with a biased variant as the control the test must reject),
and each detector's false-positive rate and power on a small model."""

import itertools
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
    """A text from a bigram model over 50 tokens; ``pick(context, probs)`` chooses each token at a
    context new to the text, the generator at one seen before (as the keyed processors do)."""
    table = torch.softmax(torch.randn(50, 50, generator=torch.Generator().manual_seed(5)) * 1.5, dim=-1)
    text = [0]
    for _ in range(length):
        context, probs = tuple(text[-4:]), table[text[-1]]
        seen = gumbel.seen_before(text, 4)
        text.append(int(torch.multinomial(probs, 1, generator=generator)) if seen else pick(context, probs))
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


def test_each_context_is_scored_at_its_first_occurrence():
    # width 1, prompt [7, 5]: 5 after (5,) (new), 6 after (5,) (seen), 5 after (6,) (new), 6 after
    # (5,) (seen); the prompt's own contexts count as seen: 8 after (7,) is not scored.
    assert gumbel.scored_pairs([5, 6, 5, 6], 10, 1, prompt=[7, 5]) == [((5,), 5), ((6,), 5)]
    assert gumbel.scored_pairs([8], 10, 1, prompt=[7, 5, 7]) == []
    assert gumbel.scored_pairs([1, 2, 3], 10, 2) == [((), 1), ((1,), 2), ((1, 2), 3)]
    found = gumbel.detect([5, 6, 5, 6], 10, context_width=1, prompt=[7, 5])
    assert found.scored == 2
    u = [float(gumbel.keyed_uniforms(c, 10)[t]) for c, t in [((5,), 5), ((6,), 5)]]
    assert found.score == pytest.approx(sum(-math.log(1 - x) for x in u))
    assert synthid.detect([5, 6, 5, 6], 10, layers=4, context_width=1, prompt=[7, 5]).scored == 2


def test_seen_before_asks_whether_the_context_came_before():
    assert not gumbel.seen_before([1, 2, 3], 2)  # contexts (), (1,), (1, 2); now (2, 3)
    assert gumbel.seen_before([1, 2, 1, 2], 2)  # (1, 2) was the context of the third token
    assert not gumbel.seen_before([1, 2, 1, 2], 3)  # (2, 1, 2) is new
    assert gumbel.seen_before([-1, -1, 4, 4], 1)  # padding left out: (4,) came before the last 4
    assert not gumbel.seen_before([], 4) and not gumbel.seen_before([3], 1)


# Repeated contexts: a one-token window over a four-token bigram model, after the prompt [1, 0],
# repeats at most positions of a 3-token text. Each text comes from its own key; the processor
# must fall back to the sampler's own draw at a seen context, or a token copies the earlier one.
BIGRAM = torch.softmax(torch.randn(4, 4, generator=torch.Generator().manual_seed(2)) * 0.6, dim=-1)
REPEAT_KEYS = range(1, 8_001)


def bigram_texts(processor) -> list[tuple[int, ...]]:
    texts = []
    for key in REPEAT_KEYS:
        mark, ids, generator = processor(key), [1, 0], torch.Generator().manual_seed(key)
        for _ in range(3):
            out = mark(torch.tensor([ids]), BIGRAM[ids[-1]].log()[None])
            ids.append(int(torch.multinomial(torch.softmax(out[0], dim=-1), 1, generator=generator)))
        texts.append(tuple(ids[2:]))
    return texts


def bigram_pvalue(texts) -> float:
    sequences = list(itertools.product(range(4), repeat=3))
    exact = [math.prod(float(BIGRAM[a, b]) for a, b in zip((0,) + seq, seq)) for seq in sequences]
    counts = [texts.count(seq) for seq in sequences]
    return float(chisquare(counts, [len(texts) * p for p in exact]).pvalue)


PROCESSORS = {"gumbel": lambda key: gumbel.GumbelWatermark(4, key=key, context_width=1),
              "tournament": lambda key: synthid.TournamentWatermark(4, key=key, layers=10, context_width=1)}


@pytest.mark.statistical
@pytest.mark.parametrize("scheme", PROCESSORS)
def test_text_with_repeated_contexts_follows_the_model_over_keys(scheme):
    assert bigram_pvalue(bigram_texts(PROCESSORS[scheme])) > 1e-3


@pytest.mark.parametrize("scheme", PROCESSORS)
def test_reusing_a_repeated_contexts_draw_is_caught(scheme, monkeypatch):
    # Without the fallback a seen context's uniforms choose again: the text copies its earlier token.
    monkeypatch.setattr(gumbel, "seen_before", lambda ids, width: False)
    monkeypatch.setattr(synthid, "seen_before", lambda ids, width: False)
    assert bigram_pvalue(bigram_texts(PROCESSORS[scheme])) < 1e-6


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
