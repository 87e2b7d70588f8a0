"""The green-list watermark (logitlab.watermark.green_list): Hugging Face's processor and detector
as oracles where the hashing is the same, the detector's false-positive rate on the real model's
unwatermarked text, and its power on watermarked text."""

import math
from fractions import Fraction

import pytest
import torch
import transformers
from scipy.stats import binom
from transformers import LlamaConfig, WatermarkDetector, WatermarkingConfig, WatermarkLogitsProcessor

import logitlab as ll
from logitlab.bench.prompts import chat
from logitlab.watermark import green_list
from logitlab.watermark.green_list import KEY, GreenList, detect, green_ids


@pytest.mark.parametrize("gamma, delta, key", [(0.25, 2.0, KEY), (0.5, 1.0, 7), (0.1, 4.0, 2**40 + 3)])
def test_the_processor_equals_hugging_faces_lefthash(gamma, delta, key):
    vocab = 1000
    theirs = WatermarkLogitsProcessor(vocab, "cpu", greenlist_ratio=gamma, bias=delta, hashing_key=key)
    ours = GreenList(vocab, gamma, delta, key)
    torch.manual_seed(0)
    input_ids = torch.randint(0, vocab, (4, 6))
    scores = torch.randn(4, vocab)
    assert torch.equal(ours(input_ids, scores), theirs(input_ids, scores))
    for previous in [0, 1, 999]:
        assert torch.equal(green_ids(previous, vocab, gamma, key), theirs._get_greenlist_ids(torch.tensor([previous])))
    assert len(green_ids(5, vocab, gamma, key)) == int(vocab * gamma)


# transformers 4's detector is no oracle: it keyed its n-gram counts by tensors, which hash by
# identity, so repeated pairs were never merged (5 fixed it); `make test-lower` runs transformers 4.
@pytest.mark.skipif(int(transformers.__version__.split(".")[0]) < 5, reason="transformers 4's WatermarkDetector "
                    "counts repeated n-grams apart")
@pytest.mark.parametrize("unique", [False, True])
def test_the_z_score_equals_hugging_faces_detector(unique):
    vocab, gamma = 500, 0.25
    config = WatermarkingConfig(greenlist_ratio=gamma, bias=2.0, hashing_key=KEY, seeding_scheme="lefthash",
                                context_width=1)
    model_config = LlamaConfig(vocab_size=vocab)
    detector = WatermarkDetector(model_config, "cpu", config, ignore_repeated_ngrams=unique)
    torch.manual_seed(1)
    text = torch.randint(0, vocab, (40,))
    text = torch.cat([text, text[:10]])  # a repeated phrase: the two ways of counting differ
    text[0] = 2  # not the configuration's BOS (1), which their detector would drop
    theirs = detector(text[None], return_dict=True)
    ours = detect(text, vocab, gamma, unique_pairs=unique)
    assert ours.scored == theirs.num_tokens_scored[0] and ours.green == theirs.num_green_tokens[0]
    assert ours.z == pytest.approx(float(theirs.z_score[0]), abs=1e-9)
    # Their p-value is the normal tail of z; ours the exact binomial tail of the same count.
    assert ours.p_value == pytest.approx(binom.sf(ours.green - 1, ours.scored, gamma), rel=1e-9)


@pytest.mark.parametrize("vocab, gamma, share", [(20, 0.25, Fraction(1, 4)), (10, 0.25, Fraction(1, 5))])
def test_the_p_value_is_the_exact_binomial_tail(vocab, gamma, share):
    # Summed in exact fractions: P(G >= green) for G ~ Binomial(n, share), share = int(gamma V) / V
    # (a 10-token vocabulary has 2 green tokens at gamma = 0.25, not 2.5).
    tokens, pairs = [0], set()
    for i in range(30):  # for 20 steps a green token (where one is left), then any: no pair twice
        fresh = [t for t in range(vocab) if (tokens[-1], t) not in pairs]
        greens = [t for t in green_ids(tokens[-1], vocab, gamma).tolist() if t in fresh]
        token = (greens or fresh)[0] if i < 20 else fresh[-1]
        pairs.add((tokens[-1], token))
        tokens.append(token)
    found = detect(tokens, vocab, gamma)
    n = found.scored
    exact = sum(math.comb(n, k) * share**k * (1 - share) ** (n - k) for k in range(found.green, n + 1))
    assert n == 30 and found.green >= 12 and found.p_value == pytest.approx(float(exact), rel=1e-9)
    normal = 0.5 * math.erfc(found.z / math.sqrt(2))
    if share == Fraction(1, 4):  # at this length the normal tail is far too small
        assert found.p_value > 3 * normal


def test_a_worked_count():
    vocab, gamma = 20, 0.5
    green_after_3 = set(green_ids(3, vocab, gamma).tolist())
    red = next(t for t in range(vocab) if t not in green_after_3)
    green = next(iter(green_after_3))
    # Pairs (3, green), (green, 3), (3, red), (red, 3): after `green` and `red` colours are their own.
    tokens = [3, green, 3, red, 3]
    expected = (green in green_after_3) + (3 in set(green_ids(green, vocab, gamma).tolist())) \
        + (red in green_after_3) + (3 in set(green_ids(red, vocab, gamma).tolist()))
    found = detect(tokens, vocab, gamma)
    assert found.scored == 4 and found.green == expected
    assert found.z == pytest.approx((expected - 2) / math.sqrt(4 * 0.25))


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match=r"gamma must be a number in \(0, 1\)"):
        GreenList(10, gamma=1.0)
    with pytest.raises(ValueError, match="delta must be a finite number >= 0"):
        GreenList(10, delta=float("nan"))
    with pytest.raises(ValueError, match="key must be a positive integer"):
        GreenList(10, key=0)
    with pytest.raises(ValueError, match="scores must have vocab_size = 10 columns"):
        GreenList(10)(torch.tensor([[1]]), torch.zeros(1, 11))
    with pytest.raises(ValueError, match=r"tokens must be at least 2 token ids in \[0, 10\)"):
        detect([3], 10)
    with pytest.raises(ValueError, match=r"tokens must be at least 2 token ids in \[0, 10\)"):
        detect([3, 10], 10)
    with pytest.raises(ValueError, match="unique_pairs must be True or False"):
        detect([3, 4], 10, unique_pairs=1)


@pytest.fixture(scope="module")
def answers(smollm):
    """The real model's answers to 8 prompts, 4 samples each, 48 tokens, with and without the
    watermark (delta = 2, gamma = 0.25), at T = 1."""
    model, tokenizer = smollm
    prompts = [chat(tokenizer, q)[0].tolist() for q in ["Describe a city at night.", "Why is the sky blue?", "Give advice to a new teacher.",
                         "Write about a long train journey.", "What makes a good friend?", "Explain how bread rises.",
                         "Tell me about the ocean.", "What is a good breakfast?"]]
    common = dict(max_new_tokens=48, temperature=1.0, eos_token_id=[], num_return_sequences=4)
    plain = ll.generate(model, prompts, generator=ll.generator(model, 0), **common)
    marked = ll.generate(model, prompts, generator=ll.generator(model, 1),
                         logits_processor=[GreenList(model.config.vocab_size)], **common)
    return model.config.vocab_size, plain.new_tokens, marked.new_tokens


# One test for both sides of the detector, so that the answers (17 s) are made once: two tests
# on the same fixture ran on both of pytest-xdist's workers, each making them.
@pytest.mark.slow  # the real model's answers: statistics of our own code, not of a dependency's version
def test_watermarked_text_is_detected_and_unwatermarked_text_rarely(answers):
    vocab, plain, marked = answers
    p_values = [detect(t, vocab).p_value for t in plain]
    # At level 0.05, 32 texts give about 1.6 false alarms. Fail only when the count is so high
    # that a detector whose rate really were 0.05 would reach it less than once in 1,000 runs.
    alarms = sum(p < 0.05 for p in p_values)
    assert binom.sf(alarms - 1, len(p_values), 0.05) > 1e-3, (alarms, p_values)
    found = [detect(t, vocab) for t in marked]
    # 48 tokens with delta = 2 on a 135M model: most texts are found at z > 4 (p < 3e-5).
    assert sum(d.z > 4 for d in found) >= 0.75 * len(found), [round(d.z, 1) for d in found]
    assert all(d.green / d.scored > 0.25 for d in found)


def test_price_is_the_kl_from_the_marked_to_the_model_distribution():
    # p = (1/2, 1/2), the first token green, delta = log 3: p_delta = (3/4, 1/4), and
    # KL(p_delta || p) = 3/4 log(3/2) + 1/4 log(1/2).
    logits = torch.tensor([[0.0, 0.0], [5.0, 5.0]])
    green = torch.tensor([[True, False], [True, False]])
    expected = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert green_list.price(logits, green, math.log(3)).tolist() == pytest.approx([expected, expected], abs=1e-6)
    assert green_list.price(logits, green, 0.0).tolist() == [0.0, 0.0]
    # A removed token stays removed: the price is that of the other two, and not NaN.
    three = torch.tensor([[0.0, 0.0, float("-inf")]])
    assert float(green_list.price(three, torch.tensor([[True, False, True]]), math.log(3))) == pytest.approx(expected, abs=1e-6)
    everything_green = torch.ones(1, 3, dtype=torch.bool)
    assert float(green_list.price(torch.randn(1, 3), everything_green, 4.0)) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="green must be a boolean tensor"):
        green_list.price(logits, green.float(), 1.0)
    with pytest.raises(ValueError, match="delta"):
        green_list.price(logits, green, -1.0)
