"""The decoding loop: Hugging Face greedy as the oracle, stopping rules, shared prefill,
exact sequence probabilities on the toy model, and argument checks."""

import itertools

import pytest
import torch
from scipy.stats import chisquare
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

import logitlab as ll
from logitlab.sampling.pipeline import process_logits


class CountingModel(torch.nn.Module):
    """Wraps a model and records the shape of input_ids at every call."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.calls = []
        self.generation_config = getattr(model, "generation_config", None)

    @property
    def device(self):
        return self.model.device

    def forward(self, input_ids, **kwargs):
        self.calls.append(tuple(input_ids.shape))
        return self.model(input_ids=input_ids, **kwargs)


PROMPTS = ["The capital of France is", "Write a haiku about autumn leaves falling", "1, 2, 3, 4,"]


def test_greedy_matches_hugging_face_with_padding(smollm):
    model, tok = smollm
    enc = tok(PROMPTS, return_tensors="pt", padding=True, padding_side="left")
    hf = model.generate(**enc, max_new_tokens=24, do_sample=False, eos_token_id=None)
    ours = ll.generate(model, enc.input_ids, attention_mask=enc.attention_mask, max_new_tokens=24,
                       temperature=0, eos_token_id=[])
    for row in range(len(PROMPTS)):
        assert ours.new_tokens[row].tolist() == hf[row, enc.input_ids.shape[1]:].tolist()
        alone = ll.generate(model, [tok(PROMPTS[row]).input_ids], max_new_tokens=24, temperature=0, eos_token_id=[])
        assert alone.new_tokens[0].tolist() == ours.new_tokens[row].tolist()  # padding changes nothing


def test_greedy_with_eos_and_with_repetition_penalty_matches_hugging_face(smollm):
    model, tok = smollm
    chat = [{"role": "user", "content": "What is 2 + 2? Answer with a number only."}]
    ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    hf = model.generate(ids, max_new_tokens=30, do_sample=False)
    ours = ll.generate(model, ids, max_new_tokens=30, temperature=0, tokenizer=tok)
    expected = hf[0, ids.shape[1]:].tolist()
    assert ours.new_tokens[0].tolist() == expected
    assert ours.finish_reasons == ["eos"] and expected[-1] == tok.eos_token_id  # stops at <|im_end|>
    assert tok.eos_token not in ours.texts[0] and "4" in ours.texts[0]
    # The repetition penalty counts the prompt, whose chat template contains <|im_end|> itself:
    # penalised, the end-of-turn token loses to other words. Same tokens as Hugging Face.
    hf = model.generate(ids, max_new_tokens=30, do_sample=False, repetition_penalty=1.3)
    ours = ll.generate(model, ids, max_new_tokens=30, temperature=0, repetition_penalty=1.3)
    assert ours.new_tokens[0].tolist() == hf[0, ids.shape[1]:].tolist()


def test_processing_order_matches_hugging_face():
    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(6, 500, generator=gen)
    context = torch.randint(0, 500, (6, 30), generator=gen)
    for t, k, p, m, typ, rep in [(0.7, 50, 0.9, None, None, 1.2), (1.3, None, 0.8, 0.05, None, None),
                                  (1.0, 20, None, None, 0.9, 1.5), (0.5, 5, 0.95, 0.1, 0.95, 0.8)]:
        chain = [RepetitionPenaltyLogitsProcessor(rep)] if rep else []
        chain.append(TemperatureLogitsWarper(t))
        chain += [TopKLogitsWarper(k)] if k else []
        chain += [TopPLogitsWarper(p)] if p else []
        chain += [MinPLogitsWarper(m)] if m else []
        chain += [TypicalLogitsWarper(typ)] if typ else []
        expected = LogitsProcessorList(chain)(context, logits.clone())
        config = ll.SamplingConfig(temperature=t, top_k=k, top_p=p, min_p=m, typical_p=typ, repetition_penalty=rep)
        got = process_logits(logits, config, context=context)
        assert torch.equal(got.isneginf(), expected.isneginf())
        assert torch.allclose(got[~got.isneginf()], expected[~expected.isneginf()])


def test_stop_string_spanning_tokens_is_cut(smollm):
    model, tok = smollm
    free = ll.generate(model, PROMPTS[0], tokenizer=tok, max_new_tokens=12, temperature=0)
    assert free.texts[0].startswith(" Paris.\n\nThe answer is")
    # "answer is" spans two tokens; "ris." starts inside the token " Paris".
    for stop, text in [("answer is", " Paris.\n\nThe "), ("ris.", " Pa"), (["zzz", "\n\n"], " Paris.")]:
        out = ll.generate(model, PROMPTS[0], tokenizer=tok, max_new_tokens=12, temperature=0, stop=stop)
        assert out.finish_reasons == ["stop"]
        assert out.texts[0] == text
        assert len(out.new_tokens[0]) < len(free.new_tokens[0])


def toy_with_eos():
    """A bigram model over 5 tokens in which token 4, the EOS, is very likely after token 0."""
    table = torch.zeros(6, 5)
    table[:, 4] = -1.0
    table[0, 4] = 4.0
    return ll.models.NGramLM(table)


def test_min_new_tokens_makes_eos_impossible_until_then():
    model = toy_with_eos()
    prompt = torch.zeros(200, 1, dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    free = ll.generate(model, prompt, max_new_tokens=8, eos_token_id=4, generator=gen)
    assert sum(len(t) == 1 for t in free.new_tokens) > 100  # EOS first is the likely outcome
    held = ll.generate(model, prompt, max_new_tokens=8, min_new_tokens=5, eos_token_id=4, generator=gen)
    for tokens, reason in zip(held.new_tokens, held.finish_reasons):
        assert 4 not in tokens[:5].tolist()
        assert reason == ("eos" if tokens[-1] == 4 else "length")
        assert (tokens[:-1] != 4).all()


def test_raw_logprobs_are_the_models_own_even_while_eos_is_forbidden():
    # min_new_tokens removes EOS from the distribution that is sampled, not from the model's:
    # raw_logprobs stay log softmax of the model's logits; logprobs are renormalised without EOS.
    model = toy_with_eos()
    out = ll.generate(model, torch.zeros(3, 1, dtype=torch.long), max_new_tokens=6, min_new_tokens=6,
                      eos_token_id=4, generator=torch.Generator().manual_seed(0))
    for seq, raw, sampled in zip(out.sequences, out.raw_logprobs, out.logprobs):
        logits = model(seq[None]).logits[0, :-1].float()
        expected = torch.log_softmax(logits, -1).gather(-1, seq[1:, None]).squeeze(-1)
        assert torch.allclose(raw, expected, atol=1e-6)
        without_eos = torch.log_softmax(logits.index_fill(-1, torch.tensor([4]), float("-inf")), -1)
        assert torch.allclose(sampled, without_eos.gather(-1, seq[1:, None]).squeeze(-1), atol=1e-6)


def test_long_generations_keep_every_token_and_log_probability():
    # The output buffers grow while generating (64 columns, then doubling): nothing may be lost.
    model = ll.toy_model(vocab_size=5, order=2, seed=0)
    out = ll.generate(model, [[1, 2], [3]], max_new_tokens=150, eos_token_id=[],
                      generator=torch.Generator().manual_seed(0))
    for prompt, seq, new, raw in zip([[1, 2], [3]], out.sequences, out.new_tokens, out.raw_logprobs):
        assert len(new) == 150 and seq[: len(prompt)].tolist() == prompt and torch.equal(seq[len(prompt):], new)
        logits = model(seq[None]).logits[0, len(prompt) - 1: -1].float()
        assert torch.allclose(raw, torch.log_softmax(logits, -1).gather(-1, new[:, None]).squeeze(-1), atol=1e-5)


def test_finished_rows_stop_costing_compute():
    model = CountingModel(toy_with_eos())
    ll.generate(model, torch.zeros(64, 1, dtype=torch.long), max_new_tokens=10, eos_token_id=4,
                generator=torch.Generator().manual_seed(1))
    batch_sizes = [shape[0] for shape in model.calls]
    assert batch_sizes[0] == 64 and batch_sizes == sorted(batch_sizes, reverse=True)
    assert batch_sizes[-1] < 64


def test_return_sequences_share_one_prefill(smollm):
    model, tok = smollm
    counting = CountingModel(model)
    ids = [tok(p).input_ids for p in PROMPTS[:2]]
    out = ll.generate(counting, ids, max_new_tokens=5, num_return_sequences=4, eos_token_id=[],
                      generator=torch.Generator().manual_seed(0))
    prefill = [shape for shape in counting.calls if shape[1] > 1]
    assert prefill == [(2, max(len(i) for i in ids))]  # the prompts once, not 4 times
    assert all(shape == (8, 1) for shape in counting.calls[1:])
    assert out.prompt_index == [0, 0, 0, 0, 1, 1, 1, 1] and out.model_calls == len(counting.calls) == 5
    assert len({tuple(t.tolist()) for t in out.new_tokens[:4]}) > 1  # the four samples differ


@pytest.mark.statistical
def test_sampled_sequences_follow_exact_probabilities():
    """3 new tokens from the toy bigram model: 64 possible sequences, exact probabilities known.

    Chi-square test with a false-positive rate of 1e-4 (fixed seed, so the run is repeatable).
    """
    model = ll.toy_bigram(vocab_size=4, seed=3)
    for temperature in (1.0, 0.6):
        probs = torch.softmax(model.table.double() / temperature, dim=-1)  # row a: next token after a
        out = ll.generate(model, torch.tensor([[2]]), max_new_tokens=3, num_return_sequences=40_000,
                          temperature=temperature, eos_token_id=[], generator=torch.Generator().manual_seed(7))
        counts = torch.zeros(64, dtype=torch.float64)
        for tokens in out.new_tokens:
            a, b, c = tokens.tolist()
            counts[16 * a + 4 * b + c] += 1
        exact = torch.zeros(64, dtype=torch.float64)
        for a, b, c in itertools.product(range(4), repeat=3):
            exact[16 * a + 4 * b + c] = probs[2, a] * probs[a, b] * probs[b, c]
        assert chisquare(counts.numpy(), (exact / exact.sum() * counts.sum()).numpy()).pvalue > 1e-4


def test_logprobs_are_the_chosen_tokens_log_probabilities(smollm):
    model, tok = smollm
    ids = tok(PROMPTS[0], return_tensors="pt").input_ids
    out = ll.generate(model, ids, max_new_tokens=4, temperature=1.0, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(out.sequences[0][None]).logits[0].float()
    n = ids.shape[1]
    expected = ll.log_softmax(full[n - 1 : n + 3]).gather(-1, out.new_tokens[0][:, None]).squeeze(-1)
    assert torch.allclose(out.raw_logprobs[0], expected, atol=1e-4)
    assert torch.allclose(out.logprobs[0], out.raw_logprobs[0])  # T = 1, no rule: the same distribution
    truncated = ll.generate(model, ids, max_new_tokens=4, top_k=5, generator=torch.Generator().manual_seed(0))
    assert (truncated.logprobs[0] >= truncated.raw_logprobs[0] - 1e-6).all()  # renormalised over 5 tokens
    greedy = ll.generate(model, ids, max_new_tokens=4, temperature=0)
    assert (greedy.logprobs[0] == 0).all()
    assert out.prefill_seconds > 0 and len(out.step_seconds) == 4 and out.decode_seconds_per_token > 0


def test_config_object_gives_the_same_tokens_as_keywords():
    model = ll.toy_bigram(vocab_size=6)
    config = ll.SamplingConfig(temperature=0.8, top_k=3)
    a = ll.generate(model, [[1, 2]], max_new_tokens=6, config=config, generator=torch.Generator().manual_seed(3))
    b = ll.generate(model, [[1, 2]], max_new_tokens=6, temperature=0.8, top_k=3, generator=torch.Generator().manual_seed(3))
    assert a.new_tokens[0].tolist() == b.new_tokens[0].tolist()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=3, min_new_tokens=4), "min_new_tokens"),
        (dict(max_new_tokens=3, num_return_sequences=0), "num_return_sequences"),
        (dict(max_new_tokens=3, stop="x"), "tokenizer"),
        (dict(max_new_tokens=3, stop=[""]), "stop"),
        (dict(max_new_tokens=3, temperature=-1), "temperature"),
        (dict(max_new_tokens=3, top_p=1.5), "top_p"),
        (dict(max_new_tokens=3, top_k=0), "top_k"),
        (dict(max_new_tokens=3, eos_token_id="2"), "eos_token_id"),
        (dict(max_new_tokens=3, generator=5), "generator"),
        (dict(max_new_tokens=3, config=ll.SamplingConfig(), temperature=0.5), "not both"),
        (dict(max_new_tokens=3, attention_mask=torch.tensor([[1, 0]])), "left padding"),
    ],
)
def test_bad_arguments_raise(kwargs, message):
    model = ll.toy_bigram(vocab_size=6)
    with pytest.raises(ValueError, match=message):
        ll.generate(model, torch.tensor([[1, 2]]), **kwargs)


@pytest.mark.parametrize("prompt", [torch.zeros(1, 0, dtype=torch.long), [[]], [], "text", torch.tensor([[1.0]])])
def test_bad_prompts_raise(prompt):
    with pytest.raises(ValueError, match="input_ids"):
        ll.generate(ll.toy_bigram(), prompt, max_new_tokens=2)
