import pytest
import torch
from scipy.stats import chisquare

import logitlab as ll
from logitlab.toy import NGramLM


def test_bigram_logits_are_table_rows():
    model = ll.toy_bigram(vocab_size=5, seed=0)
    ids = torch.tensor([[1, 4, 0]])
    logits = model(ids).logits
    assert logits.shape == (1, 3, 5)
    for pos, token in enumerate(ids[0]):
        assert torch.equal(logits[0, pos], model.table[token])


def test_hand_built_trigram_uses_two_previous_tokens_and_none_index():
    vocab = 3
    table = torch.zeros(vocab + 1, vocab + 1, vocab)
    table[3, 1] = torch.tensor([9.0, 0.0, 0.0])  # start, then 1 -> token 0 likely
    table[1, 2] = torch.tensor([0.0, 9.0, 0.0])  # 1, 2 -> token 1 likely
    model = NGramLM(table)
    logits = model(torch.tensor([[1, 2]])).logits
    assert torch.equal(logits[0, 0], table[3, 1])
    assert torch.equal(logits[0, 1], table[1, 2])


@pytest.mark.parametrize("order", [1, 2, 3])
def test_cache_gives_the_same_logits_as_the_whole_sequence(order):
    model = ll.toy_model(vocab_size=6, order=order, seed=1)
    ids = torch.randint(0, 6, (3, 9), generator=torch.Generator().manual_seed(0))
    full = model(ids).logits
    out = model(ids[:, :4])
    pieces = [out.logits]
    cache = out.past_key_values
    for t in range(4, 9):
        step = model(ids[:, t : t + 1], past_key_values=cache)
        pieces.append(step.logits)
        cache = step.past_key_values
    assert torch.equal(torch.cat(pieces, dim=1), full)
    assert cache.get_seq_length() == 9


def test_a_wrong_cache_gives_wrong_logits():
    model = ll.toy_model(vocab_size=6, order=3, seed=1)
    right = model(torch.tensor([[1, 2]])).past_key_values
    wrong = model(torch.tensor([[3, 4]])).past_key_values
    step = torch.tensor([[5]])
    assert not torch.equal(model(step, past_key_values=right).logits, model(step, past_key_values=wrong).logits)


@pytest.mark.statistical
def test_next_token_probs_are_exact_and_sampling_matches_them():
    model = ll.toy_bigram(vocab_size=8, seed=3)
    context = torch.tensor([[2, 5]])
    probs = model.next_token_probs(context)
    assert torch.allclose(probs, torch.softmax(model.table[5], dim=-1).unsqueeze(0))
    gen = torch.Generator().manual_seed(0)
    logits = model(context.expand(50_000, -1)).logits[:, -1]
    counts = torch.bincount(ll.sample(logits, generator=gen), minlength=8).double()
    expected = probs[0].double() / probs[0].double().sum() * 50_000
    assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-4


def test_bad_inputs_raise():
    model = ll.toy_bigram(vocab_size=4)
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([[0, 7]]))
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.tensor([[0, 1]]), attention_mask=torch.tensor([[0, 1, 1]]))
    with pytest.raises(ValueError, match="vocab_size"):
        ll.toy_model(vocab_size=1)
    with pytest.raises(ValueError, match="order"):
        ll.toy_model(order=0)
    with pytest.raises(ValueError, match="table"):
        NGramLM(torch.zeros(4, 4))


def test_a_4d_mask_and_positions_choose_each_querys_context():
    """Order 3: each query's context is its last two visible tokens, ordered by position."""
    model = ll.toy_model(vocab_size=6, order=3, seed=2)
    out = model(torch.tensor([[1, 2]]))  # a prompt of two tokens, positions 0 and 1
    # Two siblings after the prompt (tokens 3 and 4, both at position 2), then a child of the
    # second (token 5, position 3), which must not see its uncle 3.
    allowed = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 1, 1]], dtype=torch.bool)[None, None]
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))
    for mask in (allowed, additive):
        step = model(torch.tensor([[3, 4, 5]]), attention_mask=mask, position_ids=torch.tensor([[2, 2, 3]]),
                     past_key_values=out.past_key_values)
        t = model.table
        assert torch.equal(step.logits[0], torch.stack([t[2, 3], t[2, 4], t[4, 5]]))
        assert step.past_key_values.get_seq_length() == 5
    # Positions, not the order in the sequence, say which visible token is the most recent.
    swapped = model(torch.tensor([[1, 2]]), attention_mask=torch.ones(1, 1, 2, 2, dtype=torch.bool),
                    position_ids=torch.tensor([[1, 0]]))
    assert torch.equal(swapped.logits[0, 1], model.table[2, 1])
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.tensor([[3]]), attention_mask=torch.ones(1, 1, 1, 2), past_key_values=out.past_key_values)
    with pytest.raises(ValueError, match="attention_mask"):
        model(torch.tensor([[3]]), attention_mask=torch.full((1, 1, 1, 3), 0.5), past_key_values=out.past_key_values)
    with pytest.raises(ValueError, match="position_ids"):
        model(torch.tensor([[3]]), position_ids=torch.tensor([[1, 2]]))


def test_cache_keeps_the_whole_sequence_history_and_crop():
    model = ll.toy_model(vocab_size=6, order=3, seed=2)
    cache = model(torch.tensor([[1], [4]])).past_key_values
    assert cache.history.tolist() == [[-1, 1], [-1, 4]]  # the last order - 1 tokens, -1 before the start
    cache = model(torch.tensor([[2, 3, 5], [0, 0, 1]]), past_key_values=cache).past_key_values
    assert cache.history.tolist() == [[3, 5], [0, 1]] and cache.get_seq_length() == 4
    cache.crop(-2)  # drop the last two tokens, as DynamicCache.crop(-2)
    assert cache.history.tolist() == [[1, 2], [4, 0]] and cache.get_seq_length() == 2
    step = model(torch.tensor([[5], [5]]), past_key_values=cache)
    assert torch.equal(step.logits, model(torch.tensor([[1, 2, 5], [4, 0, 5]])).logits[:, -1:])
    cache.batch_select_indices(torch.tensor([1]))
    cache.batch_repeat_interleave(3)
    assert cache.tokens.tolist() == [[4, 0]] * 3
    for bad in (1, -3, 0.5):
        with pytest.raises(ValueError, match="tokens_to_remove"):
            cache.crop(bad)


@pytest.mark.parametrize("order", [2, 3])
def test_a_2d_mask_hides_tokens_as_if_they_were_not_there(order):
    # Left padding and masked-out positions in the middle (what speculative decoding leaves
    # after a rejection) give the logits of the sequence without the hidden tokens.
    model = ll.toy_model(vocab_size=5, order=order, seed=4)
    ids = torch.tensor([[4, 0, 1, 2, 3, 1], [2, 3, 4, 0, 1, 2]])
    mask = torch.tensor([[0, 1, 1, 0, 1, 1], [1, 1, 0, 0, 1, 1]])
    first = model(ids[:, :4], attention_mask=mask[:, :4])
    out = model(ids[:, 4:], attention_mask=mask, past_key_values=first.past_key_values)
    for row in range(2):
        plain = ids[row][mask[row].bool()]
        expected = model(plain[None]).logits[0, -2:]
        assert torch.equal(out.logits[row], expected)
