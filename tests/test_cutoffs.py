"""Epsilon, eta, top-H and top-nσ (chapter 2): logitlab.sampling.cutoffs, with Hugging Face's warpers as
the oracle where it has the rule, and exact small cases worked from the definitions."""

import math

import pytest
import torch
from test_processors import HALF, RANDOM, hf, random_logits
from transformers import EpsilonLogitsWarper, EtaLogitsWarper

from logitlab.sampling.cutoffs import (EpsilonCut, EtaCut, TopH, TopNSigma, epsilon_cut, eta_cut, top_h, top_n_sigma)

try:
    from transformers import TopHLogitsWarper
except ImportError:  # transformers before 4.57 (the lower bound's 4.56 among them) has no top-H
    TopHLogitsWarper = None
needs_top_h = pytest.mark.skipif(TopHLogitsWarper is None, reason="this transformers has no TopHLogitsWarper")

INF = float("inf")
RULES = [(epsilon_cut, (0.01,)), (eta_cut, (0.01,)), (top_h, (0.5,)), (top_n_sigma, (1.0,))]


@pytest.mark.parametrize("seed, batch, vocab, scale", RANDOM)
def test_epsilon_and_eta_are_hugging_faces(seed, batch, vocab, scale):
    logits = random_logits(seed, batch, vocab, scale)
    for epsilon in [1e-5, 3e-4, 0.01, 0.2, 0.9]:
        for m in [1, 3]:
            theirs = hf(EpsilonLogitsWarper(epsilon, min_tokens_to_keep=m), logits)
            assert torch.equal(epsilon_cut(logits, epsilon, m), theirs)
            assert torch.equal(eta_cut(logits, epsilon, m), hf(EtaLogitsWarper(epsilon, min_tokens_to_keep=m), logits))


@needs_top_h
@pytest.mark.parametrize("seed, batch, vocab, scale", RANDOM)
def test_top_h_is_hugging_faces(seed, batch, vocab, scale):
    logits = random_logits(seed, batch, vocab, scale)
    for h in [0.05, 0.3, 0.5, 0.9, 1.0]:
        assert torch.equal(top_h(logits, h), hf(TopHLogitsWarper(h), logits))


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_is_hugging_faces(dtype):
    logits = random_logits(0, 4, 3000, 3.0, dtype)
    assert torch.equal(epsilon_cut(logits, 1e-3), hf(EpsilonLogitsWarper(1e-3), logits))
    assert torch.equal(eta_cut(logits, 1e-3), hf(EtaLogitsWarper(1e-3), logits))


@needs_top_h
@pytest.mark.parametrize("dtype", HALF)
def test_top_h_half_precision_is_hugging_faces(dtype):
    logits = random_logits(0, 4, 3000, 3.0, dtype)
    assert torch.equal(top_h(logits, 0.4), hf(TopHLogitsWarper(0.4), logits))


def test_epsilon_and_eta_by_hand():
    # p = (0.5, 0.3, 0.15, 0.05): H = 1.1422 nats, so eta = min(0.2, sqrt(0.2) e^-H) = 0.1427.
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    entropy = -(p * p.log()).sum().item()
    assert entropy == pytest.approx(1.1422, abs=1e-4)
    assert math.sqrt(0.2) * math.exp(-entropy) == pytest.approx(0.1427, abs=1e-4)
    kept = lambda out: torch.isfinite(out).tolist()  # noqa: E731
    assert kept(epsilon_cut(p.log(), 0.2)) == [True, True, False, False]  # 0.15 < 0.2
    assert kept(eta_cut(p.log(), 0.2)) == [True, True, True, False]  # 0.15 >= 0.1427: eta keeps it
    assert kept(eta_cut(p.log(), 0.01)) == [True, True, True, True]  # eta = 0.01 here
    # Nothing clears the bar: the min_tokens_to_keep most likely stay, and ties with the last.
    assert kept(epsilon_cut(p.log(), 0.9)) == [True, False, False, False]
    assert kept(epsilon_cut(p.log(), 0.9, min_tokens_to_keep=2)) == [True, True, False, False]
    tied = torch.tensor([0.4, 0.2, 0.2, 0.2]).log()
    assert kept(epsilon_cut(tied, 0.9, min_tokens_to_keep=2)) == [True, True, True, True]
    # A kept token keeps its logit, bit for bit.
    out = eta_cut(p.log(), 0.2)
    assert torch.equal(out[:3], p.log()[:3]) and out[3] == -INF


def test_top_h_by_hand():
    # Terms -p log p of (0.5, 0.3, 0.15, 0.05): 0.3466, 0.3612, 0.2846, 0.1498; H = 1.1422.
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = lambda h: torch.isfinite(top_h(p.log(), h))[0].tolist()  # noqa: E731
    assert kept(0.2) == [True, False, False, False]  # even 0.3466 > 0.228: the top token stays anyway
    assert kept(0.5) == [True, False, False, False]  # 0.3466 <= 0.571 < 0.7078
    assert kept(0.7) == [True, True, False, False]  # 0.7078 <= 0.7995 < 0.9924
    assert kept(0.95) == [True, True, True, False]  # 0.9924 <= 1.0851 < 1.1422


def test_top_h_looks_at_the_hundred_most_likely_tokens_only():
    # 101 equally likely tokens: only 100 are candidates, so at h = 1 one is removed.
    out = top_h(torch.zeros(1, 101), 1.0)
    assert torch.isfinite(out).sum() == 100


def test_top_n_sigma_by_hand():
    # Logits (4, 3, 1, 0): mean 2, population sigma sqrt(2.5) = 1.581.
    logits = torch.tensor([4.0, 3.0, 1.0, 0.0])
    kept = lambda x, n: torch.isfinite(top_n_sigma(x, n)).tolist()  # noqa: E731
    assert kept(logits, 0.0) == [True, False, False, False]
    assert kept(logits, 0.6) == [True, False, False, False]  # bar 3.05: just above 3
    assert kept(logits, 0.7) == [True, True, False, False]  # bar 2.89
    assert kept(logits, 1.0) == [True, True, False, False]  # bar 2.42
    assert kept(logits, 1.9) == [True, True, True, False]  # bar 0.996
    assert kept(logits, 2.6) == [True, True, True, True]  # bar -0.11
    # Already removed tokens do not count in the statistics.
    assert kept(torch.tensor([4.0, 3.0, 1.0, 0.0, -INF]), 1.0) == [True, True, False, False, False]
    # Ties with the largest logit survive n = 0.
    assert kept(torch.tensor([2.0, 2.0, 1.0]), 0.0) == [True, True, False]


def test_top_n_sigma_bar_is_max_minus_n_population_sigma():
    logits = random_logits(3, 5, 1000, 2.0)
    for n in [0.5, 1.0, 2.0]:
        out = top_n_sigma(logits, n)
        for row, row_out in zip(logits, out):
            finite = row[torch.isfinite(row)].double()
            bar = finite.max() - n * finite.std(unbiased=False)
            decided = (row.double() - bar).abs() > 1e-5  # away from the bar, float rounding cannot matter
            assert torch.equal(torch.isfinite(row_out)[decided], (row.double() >= bar)[decided])


@pytest.mark.parametrize("temperature", [0.25, 0.7, 2.0, 8.0])
def test_top_n_sigma_does_not_depend_on_the_temperature(temperature):
    logits = torch.tensor([[4.0, 3.0, 1.0, 0.0, -2.0], [0.5, 0.25, 0.0, -0.25, -4.0]])
    for n in [0.5, 1.0, 1.5]:
        assert torch.equal(torch.isfinite(top_n_sigma(logits / temperature, n)), torch.isfinite(top_n_sigma(logits, n)))


@pytest.mark.parametrize("rule, args", RULES)
def test_any_leading_dims_and_inputs_untouched(rule, args):
    logits = random_logits(5, 6, 50, 2.0)
    before = logits.clone()
    flat = rule(logits, *args)
    assert torch.equal(logits, before)
    assert torch.equal(rule(logits.reshape(2, 3, 50), *args), flat.reshape(2, 3, 50))
    assert torch.equal(rule(logits[0], *args), flat[0])


@pytest.mark.parametrize("make, rule, args", [(EpsilonCut, epsilon_cut, (0.01,)), (EtaCut, eta_cut, (0.01,)),
                                              (TopH, top_h, (0.5,)), (TopNSigma, top_n_sigma, (1.0,))])
def test_classes_are_the_functions(make, rule, args):
    logits = random_logits(7, 3, 200, 2.0)
    processor = make(*args)
    assert torch.equal(processor(torch.zeros(3, 1, dtype=torch.long), logits), rule(logits, *args))
    assert repr(processor).startswith(make.__name__ + "(")


@pytest.mark.parametrize("rule, args, name", [
    (epsilon_cut, (0.0,), "epsilon"), (epsilon_cut, (1.0,), "epsilon"), (epsilon_cut, (float("nan"),), "epsilon"),
    (epsilon_cut, (True,), "epsilon"), (epsilon_cut, (0.1, 0), "min_tokens_to_keep"), (eta_cut, (-0.1,), "epsilon"),
    (eta_cut, (0.1, 1.5), "min_tokens_to_keep"), (top_h, (0.0,), "h"), (top_h, (1.5,), "h"),
    (top_n_sigma, (-1.0,), "n"), (top_n_sigma, (INF,), "n"), (top_n_sigma, ("1",), "n"),
    (EpsilonCut, (2.0,), "epsilon"), (EtaCut, (0.0,), "epsilon"), (TopH, (-1,), "h"), (TopNSigma, (-0.5,), "n"),
])
def test_bad_arguments_raise(rule, args, name):
    logits = torch.zeros(2, 5)
    with pytest.raises(ValueError, match=name):
        rule(*args) if isinstance(rule, type) else rule(logits, *args)


@pytest.mark.parametrize("rule, args", RULES)
def test_bad_logits_raise(rule, args):
    with pytest.raises(ValueError, match="logits"):
        rule(torch.tensor([[0.0, float("nan")]]), *args)
    with pytest.raises(ValueError, match="logits"):
        rule(torch.tensor([[1, 2]]), *args)


@needs_top_h
def test_sampling_config_applies_them_in_hugging_faces_order():
    # Temperature, top-H, top-k, top-p, epsilon, eta: Hugging Face's own chain as the oracle.
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    import logitlab as ll
    from logitlab.sampling.pipeline import process_logits

    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(6, 500, generator=gen)
    context = torch.zeros(6, 1, dtype=torch.long)
    for t, h, k, p, eps, eta in [(0.7, 0.5, None, None, None, None), (1.3, None, 50, 0.9, 1e-3, None),
                                  (1.0, 0.8, 20, None, None, 3e-3), (0.5, 0.9, None, 0.95, 1e-4, 1e-3)]:
        chain = [TemperatureLogitsWarper(t)] + ([TopHLogitsWarper(h)] if h else [])
        chain += ([TopKLogitsWarper(k)] if k else []) + ([TopPLogitsWarper(p)] if p else [])
        chain += ([EpsilonLogitsWarper(eps)] if eps else []) + ([EtaLogitsWarper(eta)] if eta else [])
        expected = LogitsProcessorList(chain)(context, logits.clone())
        config = ll.SamplingConfig(temperature=t, top_h=h, top_k=k, top_p=p, epsilon_cutoff=eps, eta_cutoff=eta)
        got = process_logits(logits, config)
        assert torch.equal(got.isneginf(), expected.isneginf())
        assert torch.allclose(got[~got.isneginf()], expected[~expected.isneginf()])


def test_top_n_sigma_runs_on_the_whole_vocabulary_before_top_k():
    import logitlab as ll
    from logitlab.sampling.truncation import top_k
    from logitlab.sampling.pipeline import process_logits

    logits = random_logits(11, 4, 300, 2.0)
    config = ll.SamplingConfig(temperature=0.8, top_n_sigma=1.0, top_k=5)
    expected = top_k(top_n_sigma(logits / 0.8, 1.0), 5)  # top-k on the survivors first would keep fewer
    assert torch.equal(process_logits(logits, config).isneginf(), expected.isneginf())


def test_generate_takes_them_and_samples_only_kept_tokens():
    # A tiny bigram model: every sampled token must be one the rules keep at its step.
    import logitlab as ll
    from logitlab.sampling.pipeline import process_logits

    model = ll.toy_bigram(vocab_size=12, seed=3)
    kwargs = dict(top_h=0.6, top_n_sigma=1.5, epsilon_cutoff=0.01, eta_cutoff=0.02)
    out = ll.generate(model, [[1]], max_new_tokens=30, temperature=1.2, eos_token_id=[], num_return_sequences=20,
                      generator=ll.generator(model, 0), **kwargs)
    config = ll.SamplingConfig(temperature=1.2, **kwargs)
    for tokens in out.new_tokens:
        previous = 1
        for token in tokens.tolist():
            logits = model(torch.tensor([[previous]])).logits[0, -1]
            assert torch.isfinite(process_logits(logits[None], config)[0, token])
            previous = token
    with pytest.raises(ValueError, match="top_h"):
        ll.generate(model, [[1]], max_new_tokens=3, top_h=0.0)
    with pytest.raises(ValueError, match="epsilon_cutoff"):
        ll.SamplingConfig(epsilon_cutoff=1.0)
    with pytest.raises(ValueError, match="top_n_sigma"):
        ll.SamplingConfig(top_n_sigma=-1)
