"""Careless input to the decoding loops: a clear ValueError naming the argument, or it just works.

Each case here once passed silently, gave a wrong result, or failed deep inside torch.
"""

import numpy as np
import pytest
import torch

import logitlab as ll
from logitlab.speculative.draft_model import DraftModelDrafter
from logitlab.speculative.medusa_heads import MedusaHeads, medusa_generate
from logitlab.speculative.acceptance import RejectionSampling


def tiny_llama(vocab=6):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1)).eval()


def spec(model, **kw):
    return ll.speculative_generate(model, DraftModelDrafter(ll.toy_bigram(6, seed=1)), [[1, 2]], gamma=2,
                                   max_new_tokens=3, **kw)


@pytest.mark.parametrize("call", [
    lambda m: ll.generate(m, [[1, 9]], max_new_tokens=2),
    lambda m: ll.beam_search(m, [[1, 9]], num_beams=2, max_new_tokens=2),
    lambda m: ll.sample_tree(m, [1, 9], branching=(2,)),
    lambda m: ll.speculative_generate(m, DraftModelDrafter(ll.toy_bigram(6)), [[1, 9]], gamma=2, max_new_tokens=2),
], ids=["generate", "beam_search", "sample_tree", "speculative_generate"])
def test_token_ids_outside_the_vocabulary_are_refused(call):
    with pytest.raises(ValueError, match=r"input_ids must be token ids in \[0, 6\)"):
        call(ll.toy_bigram(6))


def test_medusa_generate_refuses_token_ids_outside_the_vocabulary():
    model = tiny_llama()
    heads = MedusaHeads(model.lm_head.weight.detach(), 1)
    with pytest.raises(ValueError, match=r"input_ids must be token ids in \[0, 6\)"):
        medusa_generate(model, heads, [[1, 6]], branching=(2,), max_new_tokens=3)


@pytest.mark.parametrize("eos", [6, [1, 6], -1])
def test_an_eos_id_outside_the_vocabulary_is_refused(eos):
    model = ll.toy_bigram(6)
    for kwargs in (dict(), dict(min_new_tokens=1)):
        with pytest.raises(ValueError, match="eos_token_id"):
            ll.generate(model, [[1]], max_new_tokens=3, eos_token_id=eos, **kwargs)
    with pytest.raises(ValueError, match="eos_token_id"):
        ll.beam_search(model, [[1]], num_beams=2, max_new_tokens=3, eos_token_id=eos)


def test_a_huge_max_new_tokens_is_fine_when_the_sequence_ends_first():
    # Every token ends the sequence: one token, however many were allowed (no buffer of 10**13).
    model = ll.toy_bigram(6)
    out = ll.generate(model, [[1]], max_new_tokens=10**13, eos_token_id=list(range(6)))
    assert len(out.new_tokens[0]) == 1 and out.finish_reasons == ["eos"]
    beams = ll.beam_search(model, [[1]], num_beams=2, max_new_tokens=10**13, eos_token_id=list(range(6)))
    assert len(beams.best[0].tokens) == 1
    assert len(spec(model, eos_token_id=list(range(6))).new_tokens[0]) == 1


def test_a_model_name_where_a_model_is_expected_says_to_load_it():
    for call in (lambda: ll.generate("smollm2-135m", [[1]], max_new_tokens=2),
                 lambda: ll.beam_search("smollm2-135m", [[1]], num_beams=2, max_new_tokens=2)):
        with pytest.raises(ValueError, match="ll.load"):
            call()
    with pytest.raises(ValueError, match="target"):
        ll.speculative_generate("smollm2-135m", DraftModelDrafter(ll.toy_bigram(6)), [[1]], gamma=2, max_new_tokens=2)


def test_a_class_where_an_instance_is_expected_says_to_call_it():
    model = ll.toy_bigram(6)
    with pytest.raises(ValueError, match=r"acceptance=RejectionSampling\(\)"):
        spec(model, acceptance=RejectionSampling)
    with pytest.raises(ValueError, match=r"got the class DraftModelDrafter: call it"):
        ll.speculative_generate(model, DraftModelDrafter, [[1]], gamma=2, max_new_tokens=2)
    with pytest.raises(ValueError, match="DraftModelDrafter"):
        ll.speculative_generate(model, ll.toy_bigram(6, seed=1), [[1]], gamma=2, max_new_tokens=2)


def test_numpy_integers_are_counts_like_any_other():
    model = ll.toy_bigram(6)
    out = ll.generate(model, [[1]], max_new_tokens=np.int64(3), min_new_tokens=np.int32(1), eos_token_id=[],
                      num_return_sequences=np.int64(2), generator=ll.generator(model, 0))
    assert [len(t) for t in out.new_tokens] == [3, 3]
    assert len(ll.speculative_generate(model, DraftModelDrafter(ll.toy_bigram(6, seed=1)), [[1]], gamma=np.int64(2),
                                       max_new_tokens=np.int64(3), eos_token_id=[]).new_tokens[0]) == 3
    beams = ll.beam_search(model, [[1]], num_beams=np.int64(2), max_new_tokens=np.int64(3), eos_token_id=[])
    assert len(beams.best[0].tokens) == 3


def test_beam_search_early_stopping_must_be_exactly_true_false_or_never():
    # 1 == True in Python: accepting 1 would run neither rule (the code tests `is True`).
    for value in (1, 0, "True", None):
        with pytest.raises(ValueError, match="early_stopping"):
            ll.beam_search(ll.toy_bigram(6), [[1]], num_beams=2, max_new_tokens=2, early_stopping=value)


def test_beam_search_returns_no_placeholder_hypotheses():
    # With 6 tokens and one new token there are 6 sequences: a 7th hypothesis could only be a
    # placeholder scored -1e9, so only the 6 real ones come back.
    hyps = ll.beam_search(ll.toy_bigram(6), [[1]], num_beams=7, max_new_tokens=1, eos_token_id=[],
                          num_return_sequences=7).hypotheses[0]
    assert len(hyps) == 6 and len({tuple(h.tokens.tolist()) for h in hyps}) == 6
    assert all(h.score > -1e8 for h in hyps)


class NaNModel(torch.nn.Module):
    """A toy model whose logits turn to NaN: what a broken checkpoint does."""

    def __init__(self):
        super().__init__()
        self.inner = ll.toy_bigram(6)
        self.config = self.inner.config

    def forward(self, *args, **kwargs):
        out = self.inner(*args, **kwargs)
        out.logits = torch.full_like(out.logits, float("nan"))
        return out


def test_nan_logits_are_an_error_in_every_loop_not_a_nan_score():
    model = NaNModel()
    for call in (lambda: ll.beam_search(model, [[1]], num_beams=2, max_new_tokens=2),
                 lambda: ll.generate(model, [[1]], max_new_tokens=2),
                 lambda: ll.speculative_generate(model, DraftModelDrafter(ll.toy_bigram(6)), [[1]], gamma=2,
                                                 max_new_tokens=2),
                 lambda: ll.sample_tree(model, [1], branching=(2, 2)),
                 lambda: ll.sample_tree(model, [1], branching=(2, 2), temperature=0.5, with_replacement=False)):
        with pytest.raises(ValueError, match="NaN"):
            call()
