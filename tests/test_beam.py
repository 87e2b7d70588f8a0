"""Beam search: Hugging Face's beam search as the oracle, exhaustive search on the toy model."""

import itertools

import pytest
import torch
from transformers import GenerationConfig

import logitlab as ll
from logitlab.search.beam import beam_search


@pytest.fixture(scope="module")
def smollm():
    # The stock model: Hugging Face is the oracle here, and its loop and ours need not pass the same
    # numbers of rows through the model; with the fast path (chosen anew at every load) different row
    # counts can take different kernels, whose rounding can flip a near-tie between beams.
    return ll.load("smollm2-135m", device="cpu", fast=False)


def chat_ids(tokenizer, question):
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                            return_tensors="pt")
    return encoded["input_ids"] if hasattr(encoded, "keys") else encoded


def hf_beams(model, ids, mask, *, num_beams, max_new_tokens, length_penalty, early_stopping, eos, num_return):
    config = GenerationConfig(num_beams=num_beams, max_new_tokens=max_new_tokens, length_penalty=length_penalty,
                              early_stopping=early_stopping, do_sample=False, eos_token_id=eos, pad_token_id=2,
                              num_return_sequences=num_return, output_scores=True, return_dict_in_generate=True)
    out = model.generate(ids, attention_mask=mask, generation_config=config)
    return out.sequences[:, ids.shape[1]:], out.sequences_scores


# (question or plain text, num_beams, max_new_tokens, length_penalty, early_stopping, eos, num_return,
#  whether the best hypothesis ends on EOS)
CASES = [
    ("text:The capital of France is", 4, 10, 1.0, False, [], 2, False),  # no EOS: all end at the limit
    ("What is 2+2? Answer briefly.", 4, 20, 1.0, False, 2, 3, True),
    ("Name a colour.", 3, 16, 0.5, True, 2, 3, False),
    ("Name a colour.", 5, 16, 2.0, "never", 2, 2, False),
    ("What is the capital of Italy?", 2, 24, -0.5, False, 2, 2, True),  # negative penalty: short wins
    ("text:def fibonacci(n):", 6, 8, 0.0, False, 2, 4, False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[1]}beams-lp{c[3]}-es{c[4]}")
def test_same_hypotheses_and_scores_as_hugging_face(smollm, case):
    model, tokenizer = smollm
    prompt, num_beams, max_new, lp, es, eos, num_return, ends_on_eos = case
    ids = tokenizer(prompt[5:], return_tensors="pt").input_ids if prompt.startswith("text:") else chat_ids(tokenizer, prompt)
    theirs, their_scores = hf_beams(model, ids, torch.ones_like(ids), num_beams=num_beams, max_new_tokens=max_new,
                                    length_penalty=lp, early_stopping=es, eos=eos, num_return=num_return)
    ours = beam_search(model, ids, num_beams=num_beams, max_new_tokens=max_new, length_penalty=lp,
                       early_stopping=es, eos_token_id=eos, num_return_sequences=num_return)
    assert len(ours.hypotheses[0]) == num_return
    for i, hyp in enumerate(ours.hypotheses[0]):
        expected = theirs[i]
        assert torch.equal(hyp.tokens, expected[: len(hyp.tokens)])
        assert (expected[len(hyp.tokens):] == 2).all()  # Hugging Face pads after the end
        assert hyp.score == pytest.approx(their_scores[i].item(), rel=1e-5, abs=1e-5)
        assert hyp.logprob == pytest.approx(hyp.score * len(hyp.tokens) ** lp, rel=1e-6)
    assert (ours.best[0].finish_reason == "eos") == ends_on_eos
    assert ours.best[0].finish_reason == ("eos" if ours.best[0].tokens[-1] == 2 and eos == 2 else "length")


def test_batched_prompts_with_padding_match_hugging_face_and_each_prompt_alone(smollm):
    model, tokenizer = smollm
    questions = ["Name a colour.", "What is the capital of Italy? Answer in one word, please."]
    rows = [chat_ids(tokenizer, q)[0].tolist() for q in questions]
    width = max(map(len, rows))
    ids = torch.tensor([[2] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    theirs, their_scores = hf_beams(model, ids, mask, num_beams=3, max_new_tokens=12, length_penalty=1.0,
                                    early_stopping=False, eos=2, num_return=1)
    batched = beam_search(model, ids, attention_mask=mask, num_beams=3, max_new_tokens=12)
    for b, row in enumerate(rows):
        alone = beam_search(model, [row], num_beams=3, max_new_tokens=12)
        hyp = batched.best[b]
        assert torch.equal(hyp.tokens, alone.best[0].tokens)
        assert torch.equal(hyp.tokens, theirs[b][: len(hyp.tokens)])
        assert hyp.score == pytest.approx(their_scores[b].item(), rel=1e-4)
        assert torch.equal(batched.prompts[b], torch.tensor(row))


class Counting(torch.nn.Module):
    """Wraps a model and records the batch size and length of every forward pass."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, []
        self.generation_config = model.generation_config

    @property
    def device(self):
        return self.model.device

    def forward(self, input_ids, **kwargs):
        self.calls.append(tuple(input_ids.shape))
        return self.model(input_ids=input_ids, **kwargs)


def test_beams_share_one_prefill(smollm):
    model, tokenizer = smollm
    counting = Counting(model)
    ids = tokenizer("Once upon a time", return_tensors="pt").input_ids
    result = beam_search(counting, ids, num_beams=4, max_new_tokens=6, eos_token_id=[])
    assert counting.calls[0] == (1, ids.shape[1])  # the prompt, once
    assert counting.calls[1:] == [(4, 1)] * 5  # then one token per beam per step
    assert result.model_calls == 6 and len(result.history) == 6


def test_one_beam_is_greedy_decoding(smollm):
    model, tokenizer = smollm
    ids = tokenizer("The history of the printing press", return_tensors="pt").input_ids
    beam = beam_search(model, ids, num_beams=1, max_new_tokens=15, eos_token_id=[])
    greedy = ll.generate(model, ids, max_new_tokens=15, temperature=0, eos_token_id=[])
    assert torch.equal(beam.best[0].tokens, greedy.new_tokens[0])
    assert beam.best[0].logprob == pytest.approx(greedy.raw_logprobs[0].sum().item(), abs=1e-4)


def exhaustive_best(model, prompt, length):
    """The most likely continuation of exactly ``length`` tokens, by trying them all."""
    best, best_lp = None, -float("inf")
    for tail in itertools.product(range(model.vocab_size), repeat=length):
        seq = torch.tensor([prompt + list(tail)])
        lp = torch.log_softmax(model(seq).logits[0, len(prompt) - 1: -1], dim=-1)
        total = lp.gather(-1, seq[0, len(prompt):, None]).sum().item()
        if total > best_lp:
            best, best_lp = list(tail), total
    return best, best_lp


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_enough_beams_find_the_most_likely_sequence_of_the_toy_model(seed):
    # With V ** (n - 1) beams nothing is ever pruned, so beam search is exhaustive search.
    model = ll.toy_model(vocab_size=4, order=3, seed=seed)
    best, best_lp = exhaustive_best(model, [1, 2], 4)
    result = beam_search(model, [[1, 2]], num_beams=64, max_new_tokens=4, eos_token_id=[], length_penalty=0.0)
    assert result.best[0].tokens.tolist() == best
    assert result.best[0].score == pytest.approx(best_lp, abs=1e-5)


def test_scores_are_sorted_and_the_history_follows_the_beams():
    model = ll.toy_model(vocab_size=6, order=2, seed=3)
    result = beam_search(model, [[0]], num_beams=3, max_new_tokens=5, eos_token_id=[5], num_return_sequences=3)
    scores = [h.score for h in result.hypotheses[0]]
    assert scores == sorted(scores, reverse=True)
    for previous, step in zip(result.history, result.history[1:]):
        # Each beam extends the beam its parent index names.
        for j in range(3):
            parent = step.parents[0, j]
            assert torch.equal(step.beams[0, j, :-1], previous.beams[0, parent])


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_beams=0, max_new_tokens=4), "num_beams"),
    (dict(num_beams=2.0, max_new_tokens=4), "num_beams"),
    (dict(num_beams=2, max_new_tokens=0), "max_new_tokens"),
    (dict(num_beams=2, max_new_tokens=4, length_penalty=float("nan")), "length_penalty"),
    (dict(num_beams=2, max_new_tokens=4, early_stopping="always"), "early_stopping"),
    (dict(num_beams=2, max_new_tokens=4, num_return_sequences=3), "num_return_sequences"),
    (dict(num_beams=2, max_new_tokens=4, eos_token_id="<eos>"), "eos_token_id"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        beam_search(ll.toy_bigram(), [[1, 2]], **kwargs)
