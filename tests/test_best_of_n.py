"""Best-of-N: the selection returns the best row of each prompt by the given score."""

import pytest
import torch

import logitlab as ll
from logitlab.search.best_of_n import select_best, sequence_scores


def test_best_of_n_picks_the_highest_score_of_each_prompt():
    model = ll.toy_model(vocab_size=6, order=2, seed=1)
    out = ll.best_of_n(model, [[0, 1], [2, 3]], n=8, max_new_tokens=5, eos_token_id=[5],
                       generator=torch.Generator().manual_seed(0))
    result = out.result
    assert len(result.new_tokens) == 16 and result.prompt_index == [0] * 8 + [1] * 8
    # The score is the mean raw log-probability, recomputed here from the model itself.
    for row, (seq, new) in enumerate(zip(result.sequences, result.new_tokens)):
        logp = torch.log_softmax(model(seq[None]).logits[0], dim=-1)
        start = len(seq) - len(new)
        expected = logp[start - 1:-1].gather(-1, seq[start:, None]).mean()
        assert out.scores[row].item() == pytest.approx(expected.item(), abs=1e-5)
    for prompt, row in enumerate(out.best_rows):
        rows = [r for r, p in enumerate(result.prompt_index) if p == prompt]
        assert row in rows
        assert out.scores[row] == out.scores[rows].max()
    assert out.best_tokens[1] is result.new_tokens[out.best_rows[1]]


def test_scores_and_ties():
    model = ll.toy_bigram(vocab_size=5, seed=2)
    result = ll.generate(model, [[1]], num_return_sequences=6, max_new_tokens=4, eos_token_id=[4],
                         generator=torch.Generator().manual_seed(3))
    total = sequence_scores(result, "logprob")
    mean = sequence_scores(result, "mean_logprob")
    lengths = torch.tensor([len(t) for t in result.new_tokens], dtype=torch.float)
    assert torch.allclose(total / lengths, mean)
    assert select_best(result, torch.tensor([0.0, 2.0, 2.0, 1.0, -1.0, 0.5])) == [1]  # first of a tie
    custom = ll.best_of_n(model, [[1]], n=6, max_new_tokens=4, eos_token_id=[4],
                          score=lambda r: -torch.tensor([float(len(t)) for t in r.new_tokens]),
                          generator=torch.Generator().manual_seed(3))
    assert len(custom.best_tokens[0]) == min(len(t) for t in custom.result.new_tokens)


@pytest.mark.parametrize("kwargs, match", [
    (dict(n=0), "n must"),
    (dict(n=2, score="best"), "score"),
    (dict(n=2, num_return_sequences=2), "num_return_sequences"),
    (dict(n=2, score=lambda r: torch.zeros(3)), "score"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ll.best_of_n(ll.toy_bigram(), [[1]], max_new_tokens=3, **kwargs)
