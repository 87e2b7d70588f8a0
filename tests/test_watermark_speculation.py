"""Watermarks inside the speculative loop (logitlab.watermark.speculation, and the loop's
``logits_processor``): the loop hands each verified position its own text, so a processed target
gives ``ll.generate``'s tokens; keyed speculative sampling is exact over random contexts (a
chi-square test, with a biased control it must reject), a function of the key, and detected."""

import itertools

import pytest
import torch
from scipy.stats import chisquare

import logitlab as ll
from logitlab.sampling.pipeline import SamplingConfig
from logitlab.speculative.draft_model import DraftModelDrafter
from logitlab.speculative.loop import speculative_generate
from logitlab.watermark import GreenList, GumbelWatermark, KeyedDraftModel, KeyedRejectionSampling, gumbel, speculation

P_MIN = 1e-3  # an exact sampler fails each chi-square test with probability 0.001


@pytest.mark.parametrize("gamma", [1, 3])
def test_a_keyed_target_gives_generates_tokens_at_every_position(gamma):
    # GumbelWatermark makes the target a point mass on a token chosen from the whole text so far
    # (a window wider than any text here, so that no context repeats and no position falls back
    # to the generator): any slip in the text a position is handed (an off-by-one, the padding)
    # changes the tokens.
    target, draft = ll.toy_model(vocab_size=6, order=3, seed=0), ll.toy_model(vocab_size=6, order=2, seed=4)
    prompts = [[1, 2], [3, 4, 5, 0, 1]]
    mark = [GumbelWatermark(6, key=7, context_width=20)]
    common = dict(max_new_tokens=12, temperature=1.0, eos_token_id=[], logits_processor=mark)
    reference = ll.generate(target, prompts, generator=torch.Generator().manual_seed(0), **common)
    out = speculative_generate(target, DraftModelDrafter(draft), prompts, gamma=gamma,
                               generator=torch.Generator().manual_seed(1), **common)
    assert [t.tolist() for t in out.new_tokens] == [t.tolist() for t in reference.new_tokens]
    assert 0 < out.alpha < 1  # drafts are both kept and rejected


def test_a_green_list_on_both_sides_gives_the_greedy_tokens():
    target, draft = ll.toy_model(vocab_size=8, order=2, seed=1), ll.toy_model(vocab_size=8, order=2, seed=2)
    common = dict(max_new_tokens=16, temperature=0, eos_token_id=[])
    marked = ll.generate(target, [[3, 1]], logits_processor=[GreenList(8, gamma=0.5, delta=4.0, key=11)], **common)
    plain = ll.generate(target, [[3, 1]], **common)
    out = speculative_generate(target, DraftModelDrafter(draft, logits_processor=[GreenList(8, 0.5, 4.0, 11)]),
                               [[3, 1]], gamma=3, logits_processor=[GreenList(8, gamma=0.5, delta=4.0, key=11)],
                               **common)
    assert out.new_tokens[0].tolist() == marked.new_tokens[0].tolist() != plain.new_tokens[0].tolist()


# --- keyed speculative sampling: exact over contexts, fixed by the key ---------------------------

TARGET = dict(vocab_size=4, order=2, seed=3)  # the next token depends on the last one only
LENGTH = 3


def varied_prompts():
    """4,096 prompts that differ in six leading tokens and end alike: the toy target gives them
    the same continuations, while the keyed draws hash different contexts (12 tokens: the whole
    prompt is in every context, so no two rows share one): as good as 4,096 random keys."""
    return [list(head) + [1, 2] for head in itertools.product(range(4), repeat=6)]


def continuation_probs(model, last: int) -> dict:
    probs = {}
    for seq in itertools.product(range(4), repeat=LENGTH):
        p, prev = 1.0, last
        for token in seq:
            dist = torch.softmax(model(torch.tensor([[prev]])).logits[0, -1].double(), dim=-1)
            p, prev = p * float(dist[token]), token
        probs[seq] = p
    return probs


def chi_square_pvalue(outputs, probs):
    counts = {}
    for t in outputs:
        counts[tuple(t.tolist())] = counts.get(tuple(t.tolist()), 0) + 1
    keys = sorted(probs)
    return chisquare([counts.get(k, 0) for k in keys], [len(outputs) * probs[k] for k in keys]).pvalue


def keyed_run(rule, key=5, gamma=2):
    target, draft = ll.toy_model(**TARGET), ll.toy_model(vocab_size=4, order=3, seed=8)
    return speculative_generate(target, KeyedDraftModel(draft, key=key, context_width=12), varied_prompts(),
                                gamma=gamma, max_new_tokens=LENGTH, eos_token_id=[], acceptance=rule,
                                generator=torch.Generator().manual_seed(0))


def repeating_run(key: int, gamma: int = 2):
    """One text of keyed speculative sampling after [1, 2] with a one-token window: most contexts
    repeat within 3 tokens, where the drafter and the rule must both draw with the generator."""
    target, draft = ll.toy_model(**TARGET), ll.toy_model(vocab_size=4, order=3, seed=8)
    return speculative_generate(target, KeyedDraftModel(draft, key=key, context_width=1), [[1, 2]], gamma=gamma,
                                max_new_tokens=LENGTH, eos_token_id=[],
                                acceptance=KeyedRejectionSampling(4, key=key, context_width=1),
                                generator=torch.Generator().manual_seed(key))


@pytest.mark.statistical
def test_keyed_speculative_sampling_follows_the_target_where_contexts_repeat():
    outputs = [repeating_run(key).new_tokens[0] for key in range(1, 4_097)]
    assert chi_square_pvalue(outputs, continuation_probs(ll.toy_model(**TARGET), 2)) > P_MIN


def test_keyed_speculative_sampling_without_the_fallback_is_caught(monkeypatch):
    monkeypatch.setattr(speculation, "seen_before", lambda ids, width: False)
    outputs = [repeating_run(key).new_tokens[0] for key in range(1, 4_097)]
    assert chi_square_pvalue(outputs, continuation_probs(ll.toy_model(**TARGET), 2)) < 1e-6


@pytest.mark.statistical
def test_keyed_speculative_sampling_follows_the_target():
    out = keyed_run(KeyedRejectionSampling(4, key=5, context_width=12))
    assert chi_square_pvalue(out.new_tokens, continuation_probs(ll.toy_model(**TARGET), 2)) > P_MIN
    assert 0.2 < out.alpha < 0.95


# One call's first token, over 20,000 keys, with a drafter far from the target: its residual
# (tokens 0 and 1) holds tokens the drafter weighs differently, where a reused uniform shows.
P = torch.tensor([0.5, 0.3, 0.1, 0.1])
Q = torch.tensor([0.0, 0.25, 0.25, 0.5])


def first_tokens(rule_class) -> list[int]:
    text, tokens = torch.tensor([[3, 1, 4]]), []
    for key in range(1, 20_001):
        rule = rule_class(4, key=key)
        rule.text = text
        draft = gumbel.keyed_draw(Q, gumbel.keyed_uniforms([3, 1, 4], 4, key + speculation.DRAFT))
        num, nxt = rule(torch.tensor([[draft]]), Q[None, None], torch.stack([P, P])[None], None,
                        SamplingConfig(), None)
        tokens.append(draft if int(num) == 1 else int(nxt))
    return tokens


def test_the_keyed_rule_gives_the_targets_token_over_keys():
    counts = torch.bincount(torch.tensor(first_tokens(KeyedRejectionSampling)), minlength=4)
    assert chisquare(counts.numpy(), (P * 20_000).numpy()).pvalue > P_MIN


def test_a_residual_drawn_with_the_drafts_uniforms_is_caught():
    # The shortcut of one stream for the draft and the residual: the residual's draw then reuses
    # uniforms that already chose the rejected draft (they are no longer uniform), and is biased.
    class OneStream(KeyedRejectionSampling):
        def uniforms(self, row, extra, stream, size=None):
            return super().uniforms(row, extra, speculation.DRAFT if stream == speculation.RESIDUAL else stream, size)

    counts = torch.bincount(torch.tensor(first_tokens(OneStream)), minlength=4)
    assert chisquare(counts.numpy(), (P * 20_000).numpy()).pvalue < 1e-6


@pytest.mark.slow  # the real model's answers: statistics of our own code, not of a dependency's version
def test_the_key_fixes_the_text_and_the_detector_finds_it(smollm):
    model, tokenizer = smollm
    draft = ll.speculative.draft_model.load_pretrained(model)
    prompt = ll.chat_ids(tokenizer, "Write a short story about a lighthouse keeper.")
    vocab = model.config.vocab_size
    runs = [speculative_generate(model, KeyedDraftModel(draft, key=key), [prompt], gamma=3, max_new_tokens=40,
                                 acceptance=KeyedRejectionSampling(vocab, key=key), eos_token_id=[],
                                 generator=ll.generator(model, seed)) for key, seed in ((9, 0), (9, 1), (10, 0))]
    same, again, other = (r.new_tokens[0].tolist() for r in runs)
    # The generator plays no part until a context repeats (there it draws instead of the key).
    first_repeat = next((i for i in range(len(same)) if gumbel.seen_before(prompt + same[:i], 4)), len(same))
    assert first_repeat > 10 and same[:first_repeat] == again[:first_repeat]
    assert same != other  # the key decides
    found = gumbel.detect(same, vocab, key=9, prompt=prompt, streams=2)
    assert found.p_value < 1e-4, found
    assert gumbel.detect(other, vocab, key=9, prompt=prompt, streams=2).p_value > 1e-3


def test_bad_input_is_refused():
    target, draft = ll.toy_model(vocab_size=4, order=2, seed=3), ll.toy_model(vocab_size=4, order=2, seed=4)
    with pytest.raises(ValueError, match="temperature"):
        speculative_generate(target, KeyedDraftModel(draft), [[1, 2]], gamma=2, max_new_tokens=4, temperature=0,
                             acceptance=KeyedRejectionSampling(4))
    with pytest.raises(ValueError, match="key"):
        KeyedRejectionSampling(4, key=0)
    with pytest.raises(ValueError, match="context_width"):
        KeyedDraftModel(draft, context_width=0)
    with pytest.raises(ValueError, match="logits_processor"):
        speculative_generate(target, DraftModelDrafter(draft), [[1, 2]], gamma=2, max_new_tokens=4,
                             logits_processor=GreenList(4))
    with pytest.raises(ValueError, match="streams"):
        gumbel.detect([1, 2, 3], 4, streams=0)


def test_raw_log_probabilities_are_the_models_own_under_a_processor():
    # A keyed target is a point mass, so the sampled log-probabilities are 0; the raw ones must
    # stay the model's own, as ll.generate records them.
    target, draft = ll.toy_model(vocab_size=6, order=3, seed=0), ll.toy_model(vocab_size=6, order=2, seed=4)
    common = dict(max_new_tokens=10, temperature=1.0, eos_token_id=[],
                  logits_processor=[GumbelWatermark(6, key=3, context_width=20)])  # no context repeats
    reference = ll.generate(target, [[1, 2, 3]], generator=torch.Generator().manual_seed(0), **common)
    out = speculative_generate(target, DraftModelDrafter(draft), [[1, 2, 3]], gamma=2,
                               generator=torch.Generator().manual_seed(1), **common)
    assert out.new_tokens[0].tolist() == reference.new_tokens[0].tolist()
    assert torch.allclose(out.raw_logprobs[0], reference.raw_logprobs[0], atol=1e-5)
    assert (out.raw_logprobs[0] < 0).all() and torch.allclose(out.logprobs[0], torch.zeros(10))
