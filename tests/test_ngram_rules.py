"""The n-gram rules of chapter 3: exact small cases from their definitions, Hugging Face's
processors as the oracle where it has the rule (no repeated n-grams, sequence bias, banned
words), and the rules inside ``ll.generate`` and ``ll.beam_search``."""

import pytest
import torch
from transformers import NoBadWordsLogitsProcessor, NoRepeatNGramLogitsProcessor, SequenceBiasLogitsProcessor

import logitlab as ll
from logitlab.sampling.ngram_rules import (DRY, BanWords, NoRepeatNGram, SequenceBias, ban_words, dry_penalty, no_repeat_ngram,
                                  repeat_lengths, sequence_bias)

NEG = float("-inf")


def test_no_repeat_ngram_removes_the_tokens_that_complete_a_seen_ngram():
    tokens = torch.tensor([[1, 2, 3, 1, 2], [4, 4, 4, 0, 1]])
    out = no_repeat_ngram(torch.zeros(2, 6), tokens, 3)
    # row 0 ends "1 2", seen followed by 3; row 1 ends "0 1", never seen before
    assert out[0].tolist() == [0, 0, 0, NEG, 0, 0] and out[1].tolist() == [0] * 6
    # n = 1: every token already in the row; n = 2 after "4": 4 and 0 followed a 4
    assert no_repeat_ngram(torch.zeros(2, 6), tokens, 1)[1].isinf().nonzero().flatten().tolist() == [0, 1, 4]
    assert no_repeat_ngram(torch.zeros(1, 6), torch.tensor([[4, 4, 0, 4]]), 2).isinf().nonzero()[:, 1].tolist() == [0, 4]
    # too short a row to hold an n-gram: nothing removed; padding (-1) never matches
    assert not no_repeat_ngram(torch.zeros(1, 6), torch.tensor([[1, 2]]), 4).isinf().any()
    assert not no_repeat_ngram(torch.zeros(1, 6), torch.tensor([[-1, -1, 5]]), 2).isinf().any()


def test_sequence_bias_and_ban_words_exact():
    tokens = torch.tensor([[0, 1, 2], [2, 2, 1]])
    out = sequence_bias(torch.zeros(2, 5), tokens, {(1, 2, 3): -4.0, (2, 4): 1.5, (0,): 0.5, (1, 4): 2.0})
    assert out[0].tolist() == [0.5, 0, 0, -4.0, 1.5]  # ends "1 2" -> 3; ends "2" -> 4
    assert out[1].tolist() == [0.5, 0, 0, 0, 2.0]  # ends "1" -> 4
    banned = ban_words(torch.zeros(2, 5), tokens, [[3], [2, 0]])
    assert banned.isinf().nonzero().tolist() == [[0, 0], [0, 3], [1, 3]]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_no_repeat_ngram_matches_hugging_face(n):
    g = torch.Generator().manual_seed(n)
    tokens = torch.randint(0, 3, (8, 24), generator=g)  # three token ids: n-grams repeat
    scores = torch.randn(8, 10, generator=g)
    theirs = NoRepeatNGramLogitsProcessor(n)(tokens, scores.clone())
    assert torch.equal(NoRepeatNGram(n)(tokens, scores), theirs)
    assert theirs.isinf().any()  # the case is not vacuous


def test_sequence_bias_and_ban_words_match_hugging_face():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 4, (16, 9), generator=g)
    scores = torch.randn(16, 7, generator=g)
    biases = {(3,): -1.0, (1, 2): 2.0, (0, 1, 5): -3.5, (2, 2, 2, 6): 4.0, (3, 5): 0.25}
    theirs = SequenceBiasLogitsProcessor(biases)(tokens, scores.clone())
    assert torch.allclose(SequenceBias(biases)(tokens, scores), theirs)
    words = [[6], [1, 2], [0, 1, 5], [3, 3]]
    theirs = NoBadWordsLogitsProcessor(words)(tokens, scores.clone())
    ours = BanWords(words)(tokens, scores)
    assert torch.equal(ours.isinf(), theirs.isinf()) and ours.isinf().sum() > 16  # more than [6] alone


def test_dry_exact_cases():
    seq = [5, 1, 2, 3, 9, 1, 2, 3]  # "1 2 3" repeats: 9 followed it before
    assert repeat_lengths(seq, set()) == {9: 3}
    out = dry_penalty(torch.zeros(1, 10), torch.tensor([seq]), 0.5, base=2.0, allowed_length=2)
    assert out[0, 9].item() == pytest.approx(-0.5 * 2.0 ** (3 - 2)) and out[0].count_nonzero() == 1
    # the longest earlier copy counts: "2 3" followed by 4, "1 2 3" followed by 9 -> 9: 3, 4: 2
    assert repeat_lengths([2, 3, 4, 1, 2, 3, 9, 1, 2, 3], set()) == {4: 2, 9: 3}
    # below allowed_length: no penalty; a breaker inside the repeat stops it; a breaker last: none
    assert dry_penalty(torch.zeros(1, 10), torch.tensor([seq]), 1.0, allowed_length=4).count_nonzero() == 0
    assert repeat_lengths(seq, {1}) == {9: 2}
    assert repeat_lengths(seq + [7, 3], {7}) == {9: 1}  # the breaker 7 is never penalised
    assert repeat_lengths(seq + [7, 3], set()) == {9: 1, 7: 1} and repeat_lengths([4, 7, 4, 7], {7}) == {}
    assert repeat_lengths(seq, {9}) == {}  # the token that would follow is a breaker: never penalised
    # the window sees only the last tokens; repeats count at most 50 tokens
    assert dry_penalty(torch.zeros(1, 10), torch.tensor([seq]), 1.0, window=5).count_nonzero() == 0
    assert repeat_lengths([3] * 80, set()) == {3: 50}
    # padding (-1) is dropped before matching
    assert repeat_lengths([1, 2, 3, 9, 1, 2, 3], set()) == {9: 3}
    padded = dry_penalty(torch.zeros(1, 10), torch.tensor([[-1, -1] + seq]), 0.5, base=2.0)
    assert torch.equal(padded, out)


def test_bad_arguments_raise_value_errors_that_name_them():
    logits, tokens = torch.zeros(1, 5), torch.tensor([[1, 2]])
    for call, name in [(lambda: no_repeat_ngram(logits, tokens, 0), "n"),
                       (lambda: no_repeat_ngram(logits, torch.tensor([[1.0]]), 2), "tokens"),
                       (lambda: no_repeat_ngram(logits, torch.tensor([[7]]), 2), "tokens"),
                       (lambda: sequence_bias(logits, tokens, {(9,): 1.0}), "biases"),
                       (lambda: sequence_bias(logits, tokens, {(): 1.0}), "biases"),
                       (lambda: sequence_bias(logits, tokens, {(1,): float("nan")}), "biases"),
                       (lambda: ban_words(logits, tokens, [[]]), "words"),
                       (lambda: dry_penalty(logits, tokens, -1.0), "multiplier"),
                       (lambda: dry_penalty(logits, tokens, 1.0, base=1.0), "base"),
                       (lambda: dry_penalty(logits, tokens, 1.0, allowed_length=0), "allowed_length"),
                       (lambda: DRY(1.0, window=0), "window"),
                       (lambda: ll.generate(ll.toy_model(), [[1]], max_new_tokens=2, logits_processor=[3]),
                        "logits_processor")]:
        with pytest.raises(ValueError, match=name):
            call()


def test_generate_hands_each_processor_the_rows_tokens_so_far():
    model = ll.toy_model(vocab_size=12)
    seen = []

    def spy(tokens, logits):
        seen.append(tokens.tolist())
        return logits

    out = ll.generate(model, [[3, 4, 5], [6]], max_new_tokens=3, temperature=0, eos_token_id=[],
                      logits_processor=[spy, NoRepeatNGram(1)])
    assert seen[0] == [[3, 4, 5], [-1, -1, 6]]  # the prompts, left padding as -1
    assert seen[-1] == [out.sequences[0][:-1].tolist(), [-1, -1] + out.sequences[1][:-1].tolist()]
    for row in out.sequences:  # NoRepeatNGram(1): no token twice, prompt included
        assert len(set(row.tolist())) == len(row)


@pytest.mark.slow
def test_beam_search_with_the_rules_matches_hugging_face():
    from transformers import GenerationConfig

    model, tokenizer = ll.load("smollm2-135m", device="cpu")
    ids = tokenizer("Write one sentence about the sea:", return_tensors="pt").input_ids
    plain = ll.beam_search(model, ids, num_beams=4, max_new_tokens=24, eos_token_id=[]).best[0].tokens.tolist()
    first, pair = plain[1], plain[2:4]  # rules that bite: they remove or reward what plain beam search chose
    cases = [(dict(no_repeat_ngram_size=2), [NoRepeatNGram(2)]),
             (dict(bad_words_ids=[[first], pair]), [BanWords([[first], pair])]),
             (dict(sequence_bias={(first,): -3.0, tuple(pair): 2.5}), [SequenceBias({(first,): -3.0, tuple(pair): 2.5})])]
    for settings, processors in cases:
        config = GenerationConfig(num_beams=4, max_new_tokens=24, do_sample=False, eos_token_id=[], pad_token_id=2,
                                  **settings)
        theirs = model.generate(ids, generation_config=config)[0, ids.shape[1]:].tolist()
        ours = ll.beam_search(model, ids, num_beams=4, max_new_tokens=24, eos_token_id=[],
                              logits_processor=processors).best[0].tokens.tolist()
        assert ours == theirs, settings
    assert theirs != plain  # at least the last rule changed the answer
