"""PaSS look-ahead embeddings (chapter 8): layouts, exactness, greedy equality, training, saving."""

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

import logitlab as ll
import logitlab.speculative.pass_embeddings as lookahead_module
from logitlab.speculative.pass_embeddings import (LookaheadEmbeddings, load_pretrained, pass_generate, save_lookahead,
                                single_call_layout)
from logitlab.sampling.pipeline import SamplingConfig
from logitlab.speculative.loop import speculative_generate
from logitlab.training.data import generate_with_logits
from logitlab.training.lookahead import lookahead_losses, rows_from_tokens, train_lookahead
from logitlab.speculative.pass_embeddings import training_layout
from test_speculative import P_MIN, exact_llama_probs, tiny_llama


def random_lookahead(model, k, seed, scale=5.0):
    """Untrained embeddings, made larger so that the tiny model's guesses vary (some pass, many fail)."""
    la = LookaheadEmbeddings(model, k, seed=seed)
    with torch.no_grad():
        la.vectors.mul_(scale)
    return la


def pooled_pvalue(samples, probs, min_expected=5):
    """Chi-square of sampled sequences against exact probabilities, the rare sequences pooled into
    one cell (a cell expecting fewer than a handful of samples makes the test meaningless)."""
    counts, n = Counter(tuple(t.tolist()) for t in samples), len(samples)
    assert set(counts) <= set(probs), "a sequence of probability 0 was generated"
    total = sum(probs.values())
    big = [s for s in probs if n * probs[s] / total >= min_expected]
    small = [s for s in probs if s not in big]
    observed = [counts.get(s, 0) for s in big] + [sum(counts.get(s, 0) for s in small)]
    expected = [n * probs[s] / total for s in big] + [n * sum(probs[s] for s in small) / total]
    assert len(big) >= 20  # enough separate cells for the test to have power
    return chisquare(observed, expected).pvalue


# --- layouts -------------------------------------------------------------------------------------


def test_single_call_layout_by_hand():
    # Pending token 0, drafts 1-2; two slots after the pending token, one after draft 2.
    assert single_call_layout(2, {0: 2, 2: 1}) == [-1, 0, 1, 0, 3, 2]
    assert single_call_layout(0, {0: 3}) == [-1, 0, 1, 2]
    assert single_call_layout(1, {}) == [-1, 0]
    with pytest.raises(ValueError, match="groups"):
        single_call_layout(1, {2: 1})


def test_training_layout_by_hand():
    # Three tokens; two slots after token 0 and two after token 2.
    assert training_layout(3, [0, 2], 2) == [-1, 0, 1, 0, 3, 2, 5]
    mask = ll.tree_attention_mask(training_layout(3, [0, 2], 2))
    assert mask[4].tolist() == [True, False, False, True, True, False, False]  # slot 2 after token 0
    assert ll.tree_position_ids(training_layout(3, [0, 2], 2)).tolist() == [0, 1, 2, 1, 2, 3, 4]


def test_the_first_k_embeddings_predict_what_they_predict_in_a_larger_set(tmp_path):
    # Slot i sees only slots before it: dropping the later slots changes nothing before them.
    model = tiny_llama(2, seed=0)
    big = random_lookahead(model, 4, seed=3)
    save_lookahead(big, tmp_path / "la.safetensors")
    small = load_pretrained(model, tmp_path / "la.safetensors", k=2)
    assert small.k == 2 and torch.equal(small.vectors, big.vectors[:2])
    ids = torch.tensor([1, 2, 3])
    with torch.no_grad():
        def slot_logits(la):
            x = torch.cat([model.model.embed_tokens(ids), la.inputs()])[None]
            return model(inputs_embeds=x).logits[0, len(ids):]
        torch.testing.assert_close(slot_logits(small), slot_logits(big)[:2])


# --- greedy equality and exactness on a tiny Llama -------------------------------------------------


@pytest.mark.parametrize("k", [1, 3])
def test_both_variants_are_greedy_at_temperature_zero_on_a_tiny_llama(k):
    target = tiny_llama(2, seed=0)
    la = random_lookahead(target, k, seed=1)
    for prompt in ([1, 2], [3, 4, 5, 1]):
        greedy = ll.generate(target, [prompt], max_new_tokens=30, temperature=0, eos_token_id=[]).new_tokens[0].tolist()
        two = speculative_generate(target, la, [prompt], gamma=k + 1, max_new_tokens=30, temperature=0, eos_token_id=[])
        assert two.new_tokens[0].tolist() == greedy
        assert min(a[0] for a in two.accepted) >= 1  # the real position's token is the target's own
        for prefixes in ("all", "likely"):
            one = pass_generate(target, la, [prompt], max_new_tokens=30, prefixes=prefixes, eos_token_id=[])
            assert one.new_tokens[0].tolist() == greedy
            assert one.model_calls < 30  # some drafts were kept


def test_two_call_batches_rows_of_different_lengths():
    target = tiny_llama(2, seed=0)
    la = random_lookahead(target, 2, seed=1)
    prompts = [[1, 2], [3, 4, 5, 1, 2]]
    out = speculative_generate(target, la, prompts, gamma=3, max_new_tokens=20, temperature=0, eos_token_id=[])
    for prompt, tokens in zip(prompts, out.new_tokens):
        greedy = ll.generate(target, [prompt], max_new_tokens=20, temperature=0, eos_token_id=[]).new_tokens[0]
        assert tokens.tolist() == greedy.tolist()
    # The drafting pass's real position must be the target's own prediction in every row: with a
    # wrong position or padding it would not be, and the first draft would be rejected.
    assert min(min(nums) for nums in out.accepted) >= 1


def test_single_call_tree_pass_equals_separate_plain_passes():
    # Every slot group, and the chain, must see exactly what a plain causal pass over its own
    # prefix sees: the cache, the pending token, its drafts, its earlier slots. Nothing else.
    target = tiny_llama(2, seed=0)
    la = random_lookahead(target, 3, seed=4)
    context, pending, drafts = [1, 2, 3], torch.tensor(4), torch.tensor([5, 1])
    groups = {0: 3, 1: 2, 2: 3}
    with torch.no_grad():
        cache = target(input_ids=torch.tensor([context]), use_cache=True).past_key_values
        _, hidden = lookahead_module.single_call_forward(target, la, cache, pending, drafts, groups)

        def plain(tokens, slots):
            x = torch.cat([target.model.embed_tokens(torch.tensor(tokens)), la.inputs(slots)])[None]
            return target.model(inputs_embeds=x).last_hidden_state[0, len(context):]

        chain = context + [4, 5, 1]
        torch.testing.assert_close(hidden[:3], plain(chain, 0), atol=1e-5, rtol=1e-4)
        at = 3
        for j, size in groups.items():
            expected = plain(context + [4] + drafts[:j].tolist(), size)[-size:]
            torch.testing.assert_close(hidden[at: at + size], expected, atol=1e-5, rtol=1e-4)
            at += size


@pytest.mark.statistical
def test_two_call_pass_is_exact_at_temperature_one_with_untrained_embeddings():
    target = tiny_llama(2, seed=0, vocab=4)
    la = random_lookahead(target, 2, seed=1)
    length, rows = 4, 20_000
    out = speculative_generate(target, la, [[1, 2]], gamma=3, max_new_tokens=length, temperature=1.0,
                               eos_token_id=[], num_return_sequences=rows, generator=torch.Generator().manual_seed(0))
    # The first draft is the target's own sample: accepted (up to rounding between two passes).
    assert out.acceptance_by_position()[0] > 0.999
    assert 0.05 < out.acceptance_by_position()[1:].mean() < 0.95  # the look-ahead drafts are tested
    probs = exact_llama_probs(target, [1, 2], length, SamplingConfig(temperature=1.0))
    assert pooled_pvalue(out.new_tokens, probs) > P_MIN


# Runs per single-call exactness test (pass_generate takes one row, so each is a separate run).
# Enough power: with the wrong q below, 2000 runs gave p = 3e-42 (1500 gave 9e-35), far under P_MIN.
SINGLE_CALL_RUNS = 2000


def single_call_samples(target, la, prefixes, n, length=5):
    g = torch.Generator().manual_seed(0)
    runs = [pass_generate(target, la, [[1, 2]], max_new_tokens=length, temperature=1.0, prefixes=prefixes,
                          eos_token_id=[], generator=g) for _ in range(n)]
    return [r.new_tokens[0] for r in runs], [a[0] for r in runs for a in r.accepted]


@pytest.mark.slow
@pytest.mark.parametrize("prefixes", ["all", "likely"])
def test_single_call_pass_is_exact_at_temperature_one_with_untrained_embeddings(prefixes):
    # Length 5: the second call verifies the prefill's two drafts and places slots after the
    # empty prefix and after draft 1 (with "all"); the next calls verify what those drafted.
    # Drafts from the prefill and from both kinds of slot group are tested.
    target = tiny_llama(2, seed=0, vocab=4)
    la = random_lookahead(target, 2, seed=1)
    samples, accepted = single_call_samples(target, la, prefixes, SINGLE_CALL_RUNS)
    assert 0 < sum(accepted) < len(accepted)
    probs = exact_llama_probs(target, [1, 2], 5, SamplingConfig(temperature=1.0))
    assert pooled_pvalue(samples, probs) > P_MIN


@pytest.mark.slow
def test_the_single_call_exactness_test_detects_a_wrong_q(monkeypatch):
    # Drafts drawn from one distribution but verified as if from another: the output is biased,
    # and the same test must see it.
    target = tiny_llama(2, seed=0, vocab=4)
    la = random_lookahead(target, 2, seed=1)
    draw = lookahead_module.draw

    def wrong_q(logits, config, generator):
        tokens, _ = draw(logits, config, generator)
        return tokens, torch.softmax(logits.float() * 0.5, dim=-1)

    monkeypatch.setattr(lookahead_module, "draw", wrong_q)
    samples, _ = single_call_samples(target, la, "all", SINGLE_CALL_RUNS)
    probs = exact_llama_probs(target, [1, 2], 5, SamplingConfig(temperature=1.0))
    assert pooled_pvalue(samples, probs) < P_MIN


# --- training, saving, arguments ---------------------------------------------------------------


def tiny_rows(model, n=12, new=12):
    """Training rows as logitlab.training.data makes them: the model's own continuations and top logits."""
    prompts = [[1, 2], [3, 4, 5], [2, 5, 1, 3]]
    rows = generate_with_logits(model, [prompts[i % 3] for i in range(n)], [1.0] * n, new, 4,
                                torch.Generator().manual_seed(0))
    return rows


def test_training_reduces_the_lookahead_loss():
    import random

    model = tiny_llama(2, seed=0)
    rows = tiny_rows(model)

    def loss(la):
        with torch.no_grad():
            return lookahead_losses(la, rows, 8, random.Random(1)).mean().item()

    before = loss(LookaheadEmbeddings(model, 3, seed=0))
    trained, losses = train_lookahead(model, 3, rows, steps=60, lr=0.05, batch=4, groups=4, progress=False)
    assert len(losses) == 60 and len(losses[0]) == 3
    assert loss(trained) < 0.8 * before
    assert all(p.requires_grad for p in model.parameters())  # the model is given back as it was
    assert [p for p in trained.parameters()] == [trained.vectors]  # the model is not a submodule


def test_token_sequences_are_turned_into_rows_of_the_model_own_logits():
    model = tiny_llama(2, seed=0)
    seqs = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5], torch.tensor([2, 3, 1, 4, 0, 5, 2, 3])]
    rows = rows_from_tokens(model, seqs, top=3)
    tokens, start, topv, topi = rows[1]
    assert start == 1 and tokens.tolist() == [2, 3, 1, 4, 0, 5, 2, 3] and topv.shape == (7, 3)
    with torch.no_grad():
        logits = model(input_ids=tokens[None]).logits[0, :-1]
    assert topi[:, 0].long().tolist() == logits.argmax(-1).tolist()  # position t predicts token t + 1
    _, losses = train_lookahead(model, 2, seqs, steps=2, batch=2, groups=2, progress=False)
    assert len(losses) == 2


def test_save_and_load_round_trip(tmp_path):
    model = tiny_llama(2, seed=0)
    la = random_lookahead(model, 3, seed=2)
    save_lookahead(la, tmp_path / "la.safetensors")
    loaded = load_pretrained(model, tmp_path / "la.safetensors")
    assert loaded.k == 3 and torch.equal(loaded.vectors, la.vectors)
    assert lookahead_module.training_curve(tmp_path / "la.safetensors") is None
    save_lookahead(la, tmp_path / "curve.safetensors", losses=[[1.0, 2.0, 3.0], [0.5, 1.5, 2.5]])
    assert lookahead_module.training_curve(tmp_path / "curve.safetensors").tolist() == [[1.0, 2.0, 3.0],
                                                                                       [0.5, 1.5, 2.5]]
    assert torch.equal(load_pretrained(model, tmp_path / "curve.safetensors").vectors, la.vectors)
    with pytest.raises(ValueError, match="k must"):
        load_pretrained(model, tmp_path / "la.safetensors", k=4)
    with pytest.raises(ValueError, match="embedding size"):
        load_pretrained(tiny_llama_with_hidden(32), tmp_path / "la.safetensors")


def tiny_llama_with_hidden(hidden):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=6, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


def test_bad_arguments_raise():
    model = tiny_llama(2, seed=0)
    la = random_lookahead(model, 2, seed=0)
    with pytest.raises(ValueError, match="k "):
        LookaheadEmbeddings(model, 0)
    with pytest.raises(ValueError, match="model must"):
        LookaheadEmbeddings(ll.toy_model(vocab_size=5), 2)
    with pytest.raises(ValueError, match="prefixes"):
        pass_generate(model, la, [[1, 2]], max_new_tokens=4, prefixes="best")
    with pytest.raises(ValueError, match="one prompt"):
        pass_generate(model, la, [[1, 2], [3, 4]], max_new_tokens=4)
    with pytest.raises(ValueError, match="another model"):
        pass_generate(tiny_llama(2, seed=1), la, [[1, 2]], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        pass_generate(model, la, [[1, 2]], max_new_tokens=0)
    with pytest.raises(ValueError, match="prefill"):
        la.propose(torch.tensor([1]), 2, SamplingConfig(temperature=0))
    with pytest.raises(ValueError, match="another model"):
        speculative_generate(tiny_llama(2, seed=1), la, [[1, 2]], gamma=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="k=3"):
        train_lookahead(model, 3, tiny_rows(model, n=4), steps=1, lookahead=la)
    rows = tiny_rows(model, n=4)
    with pytest.raises(ValueError, match="steps"):
        train_lookahead(model, 2, rows, steps=0)
    with pytest.raises(ValueError, match="lr"):
        train_lookahead(model, 2, rows, steps=1, lr=-1.0)
    with pytest.raises(ValueError, match="data"):
        train_lookahead(model, 2, rows[:1], steps=1, batch=2)
    with pytest.raises(ValueError, match="tokenizer"):
        train_lookahead(model, 2, ["some text", "more text"], steps=1, batch=2)
    with pytest.raises(ValueError, match="too short"):
        train_lookahead(model, 20, rows, steps=1, batch=2, progress=False)
    with pytest.raises(ValueError, match="SmolLM2"):
        load_pretrained(model)


# --- the shipped embeddings on SmolLM2 -----------------------------------------------------------


@pytest.mark.slow
def test_shipped_embeddings_are_tiny_and_both_variants_are_greedy_on_smollm2(smollm):
    model, tok = smollm
    assert lookahead_module.PRETRAINED_LOOKAHEAD.stat().st_size < 50_000
    prompt = tok.apply_chat_template([{"role": "user", "content": "Explain how a bicycle stays upright."}],
                                     add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    greedy = ll.generate(model, prompt, max_new_tokens=40, temperature=0, eos_token_id=[]).new_tokens[0].tolist()
    la = load_pretrained(model, k=4)
    two = speculative_generate(model, la, prompt, gamma=5, max_new_tokens=40, temperature=0, eos_token_id=[])
    assert two.new_tokens[0].tolist() == greedy
    for prefixes in ("all", "likely"):
        one = pass_generate(model, la, prompt, max_new_tokens=40, prefixes=prefixes, eos_token_id=[])
        assert one.new_tokens[0].tolist() == greedy
        assert one.model_calls < 40  # plain decoding needs 40 passes (the prefill included)


@pytest.mark.slow
def test_the_shipped_first_slot_beats_untrained_embeddings_on_greedy_answers(smollm):
    # Slot 1's top-1 accuracy on the model's own greedy answers to four prompts, against the
    # target's next-next token, for the shipped vectors and for untrained ones (mean embedding
    # plus noise): about 0.31 against 0.13 here (0.24 on the training script's held-out text).
    from logitlab.bench.prompts import DRAFT_PROMPTS, chat
    from logitlab.training.lookahead import slot_accuracy

    model, tok = smollm
    rows = []
    with torch.no_grad():
        for question in DRAFT_PROMPTS + ["Explain how a bicycle stays upright.",
                                         "Give three tips for learning a new language."]:
            prompt = chat(tok, question)
            answer = ll.generate(model, prompt, max_new_tokens=64, temperature=0, eos_token_id=[])
            tokens, _, topv, topi = rows_from_tokens(model, [answer.sequences[0].tolist()])[0]
            n = prompt.shape[1]  # new tokens start here; the recorded logits one position earlier
            rows.append((tokens, n, topv[n - 1:], topi[n - 1:]))
        trained = slot_accuracy(load_pretrained(model, k=4), rows, groups=60)
        untrained = slot_accuracy(LookaheadEmbeddings(model, 4, seed=0), rows, groups=60)
    assert trained[0] > untrained[0] + 0.05, (trained, untrained)


def test_the_training_loss_is_the_kl_of_each_slot_after_its_own_context():
    # Brute force: for one context end t, a plain pass over the tokens up to t and the k vectors;
    # slot i's log-probabilities against the target's recorded top logits at position t + i.
    import random

    import torch.nn.functional as F

    model = tiny_llama(2, seed=0)
    la = random_lookahead(model, 3, seed=5)
    rows = tiny_rows(model, n=2, new=10)
    rng = random.Random(3)
    got = lookahead_losses(la, rows, 1, rng)  # one context per row
    rng = random.Random(3)
    expected = torch.zeros(3)
    for tokens, start, topv, topi in rows:
        t = rng.randint(start - 1, len(tokens) - 2 - 3)
        with torch.no_grad():
            x = torch.cat([model.model.embed_tokens(tokens[: t + 1]), la.inputs()])[None]
            logq = F.log_softmax(model(inputs_embeds=x).logits[0, t + 1:].float(), dim=-1)  # the 3 slots
        for i in range(1, 4):
            row = t + i - (start - 1)
            logp = F.log_softmax(topv[row].float(), dim=-1)
            expected[i - 1] += (logp.exp() * (logp - logq[i - 1][topi[row].long()])).sum() / len(rows)
    torch.testing.assert_close(got.detach(), expected, atol=1e-4, rtol=1e-4)


def test_kept_row_caches_give_the_losses_and_training_of_a_fresh_pass(monkeypatch):
    import random

    from logitlab.training import lookahead as training

    model = tiny_llama(2, seed=0)
    la = random_lookahead(model, 3, seed=5)
    rows = tiny_rows(model, n=3, new=10)  # prompts of 2, 3 and 4 tokens: rows of three lengths
    fresh = lookahead_losses(la, rows, 4, random.Random(3))
    kept = lookahead_losses(la, rows, 4, random.Random(3), training.row_caches(model, rows))
    torch.testing.assert_close(kept, fresh, atol=1e-6, rtol=1e-5)
    assert kept.requires_grad  # the slots still carry the gradient
    # Training keeps the caches when the rows are few; without them it recomputes every step.
    _, with_caches = train_lookahead(model, 2, tiny_rows(model), steps=5, batch=3, groups=2, progress=False)
    monkeypatch.setattr(training, "ROW_CACHE_TOKENS", 0)
    _, without = train_lookahead(model, 2, tiny_rows(model), steps=5, batch=3, groups=2, progress=False)
    torch.testing.assert_close(torch.tensor(with_caches), torch.tensor(without), atol=1e-5, rtol=1e-4)


def test_rows_and_states_come_from_one_pass_and_equal_the_two_pass_results():
    from logitlab.training.lookahead import rows_and_states
    from logitlab.training.medusa import hidden_states

    model = tiny_llama(2, seed=0)
    seqs = [[1, 2, 3, 4, 5], [2, 3, 1], [5, 4, 3, 2, 1, 0, 1]]
    rows, states = rows_and_states(model, seqs, top=3)
    for (tokens, start, v, i), (t2, s2, v2, i2) in zip(rows, rows_from_tokens(model, seqs, top=3)):
        assert torch.equal(tokens, t2) and start == s2 == 1 and torch.equal(v, v2) and torch.equal(i, i2)
    for got, expected, seq in zip(states, hidden_states(model, rows), seqs):
        assert got.shape == (len(seq) - 1, 16)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
