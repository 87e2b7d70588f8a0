"""XTC and Mirostat (chapter 2): exact small cases worked from their definitions (Hugging Face
has neither rule), a binomial test of XTC's coin, and Mirostat's feedback loop holding its
target surprise inside ``ll.generate``."""

import math

import pytest
import torch

import logitlab as ll
from logitlab.sampling.adaptive import XTC, Mirostat, mirostat_cut, xtc

NEG = float("-inf")
PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05])


def test_xtc_removes_every_top_choice_but_the_least_likely():
    logits = PROBS.log()
    assert xtc(logits, 0.1, 1.0).isinf().tolist() == [True, True, False, False]  # 0.15 stays
    assert xtc(logits, 0.2, 1.0).isinf().tolist() == [True, False, False, False]  # 0.3 stays
    assert torch.equal(xtc(logits, 0.4, 1.0), logits)  # one token above 0.4: nothing to exclude
    assert torch.equal(xtc(logits, 0.1, 0.0), logits)  # the coin never says yes
    ties = torch.tensor([0.4, 0.3, 0.3]).log()
    assert xtc(ties, 0.1, 1.0).isinf().tolist() == [True, False, False]  # the least likely and its tie
    kept = xtc(logits, 0.1, 1.0)
    assert torch.equal(kept[2:], logits[2:])  # the survivors' logits are untouched


def test_xtc_coin_is_one_per_row_with_the_given_probability():
    # 4000 rows, probability 0.3: the count of rows cut is Binomial(4000, 0.3), mean 1200, sd 29;
    # the test allows 4.5 sd (a false alarm about once in 150 000 seeds).
    g = torch.Generator().manual_seed(0)
    out = XTC(0.1, 0.3, generator=g)(None, PROBS.log().repeat(4000, 1))
    cut = out[:, 0].isinf()
    assert abs(cut.sum().item() - 1200) < 4.5 * math.sqrt(4000 * 0.3 * 0.7)
    assert torch.equal(cut, out[:, 1].isinf())  # a row is cut whole or not at all
    again = XTC(0.1, 0.3, generator=torch.Generator().manual_seed(0))(None, PROBS.log().repeat(4000, 1))
    assert torch.equal(out, again)  # the generator decides


def test_mirostat_cut_removes_tokens_more_surprising_than_mu():
    logits = PROBS.log()  # surprises 1, 1.74, 2.74, 4.32 bits
    assert mirostat_cut(logits, 2.0).isinf().tolist() == [False, False, True, True]
    assert mirostat_cut(logits, 0.5).isinf().tolist() == [False, True, True, True]  # the top token stays
    rows = mirostat_cut(logits.repeat(2, 1), torch.tensor([1.5, 5.0]))
    assert rows.isinf().sum(-1).tolist() == [3, 0]


def test_mirostat_moves_mu_by_the_surprise_of_the_chosen_token():
    rule = Mirostat(tau=1.5, eta=0.5)
    first = rule(torch.tensor([[7], [8]]), PROBS.log().repeat(2, 1))
    assert first.isinf().tolist() == [[False, False, False, True]] * 2  # mu = 2 tau = 3: 0.05 goes
    # row 0 drew token 1; its cut distribution gave it 0.3 / 0.95; row 1 has left the batch
    surprise = -math.log2(0.3 / 0.95)
    second = rule(torch.tensor([[7, 1], [5, 5]]), PROBS.log().repeat(2, 1))
    assert rule.surprises == [pytest.approx(surprise, abs=1e-5)]
    mu = 3 - 0.5 * (surprise - 1.5)  # 2.92: 0.15 (2.74 bits) still in, 0.05 out
    assert torch.equal(second[0], mirostat_cut(PROBS.log(), mu)) and second[0].isinf().sum() == 1
    assert torch.equal(second[1], mirostat_cut(PROBS.log(), 3.0))  # an unknown row starts at 2 tau


@pytest.mark.parametrize("tau", [2.0, 4.0])
def test_mirostat_holds_the_target_surprise_in_generate(tau):
    # A toy model whose plain samples average about 5.3 bits of surprise: after 100 tokens of
    # settling, Mirostat's average over the next 300 is within 0.25 bits of tau (seeded).
    model = ll.toy_model(vocab_size=256)
    rule = Mirostat(tau, eta=0.1)
    ll.generate(model, [[1, 2, 3]], max_new_tokens=400, eos_token_id=[], logits_processor=[rule],
                generator=torch.Generator().manual_seed(0))
    plain = ll.generate(model, [[1, 2, 3]], max_new_tokens=400, eos_token_id=[],
                        generator=torch.Generator().manual_seed(0))
    assert (-plain.raw_logprobs[0] / math.log(2)).mean() > tau + 1
    assert len(rule.surprises) == 399
    assert abs(sum(rule.surprises[100:]) / 299 - tau) < 0.25


@pytest.mark.parametrize("call, name", [
    (lambda: xtc(PROBS.log(), 0.6, 0.5), "threshold"), (lambda: xtc(PROBS.log(), 0.1, 1.5), "probability"),
    (lambda: XTC(0.0, 0.5), "threshold"), (lambda: Mirostat(0.0), "tau"), (lambda: Mirostat(3.0, eta=0.0), "eta"),
    (lambda: mirostat_cut(PROBS.log(), float("nan")), "mu"), (lambda: xtc(torch.tensor([float("nan")]), 0.1, 1), "logits"),
])
def test_bad_arguments_raise(call, name):
    with pytest.raises(ValueError, match=name):
        call()
