"""Speculative sampling: the verification step, its theory, and the loop's exactness.

Statistical tests use fixed seeds and reject at a p-value below 1e-4 (the false-positive rate
of each test if the code is right); their sample sizes give them power against real biases:
each also fails on a deliberately wrong variant (see the tests named *_detects_*).
"""

import copy
import itertools
from collections import Counter

import pytest
import torch
from scipy.stats import binomtest, chisquare

import logitlab as ll
from logitlab.speculative.draft_model import DraftModelDrafter
from logitlab.speculative.prompt_lookup import PromptLookupDrafter
from logitlab.sampling.pipeline import SamplingConfig, process_logits
from logitlab.speculative.acceptance import GreedyMatching, greedy_verify, verify
from logitlab.speculative.loop import speculative_generate
from logitlab.speculative.theory import acceptance_rate, expected_tokens, greedy_chain_calls, speedup

P_MIN = 1e-4


def one_hot(tokens, vocab):
    return torch.nn.functional.one_hot(tokens, vocab).float()


# --- verify --------------------------------------------------------------------------------------


def test_verify_hugging_face_hand_case():
    # Hugging Face's own case: drafts [1, 4, 5]; the target agrees on 1 and 4, then puts all its
    # mass on 8: two drafts are accepted and 8 follows.
    drafts = torch.tensor([[1, 4, 5]])
    p = torch.zeros(1, 4, 10)
    p[0, 0, 1] = p[0, 1, 4] = p[0, 2, 8] = p[0, 3, 0] = 1.0
    num, nxt = verify(drafts, one_hot(drafts, 10), p, torch.Generator().manual_seed(0))
    assert num.tolist() == [2] and nxt.tolist() == [8]


def test_verify_accepts_everything_when_the_drafter_is_the_target_and_then_draws_the_bonus():
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(500, 4, 6, generator=gen), dim=-1)
    drafts = torch.multinomial(p[:, :3].reshape(-1, 6), 1, generator=gen).view(500, 3)
    num, nxt = verify(drafts, p[:, :3], p, gen)
    assert (num == 3).all()
    # The bonus token is a draw from p[:, 3]; a token of probability 0 there never comes out.
    p[:, 3] = torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0, 0.0])
    num, nxt = verify(drafts, p[:, :3], p, gen)
    assert set(nxt.tolist()) == {1, 2}


@pytest.mark.statistical
@pytest.mark.parametrize("g", [1, 3])
def test_the_first_token_of_a_call_follows_the_target_exactly(g):
    # Whatever q is, the first emitted token (a draft if accepted, else the residual's draw) is
    # distributed as p_1; the number of rejections at position 1 is 1 - sum min(p, q).
    gen = torch.Generator().manual_seed(2 + g)
    vocab, rows = 6, 200_000
    p1 = torch.softmax(torch.randn(vocab, generator=gen) * 1.5, dim=-1)
    q1 = torch.softmax(torch.randn(vocab, generator=gen) * 1.5, dim=-1)
    p = torch.softmax(torch.randn(1, g + 1, vocab, generator=gen), dim=-1).repeat(rows, 1, 1)
    q = torch.softmax(torch.randn(1, g, vocab, generator=gen), dim=-1).repeat(rows, 1, 1)
    p[:, 0], q[:, 0] = p1, q1
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).view(rows, g)
    num, nxt = verify(drafts, q, p, gen)
    first = torch.where(num > 0, drafts[:, 0], nxt)
    counts = torch.bincount(first, minlength=vocab).double()
    assert chisquare(counts, rows * p1.double() / p1.double().sum()).pvalue > P_MIN
    rejected = int((num == 0).sum())
    assert binomtest(rejected, rows, 1 - acceptance_rate(p1, q1).item()).pvalue > P_MIN


def test_verify_detects_a_residual_that_is_not_max_p_minus_q():
    # The same test with the residual replaced by p itself must fail: the test has power.
    gen = torch.Generator().manual_seed(7)
    vocab, rows = 6, 200_000
    p1 = torch.softmax(torch.randn(vocab, generator=gen) * 1.5, dim=-1)
    q1 = torch.softmax(torch.randn(vocab, generator=gen) * 1.5, dim=-1)
    drafts = torch.multinomial(q1, rows, replacement=True, generator=gen)[:, None]
    accept = torch.rand(rows, generator=gen) * q1[drafts[:, 0]] < p1[drafts[:, 0]]
    wrong = torch.where(accept, drafts[:, 0], torch.multinomial(p1, rows, replacement=True, generator=gen))
    counts = torch.bincount(wrong, minlength=vocab).double()
    assert chisquare(counts, rows * p1.double() / p1.double().sum()).pvalue < P_MIN


def test_greedy_verify():
    logits = torch.tensor([[[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]]])
    assert [t.tolist() for t in greedy_verify(torch.tensor([[1, 0]]), logits)] == [[2], [2]]
    assert [t.tolist() for t in greedy_verify(torch.tensor([[1, 2]]), logits)] == [[1], [0]]
    assert [t.tolist() for t in greedy_verify(torch.tensor([[0, 2]]), logits)] == [[0], [1]]


@pytest.mark.parametrize("args, match", [
    ((torch.tensor([[1.0, 2.0]]), torch.full((1, 2, 3), 1 / 3), torch.full((1, 3, 3), 1 / 3)), "draft_tokens"),
    ((torch.tensor([[1, 2]]), torch.full((1, 3, 3), 1 / 3), torch.full((1, 3, 3), 1 / 3)), "q must"),
    ((torch.tensor([[1, 2]]), torch.full((1, 2, 3), 1 / 3), torch.full((1, 2, 3), 1 / 3)), "p must"),
    ((torch.tensor([[1, 5]]), torch.full((1, 2, 3), 1 / 3), torch.full((1, 3, 3), 1 / 3)), "draft_tokens"),
    ((torch.tensor([[1, 2]]), torch.full((1, 2, 3), 0.5), torch.full((1, 3, 3), 1 / 3)), "sum to 1"),
])
def test_verify_bad_arguments_raise(args, match):
    with pytest.raises(ValueError, match=match):
        verify(*args)


# --- theory --------------------------------------------------------------------------------------


def test_theory():
    assert expected_tokens(0.5, 3) == pytest.approx((1 - 0.5 ** 4) / 0.5)
    assert expected_tokens(0.0, 5) == 1.0 and expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.8, 4) == pytest.approx(sum(0.8 ** i for i in range(5)))
    assert speedup(0.8, 4, 0.0) == pytest.approx(expected_tokens(0.8, 4))
    assert speedup(0.8, 4, 0.1, verify_cost=1.5) == pytest.approx(expected_tokens(0.8, 4) / 1.9)
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.3, 0.5])
    assert acceptance_rate(p, q).item() == pytest.approx(0.7)
    assert acceptance_rate(p, q).item() == pytest.approx(1 - ll.tv_distance(p, q).item())
    for bad in [dict(alpha=1.5, gamma=2), dict(alpha=0.5, gamma=0)]:
        with pytest.raises(ValueError):
            expected_tokens(**bad)
    with pytest.raises(ValueError, match="c "):
        speedup(0.5, 2, -1.0)
    # The loop's own work: 0.2 steps a call on top of 0.1 + 1.5, and 0.1 a token for plain decoding.
    assert speedup(0.8, 4, 0.1, 1.5, call_overhead=0.2, step_overhead=0.1) == pytest.approx(
        expected_tokens(0.8, 4) * 1.1 / 2.1)
    for bad in [dict(call_overhead=-0.1), dict(step_overhead=float("nan")), dict(call_overhead=True)]:
        with pytest.raises(ValueError, match="overhead"):
            speedup(0.5, 2, 0.1, **bad)


def test_greedy_chain_calls_keep_the_leading_hits_of_each_call():
    # Tokens 1-3 hit (a full call of 3), 5 misses, 6 hits then 7 misses, 8 misses, and the last
    # call has only tokens 9 and 10 left to draft: both hit.
    hits = [None, 1, 1, 1, 1, 0, 1, 0, 0, 1, 1]
    assert greedy_chain_calls(hits, 3) == [3, 0, 1, 0, 2]
    assert greedy_chain_calls(hits, 1) == [1, 1, 0, 1, 0, 1]
    assert greedy_chain_calls([True], 4) == []  # the prefill's token only
    with pytest.raises(ValueError, match="gamma"):
        greedy_chain_calls(hits, 0)


def test_loop_overhead_is_what_the_passes_and_the_drafter_leave():
    from logitlab.decoding import GenerationResult
    from logitlab.speculative.result import SpeculativeResult
    from logitlab.speculative.theory import loop_overhead

    empty = dict(sequences=[], new_tokens=[], logprobs=[], raw_logprobs=[], finish_reasons=[], prompt_index=[])
    v = {1: 1.0, 3: 1.2, 4: 1.5}.__getitem__
    # Three chain calls of 2, 2 and 3 drafts: passes of 1.2 + 1.2 + 1.5 steps of 10 ms = 39 ms; the
    # drafter's 7 steps at 1 ms (its prompt's pass not counted) and the prefill's 50 ms of the
    # 102 ms leave 6 ms: 0.2 steps a call. The drafter's recorded time is not what is subtracted.
    chain = SpeculativeResult(**empty, seconds=0.102, prefill_seconds=0.050, draft_seconds=0.030, drafter_steps=8,
                              drafted=[2, 2, 3])
    assert loop_overhead(chain, 0.010, v, draft_step=0.001) == pytest.approx(0.2)
    assert loop_overhead(chain, 0.010, v) == pytest.approx(0.2 + 0.7 / 3)  # a free drafter: its time is the loop's
    # A tree's call passes over its nodes and the pending token (fed), not depth + 1: two calls of
    # depth 2 over 3 nodes (passes of 1.5 steps each) in 36 ms after the prefill: 0.3 steps a call.
    tree = SpeculativeResult(**empty, seconds=0.046, prefill_seconds=0.010, drafted=[2, 2], fed=[4, 4])
    assert loop_overhead(tree, 0.010, v) == pytest.approx(0.3)
    # Plain decoding: four steps of one token in 48 ms after the prefill: 0.2 steps each.
    plain = GenerationResult(**empty, seconds=0.058, prefill_seconds=0.010, step_seconds=[0.012] * 4)
    assert loop_overhead(plain, 0.010, v) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="step"):
        loop_overhead(plain, 0, v)
    with pytest.raises(ValueError, match="draft_step"):
        loop_overhead(plain, 0.01, v, draft_step=-1.0)
    with pytest.raises(ValueError, match="at least one call"):
        loop_overhead(SpeculativeResult(**empty, seconds=1.0), 0.01, v)


# --- the loop on the toy model: exact distributions ---------------------------------------------


def exact_sequence_probs(model, prompt, length, config, eos=()):
    """Every continuation of up to ``length`` tokens (ending early only on EOS) and its probability."""
    probs = {}

    def grow(ctx, seq, prob):
        if len(seq) == length or (seq and seq[-1] in eos):
            probs[tuple(seq)] = probs.get(tuple(seq), 0.0) + prob
            return
        logits = model(torch.tensor([ctx])).logits[0, -1]
        dist = torch.softmax(process_logits(logits[None], config)[0], dim=-1)
        for tok in range(len(dist)):
            if dist[tok] > 0:
                grow(ctx + [tok], seq + [tok], prob * dist[tok].item())

    grow(list(prompt), [], 1.0)
    return probs


def chi_square_pvalue(samples, probs):
    counts = Counter(tuple(t.tolist()) for t in samples)
    assert set(counts) <= set(probs), "a sequence of probability 0 was generated"
    keys = sorted(probs)
    n, total = len(samples), sum(probs.values())
    return chisquare([counts.get(k, 0) for k in keys], [n * probs[k] / total for k in keys]).pvalue


@pytest.mark.parametrize("settings", [
    dict(temperature=1.0),
    dict(temperature=0.8, top_k=3),
    dict(temperature=1.2, top_p=0.8),
], ids=["T=1", "T=0.8 top-k 3", "T=1.2 top-p 0.8"])
@pytest.mark.statistical
@pytest.mark.parametrize("gamma", [1, 3])
def test_speculative_sampling_is_exact_on_the_toy_model(settings, gamma):
    target = ll.toy_model(vocab_size=5, order=2, seed=0)
    drafter = DraftModelDrafter(ll.toy_model(vocab_size=5, order=3, seed=9))  # another model, another order
    config = SamplingConfig(**settings)
    rows = 30_000
    out = speculative_generate(target, drafter, [[1, 2]], gamma=gamma, max_new_tokens=3, eos_token_id=[4],
                               num_return_sequences=rows, generator=torch.Generator().manual_seed(gamma), **settings)
    probs = exact_sequence_probs(target, [1, 2], 3, config, eos=(4,))
    assert chi_square_pvalue(out.new_tokens, probs) > P_MIN
    assert 0 < out.alpha < 1  # the drafter differs: some drafts are rejected, some accepted
    for tokens, reason in zip(out.new_tokens, out.finish_reasons):
        assert (tokens[:-1] != 4).all()  # nothing after an EOS
        assert reason == ("eos" if tokens[-1] == 4 else "length")


@pytest.mark.statistical
def test_batched_prompts_of_different_lengths_are_each_exact():
    target = ll.toy_model(vocab_size=4, order=3, seed=1)
    drafter = DraftModelDrafter(ll.toy_model(vocab_size=4, order=2, seed=2))
    prompts = [[1], [2, 3, 0]]
    rows = 20_000
    out = speculative_generate(target, drafter, prompts, gamma=2, max_new_tokens=3, eos_token_id=[],
                               num_return_sequences=rows, generator=torch.Generator().manual_seed(5))
    for b, prompt in enumerate(prompts):
        samples = [t for t, i in zip(out.new_tokens, out.prompt_index) if i == b]
        probs = exact_sequence_probs(target, prompt, 3, SamplingConfig())
        assert chi_square_pvalue(samples, probs) > P_MIN
        assert all(torch.equal(s[: len(prompt)], torch.tensor(prompt)) for s, i in zip(out.sequences, out.prompt_index)
                   if i == b)


@pytest.mark.statistical
def test_prompt_lookup_is_exact_on_the_toy_model():
    target = ll.toy_model(vocab_size=4, order=2, seed=3)
    prompt = [1, 2, 3, 1, 2]
    rows = 20_000
    out = speculative_generate(target, PromptLookupDrafter(4, max_ngram=2), [prompt], gamma=3, max_new_tokens=3,
                               eos_token_id=[], num_return_sequences=rows, generator=torch.Generator().manual_seed(6))
    assert chi_square_pvalue(out.new_tokens, exact_sequence_probs(target, prompt, 3, SamplingConfig())) > P_MIN
    assert out.alpha > 0


@pytest.mark.statistical
def test_the_exactness_test_detects_a_loop_that_keeps_rejected_drafts():
    # Accepting every draft makes the output the drafter's: the same chi-square test must fail.
    class AcceptAll(ll.speculative.AcceptanceRule):
        def __call__(self, drafts, q, p, logits, config, generator):
            last = torch.multinomial(p[:, -1], 1, generator=generator).squeeze(-1)
            return torch.full((drafts.shape[0],), drafts.shape[1]), last

    target = ll.toy_model(vocab_size=5, order=2, seed=0)
    drafter = DraftModelDrafter(ll.toy_model(vocab_size=5, order=3, seed=9))
    out = speculative_generate(target, drafter, [[1, 2]], gamma=2, max_new_tokens=3, eos_token_id=[4],
                               num_return_sequences=30_000, acceptance=AcceptAll(),
                               generator=torch.Generator().manual_seed(1))
    assert chi_square_pvalue(out.new_tokens, exact_sequence_probs(target, [1, 2], 3, SamplingConfig(),
                                                                  eos=(4,))) < P_MIN


# --- the loop on SmolLM2: greedy equality and rollback ------------------------------------------


@pytest.fixture(scope="module")
def early_exit(smollm):
    # SmolLM2's first two layers with its final norm and output layer: a real (bad) draft model.
    model = smollm[0]
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = 2
    draft = type(model)(config)
    draft.load_state_dict(model.state_dict(), strict=False)
    return draft.eval()


PROMPTS = ["The capital of France is", "def add(a, b):\n    return", "Once upon a time, a little robot"]


@pytest.mark.parametrize("which", ["shipped draft", "early exit", "prompt lookup", "itself"])
def test_greedy_speculative_decoding_gives_the_greedy_tokens(smollm, early_exit, which):
    model, tokenizer = smollm
    if which == "shipped draft":
        drafter = DraftModelDrafter(ll.speculative.draft_model.load_pretrained(model))
    else:
        drafter = {"early exit": DraftModelDrafter(early_exit), "prompt lookup": PromptLookupDrafter(model.config.vocab_size),
                   "itself": DraftModelDrafter(model)}[which]
    ref = ll.generate(model, PROMPTS, tokenizer=tokenizer, max_new_tokens=24, temperature=0, eos_token_id=[])
    out = speculative_generate(model, drafter, PROMPTS, tokenizer=tokenizer, gamma=4, max_new_tokens=24,
                               temperature=0, eos_token_id=[])
    for a, b in zip(ref.new_tokens, out.new_tokens):
        assert a.tolist() == b.tolist()
    if which == "itself":
        assert out.alpha == 1.0 and out.model_calls == 1 + 23 // 5 + (23 % 5 > 0)
    else:
        assert out.alpha < 1.0  # rejections happened, so the rollback was exercised


def test_greedy_matching_rule_and_eos_inside_a_draft(smollm, early_exit):
    model, tokenizer = smollm
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True)
    ids = list(chat["input_ids"] if hasattr(chat, "keys") else chat)
    ref = ll.generate(model, [ids], max_new_tokens=40, temperature=0)
    out = speculative_generate(model, DraftModelDrafter(model), [ids], gamma=6, max_new_tokens=40, temperature=0,
                               acceptance=GreedyMatching())
    assert ref.finish_reasons == ["eos"] and out.finish_reasons == ["eos"]
    assert out.new_tokens[0].tolist() == ref.new_tokens[0].tolist()  # cut right after the EOS


def test_sampled_speculative_decoding_runs_batched_on_smollm(smollm, early_exit):
    model, tokenizer = smollm
    out = speculative_generate(model, DraftModelDrafter(early_exit), PROMPTS[:2], tokenizer=tokenizer, gamma=3, max_new_tokens=12,
                               temperature=1.0, top_p=0.9, eos_token_id=[], num_return_sequences=2,
                               generator=torch.Generator().manual_seed(0))
    assert len(out.new_tokens) == 4 and all(len(t) == 12 for t in out.new_tokens)
    assert out.model_calls <= 12 and out.alpha < 1
    assert out.texts[0] != out.texts[1]  # two samples of the same prompt


@pytest.mark.parametrize("kwargs, match", [
    (dict(gamma=0), "gamma"),
    (dict(gamma=2, max_new_tokens=0), "max_new_tokens"),
    (dict(gamma=2, temperature=-1.0), "temperature"),
    (dict(gamma=2, acceptance="rejection"), "acceptance"),
])
def test_bad_arguments_raise(kwargs, match):
    kwargs = {"max_new_tokens": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        speculative_generate(ll.toy_bigram(5), DraftModelDrafter(ll.toy_bigram(5, seed=1)), [[1]], **kwargs)


def test_a_drafter_with_another_vocabulary_is_refused():
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(ll.toy_bigram(5), DraftModelDrafter(ll.toy_bigram(6)), [[1]], gamma=2, max_new_tokens=3)
    with pytest.raises(ValueError, match="drafter"):
        speculative_generate(ll.toy_bigram(5), "a model", [[1]], gamma=2, max_new_tokens=3)


# --- tiny random Llama models: exactness with a real transformer and its KV cache ---------------


def tiny_llama(layers, seed, vocab=6):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         tie_word_embeddings=False, bos_token_id=0, eos_token_id=None, pad_token_id=0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper than the default init, so the two models really differ
        model.lm_head.weight.mul_(40)
    return model


@torch.inference_mode()
def exact_llama_probs(model, prompt, length, config):
    """Every continuation of ``length`` tokens and its probability, from full forward passes."""
    vocab = model.config.vocab_size
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=length)))
    ids = torch.cat([torch.tensor(prompt).expand(len(seqs), -1), seqs], dim=1)
    logits = model(ids).logits[:, len(prompt) - 1: -1].float()
    logp = torch.log_softmax(process_logits(logits.reshape(-1, vocab), config), dim=-1).reshape(logits.shape)
    total = logp.gather(-1, seqs[..., None]).squeeze(-1).sum(-1).double().exp()
    return {tuple(s.tolist()): p.item() for s, p in zip(seqs, total) if p > 0}


@pytest.mark.statistical
@pytest.mark.parametrize("settings", [dict(temperature=1.0), dict(temperature=0.9, top_k=3)],
                         ids=["T=1", "T=0.9 top-k 3"])
def test_speculative_sampling_is_exact_with_tiny_llama_models(settings):
    target, drafter = tiny_llama(2, seed=0), tiny_llama(1, seed=1)
    prompts, rows, length = [[1, 2], [3, 4, 5]], 20_000, 3
    out = speculative_generate(target, DraftModelDrafter(drafter), prompts, gamma=2, max_new_tokens=length,
                               eos_token_id=[], num_return_sequences=rows, generator=torch.Generator().manual_seed(0), **settings)
    assert 0.05 < out.alpha < 0.95  # the drafter differs: rejections, and with them rollbacks, happen
    for b, prompt in enumerate(prompts):
        samples = [t for t, i in zip(out.new_tokens, out.prompt_index) if i == b]
        assert chi_square_pvalue(samples, exact_llama_probs(target, prompt, length, SamplingConfig(**settings))) > P_MIN


def test_the_llama_exactness_test_detects_sampling_from_the_drafter():
    target, drafter = tiny_llama(2, seed=0), tiny_llama(1, seed=1)
    out = ll.generate(drafter, [[1, 2]], max_new_tokens=3, eos_token_id=[], num_return_sequences=20_000,
                      generator=torch.Generator().manual_seed(0))
    assert chi_square_pvalue(out.new_tokens, exact_llama_probs(target, [1, 2], 3, SamplingConfig())) < P_MIN


class LogitsRecorder(torch.nn.Module):
    """Passes calls on to a model and keeps, for each call, its input ids, positions and logits."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls, self.config = model, [], model.config

    def forward(self, input_ids, position_ids=None, **kwargs):
        out = self.model(input_ids=input_ids, position_ids=position_ids, **kwargs)
        self.calls.append((input_ids.clone(), position_ids.clone(), out.logits.float().clone()))
        return out


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_after_each_rollback_the_target_computes_what_a_fresh_forward_would(smollm, early_exit, temperature):
    # Every logit the target produced inside the loop, at a position on the final (accepted)
    # sequence, must equal the logit of a fresh forward pass over that sequence: the cache held
    # exactly the accepted prefix, whatever was rejected before.
    model, tokenizer = smollm
    prompts = ["The capital of France is", "Once upon a time, a little robot who"]  # different lengths
    target = LogitsRecorder(model)
    out = speculative_generate(target, DraftModelDrafter(early_exit), prompts, tokenizer=tokenizer, gamma=4, max_new_tokens=20,
                               temperature=temperature, eos_token_id=[], generator=torch.Generator().manual_seed(1))
    assert out.alpha < 0.9 and len(target.calls) > 3
    checked = 0
    for row, sequence in enumerate(out.sequences):
        with torch.inference_mode():
            fresh = model(sequence[None]).logits[0].float()
        for ids, positions, logits in target.calls[1:]:  # the prefill is a plain forward pass
            if ids.shape[0] != len(prompts):
                continue  # after a row finishes the batch shrinks and row indices shift
            for j in range(ids.shape[1]):
                pos = positions[row, j].item()
                on_path = all(pos - j + i < len(sequence) and ids[row, i] == sequence[pos - j + i]
                              for i in range(j + 1))
                if not on_path:
                    break  # a rejected draft: everything after it in this call is off the path
                torch.testing.assert_close(logits[row, j], fresh[pos], atol=2e-3, rtol=1e-4)
                checked += 1
    assert checked > 30


@pytest.mark.parametrize("which", ["shipped draft", "early exit"])
def test_greedy_calls_keep_what_the_draft_run_over_the_text_in_one_pass_would(smollm, early_exit, which):
    # Every draft of a greedy run keeps the output exact, so a draft model whose own cache went
    # wrong after a rollback (a rejected token left in, the last accepted draft never fed) only
    # loses acceptance, silently. At T = 0 each call's count is fixed by the final text
    # (greedy_chain_calls): the draft run over each row's text in one pass must predict them all.
    model, tokenizer = smollm
    draft = ll.speculative.draft_model.load_pretrained(model) if which == "shipped draft" else early_exit
    new_tokens = 40
    out = speculative_generate(model, DraftModelDrafter(draft), PROMPTS, tokenizer=tokenizer, gamma=3,
                               max_new_tokens=new_tokens, temperature=0, eos_token_id=[])
    loop, made = [[] for _ in PROMPTS], [1] * len(PROMPTS)  # each row's counts; its tokens so far
    for counts in out.accepted:  # a row leaves the batch once it has all its tokens
        active = [r for r in range(len(PROMPTS)) if made[r] < new_tokens]
        assert len(counts) == len(active)
        for r, kept in zip(active, counts):
            loop[r].append(kept)
            made[r] += kept + 1
    for row, sequence in enumerate(out.sequences):
        new = out.new_tokens[row]
        with torch.inference_mode():
            top = draft(sequence[None]).logits[0, len(sequence) - len(new) - 1: -1].topk(2)
        hits = (top.indices[:, 0] == new).tolist()
        # A near-tie may fall either way between the loop's passes and this one (float rounding).
        ties = [t for t in range(1, len(new)) if top.values[t, 0] - top.values[t, 1] < 1e-3]
        assert len(ties) <= 3
        readings = []
        for flips in itertools.product([False, True], repeat=len(ties)):
            read = list(hits)
            for t, flip in zip(ties, flips):
                read[t] ^= flip
            readings.append(greedy_chain_calls(read, 3))
        assert loop[row] in readings, row
    assert 0 < sum(map(sum, loop)) < 3 * sum(map(len, loop))  # drafts kept, and drafts rejected


def test_run_statistics_count_the_passes_and_time_them():
    target, drafter = ll.toy_model(vocab_size=5, seed=0), DraftModelDrafter(ll.toy_model(vocab_size=5, seed=1))
    out = speculative_generate(target, drafter, [[1], [2, 3]], gamma=3, max_new_tokens=10, eos_token_id=[],
                               generator=torch.Generator().manual_seed(0))
    # One draft-model pass per proposed token, plus the prefill of the prompts.
    assert out.drafter_steps == 1 + sum(out.drafted)
    assert out.model_calls == 1 + len(out.accepted) and len(out.accepted) == len(out.drafted)
    assert out.draft_step_seconds == pytest.approx(out.draft_seconds / sum(out.drafted))
    assert out.verify_call_seconds == pytest.approx(out.verify_seconds / len(out.accepted))
    assert 0 < out.draft_seconds + out.verify_seconds < out.seconds
    lookup = speculative_generate(target, PromptLookupDrafter(5), [[1, 2, 1, 2, 1]], gamma=3, max_new_tokens=6,
                                  eos_token_id=[], generator=torch.Generator().manual_seed(0))
    assert lookup.drafter_steps == 0 and lookup.draft_step_seconds == 0.0 and lookup.verify_call_seconds > 0


def test_pooled_alpha_weighs_every_examined_draft_once():
    from logitlab.speculative.result import SpeculativeResult
    from logitlab.speculative.theory import call_counts, examined_drafts, pooled_alpha

    def run(calls, drafted):  # calls: per call, per row, (drafts accepted, tokens the output keeps)
        counts = [[call_counts(n, k, g) for n, k in row] for row, g in zip(calls, drafted)]
        return SpeculativeResult(sequences=[], new_tokens=[torch.zeros(1)], logprobs=[], raw_logprobs=[],
                                 finish_reasons=["length"], prompt_index=[0], drafted=drafted,
                                 accepted=[[a for a, _ in c] for c in counts], examined=[[e for _, e in c] for c in counts])

    # Run 1: one call of 3 drafts, 1 accepted (2 examined: the accepted one and the rejected
    # one); run 2: two calls of 2 drafts, both accepted (2 examined), then the first rejected (1).
    a, b = run([[(1, 2)]], [3]), run([[(2, 3)], [(0, 1)]], [2, 2])
    assert a.alpha == pytest.approx(1 / 2) and b.alpha == pytest.approx(2 / 3)
    assert pooled_alpha([a, b]) == pytest.approx(3 / 5)  # not the mean of 1/2 and 2/3
    assert examined_drafts([a]) == 2 and examined_drafts([b]) == 3 and examined_drafts([a, b]) == 5
    # A call whose output ends (EOS) after its second of 4 accepted drafts: 2 accepted of 2 examined.
    assert call_counts(4, 2, 4) == (2, 2) and call_counts(4, 5, 4) == (4, 4) and call_counts(1, 2, 4) == (1, 2)
    assert call_counts(1, 1, 4) == (1, 1) and call_counts(0, 1, 4) == (0, 1) and call_counts(0, 0, 0) == (0, 0)


@pytest.mark.parametrize("loop", ["chain", "single call"])
def test_acceptance_counts_no_draft_after_the_end_of_the_text(smollm, loop):
    # A drafter that is the target itself: every draft is accepted. The end-of-sequence token is
    # the third greedy token, inside the first call's drafts: the drafts after it are not output,
    # and counting them (as accepted, or as examined) would misstate the rate.
    model, tokenizer = smollm
    greedy = ll.generate(model, PROMPTS[:1], tokenizer=tokenizer, max_new_tokens=6, temperature=0, eos_token_id=[])
    eos = greedy.new_tokens[0][2].item()
    assert eos not in greedy.new_tokens[0][:2].tolist()
    if loop == "chain":
        out = speculative_generate(model, DraftModelDrafter(model), PROMPTS[:1], tokenizer=tokenizer, gamma=4,
                                   max_new_tokens=24, temperature=0, eos_token_id=eos)
    else:
        out = ll.speculative.pass_embeddings.pass_generate(model, ll.speculative.pass_embeddings.load_pretrained(model), PROMPTS[0], tokenizer=tokenizer,
                                         max_new_tokens=24, temperature=0, eos_token_id=eos)
    assert out.new_tokens[0].tolist() == greedy.new_tokens[0][:3].tolist()
    if loop == "chain":  # the prefill gives token 1; the one call drafts 2-5, all accepted, and keeps 2-3
        assert out.accepted == [[2]] and out.examined == [[2]] and out.alpha == 1.0
    assert sum(map(sum, out.accepted)) <= len(out.new_tokens[0]) - 1 and out.alpha <= 1.0


def test_acceptance_counts_by_position_on_a_hand_made_record():
    # Call 1: 3 drafts, rows kept 3 and 1; call 2: 2 drafts, one row kept 0.
    from logitlab.speculative.result import SpeculativeResult

    r = SpeculativeResult(sequences=[], new_tokens=[], logprobs=[], raw_logprobs=[], finish_reasons=[], prompt_index=[],
                          accepted=[[3, 1], [0]], drafted=[3, 2])
    kept, reached = r.acceptance_counts()
    assert kept.tolist() == [2, 1, 1]  # position 1 kept by both rows of call 1; 2 and 3 by the first
    assert reached.tolist() == [3, 2, 1]  # every row reaches position 1; the rejected ones stop there
    assert r.acceptance_by_position().tolist() == pytest.approx([2 / 3, 0.5, 1.0])
    kept, reached = r.acceptance_counts(positions=5)  # padded, so runs can be pooled
    assert kept.tolist() == [2, 1, 1, 0, 0] and reached.tolist() == [3, 2, 1, 0, 0]


@pytest.mark.parametrize("match, expected", [("earliest", [3, 9, 1]), ("latest", [4, 5, 1])])
def test_prompt_lookup_copies_the_earliest_or_the_latest_match(match, expected):
    # The last two tokens (1, 2) occur at 0 and at 4: the earliest copy proposes what followed
    # the first, the latest what followed the second; the tail itself is never a match.
    drafter = PromptLookupDrafter(10, max_ngram=2, match=match)
    drafter.start(torch.tensor([[1, 2, 3, 9, 1, 2, 4, 5, 1]]), torch.ones(1, 9, dtype=torch.long))
    tokens, q = drafter.propose(torch.tensor([2]), 3, None)
    assert tokens.tolist() == [expected]
    assert torch.equal(q, torch.nn.functional.one_hot(tokens, 10).float())
    with pytest.raises(ValueError, match="match must be 'earliest' or 'latest'"):
        PromptLookupDrafter(10, match="first")
