"""Feature-level drafting (logitlab.speculative.eagle): the drafter reads the right features at the right
places, its chains and dynamic trees leave greedy decoding unchanged and sampling exact, and the
shipped drafter on SmolLM2.

Statistical tests reject at a p-value below 1e-4 (P_MIN), the false-positive rate of each test
when the code is right.
"""

import json

import pytest
import torch
from test_medusa import pooled_chi_square_pvalue
from test_speculative import P_MIN, exact_llama_probs, tiny_llama

import logitlab as ll
from logitlab import fast_cpu
from logitlab.speculative.eagle import EagleDrafter, FeatureDrafter, load_pretrained, save_drafter
from logitlab.sampling.pipeline import SamplingConfig
from logitlab.speculative.loop import speculative_generate
from logitlab.training.eagle import (accuracy, batch_tensors, cropped, row_features, runs_before, starting_drafter,
                                     train)


class Proposals(EagleDrafter):
    """An EagleDrafter that keeps every tree it proposes (``self.trees``)."""

    def propose(self, *args, **kwargs):
        tree = super().propose(*args, **kwargs)
        self.trees = getattr(self, "trees", []) + [tree]
        return tree


@pytest.fixture(scope="module")
def trained():
    """A tiny target and a drafter trained on its own samples (150 steps, a few seconds); the rows
    and features it learnt from, and its accuracy before training."""
    target = tiny_llama(2, seed=0)
    gen = torch.Generator().manual_seed(0)
    prompts = [[int(a), int(b)] for a, b in torch.randint(1, 6, (64, 2), generator=gen)]
    out = ll.generate(target, prompts, max_new_tokens=24, eos_token_id=[], generator=gen)
    rows = [(s, 2, None, None) for s in out.sequences]
    feats = row_features(target, rows)
    drafter = FeatureDrafter(target)
    before = accuracy(drafter, rows, feats)
    losses = train(drafter, rows, feats, steps=150, lr=3e-3, batch=16, unroll=2, progress=False)
    return target, drafter, rows, feats, before, losses


def test_mixed_precision_training_teaches_it_as_well(trained):
    target, _, rows, feats, before, float32_losses = trained
    drafter = FeatureDrafter(target)
    losses = train(drafter, rows, feats, steps=150, lr=3e-3, batch=16, unroll=2, progress=False,
                   autocast=torch.bfloat16)
    after = accuracy(drafter, rows, feats)
    assert after[0] > max(0.85, before[0] + 0.15) and after[1] > 0.8, (before, after)
    assert sum(losses[-10:]) < 0.7 * sum(losses[:10])
    assert drafter.fc.weight.dtype == torch.float32  # the weights stay float32
    assert losses[0] != float32_losses[0]  # the same first step, in another precision


def test_training_teaches_the_drafter_the_target_and_saves_what_it_learnt(trained, tmp_path):
    target, drafter, rows, feats, before, losses = trained
    after = accuracy(drafter, rows, feats)
    # First and second guesses (from the target's feature; from the drafter's own prediction).
    # It starts as the target's first layer reading tokens only, already a fair guesser on a
    # two-layer target; training must add what the features tell.
    assert after[0] > max(0.85, before[0] + 0.15) and after[1] > 0.8, (before, after)
    assert sum(losses[-10:]) < 0.7 * sum(losses[:10])
    save_drafter(drafter, tmp_path / "d.safetensors")
    loaded = load_pretrained(target, tmp_path / "d.safetensors")
    assert abs(accuracy(loaded, rows, feats)[0] - after[0]) < 0.02  # float16 weights
    with pytest.raises(ValueError, match="target"):
        load_pretrained(tiny_llama(2, seed=0, vocab=4), tmp_path / "d.safetensors")


def test_a_training_continues_from_a_saved_drafter(trained, tmp_path):
    target, drafter, rows, feats, _, _ = trained
    save_drafter(drafter, tmp_path / "d.safetensors")
    fast_cpu.enable(target)  # as ll.load leaves the target: the loading gives the drafter the fast path too
    try:
        start = starting_drafter(target, rows, 2048, None, tmp_path / "d.safetensors")
        # It starts where the saved one ended (float16 weights), with its vocabulary, and without the
        # fast path's packed copies of its weights, which training would leave stale.
        assert abs(accuracy(start, rows, feats)[0] - accuracy(drafter, rows, feats)[0]) < 0.02
        assert torch.equal(start.lm_head.vocab, drafter.lm_head.vocab) and not start.logitlab_fast_cpu
        train(start, rows, feats, steps=5, lr=3e-3, batch=16, progress=False)
        ids, f, _ = batch_tensors(rows, feats, [0])
        with torch.no_grad():  # the trained weights are the ones a forward without gradients reads
            fresh = FeatureDrafter(target, start.lm_head.vocab)
            fresh.load_state_dict(start.state_dict())
            torch.testing.assert_close(start(f, ids)[0], fresh(f, ids)[0])
        assert not torch.equal(start.fc.weight, load_pretrained(target, tmp_path / "d.safetensors").fc.weight.float())
    finally:
        fast_cpu.disable(target)
    assert starting_drafter(target, rows, 3, None).lm_head.vocab.numel() == 3  # without init: a new drafter
    with pytest.raises(ValueError, match="init: the drafter saved there reads the target's layers None, not"):
        starting_drafter(target, rows, 2048, (1, 2), tmp_path / "d.safetensors")
    # The log of a continued run counts the runs before it, from the log saved beside the drafter.
    assert runs_before(None) == runs_before(tmp_path / "d.safetensors") == {"steps": 0, "train_seconds": 0}
    (tmp_path / "d.json").write_text(json.dumps({"steps_run": 521, "train_seconds": 3196,
                                                 "runs_before": {"steps": 100, "train_seconds": 600}}))
    assert runs_before(tmp_path / "d.safetensors") == {"steps": 621, "train_seconds": 3796}
    shipped = json.loads(ll.speculative.eagle.PRETRAINED.with_suffix(".json").read_text())["runs"]
    assert runs_before(ll.speculative.eagle.PRETRAINED) == {"steps": sum(r["steps_run"] for r in shipped),
                                                            "train_seconds": sum(r["train_seconds"] for r in shipped)}


def test_an_untrained_drafter_is_the_targets_first_layer_reading_only_the_token():
    target = tiny_llama(2, seed=0)
    drafter = FeatureDrafter(target)
    tokens = torch.tensor([[3, 1, 4, 1]])
    feats = torch.randn(1, 4, target.config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, _ = drafter(feats, tokens)
        blind, _ = drafter(torch.zeros_like(feats), tokens)
        first = target.model.norm(target.model(input_ids=tokens, output_hidden_states=True).hidden_states[1])
    torch.testing.assert_close(ours, blind)
    torch.testing.assert_close(ours, first, atol=1e-5, rtol=1e-4)


class Recording(EagleDrafter):
    """Records, at every call, the row's text so far and the feature the drafter predicted after it."""

    def propose(self, next_tokens, gamma, config, generator=None):
        self.catch_up_calls = getattr(self, "catch_up_calls", [])
        original = self.catch_up

        def recorded(tokens):
            h = original(tokens)
            self.catch_up_calls.append(h[0].clone())
            return h

        self.catch_up = recorded
        try:
            return super().propose(next_tokens, gamma, config, generator)
        finally:
            del self.catch_up


@pytest.mark.parametrize("tree", [None, dict(top_k=3, nodes=6)], ids=["chain", "tree"])
def test_the_drafter_reads_the_target_feature_of_every_kept_position(trained, tree):
    # At every call the drafter's prediction must be what it computes from scratch over the whole
    # text: the target's feature at each position paired with the token after it. An off-by-one
    # in the features handed over, a draft left in its cache, or a wrong position id changes it.
    target, feature_drafter = trained[:2]
    drafter = Recording(feature_drafter, tree=tree)
    prompt = [1, 2, 3]
    out = speculative_generate(target, drafter, [prompt], gamma=3, max_new_tokens=20, temperature=0, eos_token_id=[])
    text = out.sequences[0]
    with torch.no_grad():
        features = target.model(text[None]).last_hidden_state  # f_t for every position t
        reference, _ = feature_drafter(features[:, :-1], text[None, 1:])  # entry t: (f_t, x_{t+1})
    # Call i drafts after the text's first len(prompt) + (tokens emitted before call i) tokens.
    emitted = [1] + [n + 1 for n in (a[0] for a in out.accepted)]
    lengths = torch.tensor(emitted).cumsum(0)[:-1] + len(prompt)
    assert len(drafter.catch_up_calls) == len(out.accepted)
    for h, length in zip(drafter.catch_up_calls, lengths.tolist()):
        torch.testing.assert_close(h, reference[0, length - 2], atol=1e-5, rtol=1e-4)
    assert sum(a[0] for a in out.accepted) > 0  # some drafts were kept, so catching up fed several


def test_a_tree_of_one_child_per_node_drafts_the_greedy_chain(trained):
    # With top_k = 1 the dynamic tree is the drafter's greedy chain, built by the tree's own code
    # (its masks and position ids): every call must then keep exactly what the chain keeps.
    target, drafter = trained[:2]
    prompts = [[1, 2], [3, 4, 5, 1]]
    chain = speculative_generate(target, EagleDrafter(drafter), prompts, gamma=4, max_new_tokens=40,
                                 temperature=0, eos_token_id=[])
    tree = speculative_generate(target, EagleDrafter(drafter, tree=dict(top_k=1, nodes=4)), prompts, gamma=4,
                                max_new_tokens=40, temperature=0, eos_token_id=[])
    assert tree.accepted == chain.accepted
    assert len({n for a in chain.accepted for n in a}) > 2  # calls kept various numbers of drafts
    fixed = speculative_generate(target, EagleDrafter(drafter, tree=dict(branching=(1, 1, 1, 1))), prompts, gamma=4,
                                 max_new_tokens=40, temperature=0, eos_token_id=[])
    assert fixed.accepted == chain.accepted


def test_a_fixed_tree_is_the_dynamic_tree_that_expands_every_node():
    # Two levels of k: the dynamic tree expands its top k of k nodes, that is all of them, and keeps
    # all k + k * k candidates; a fixed (k, k) tree must propose exactly the same tree.
    target = tiny_llama(2, seed=0)
    drafter = FeatureDrafter(target)
    torch.nn.init.normal_(drafter.fc.weight, std=0.2, generator=torch.Generator().manual_seed(1))  # reads features too
    prompts = [[1, 2, 3], [4, 5]]
    drafters = [Proposals(drafter, tree=tree) for tree in (dict(top_k=3, nodes=12), dict(branching=(3, 3)))]
    runs = [speculative_generate(target, d, prompts, gamma=2, max_new_tokens=20, temperature=0, eos_token_id=[])
            for d in drafters]
    assert runs[0].accepted == runs[1].accepted and runs[0].model_calls == runs[1].model_calls
    for dynamic, fixed in zip(*(d.trees for d in drafters)):  # the same tokens in the same places
        assert torch.equal(dynamic.tokens, fixed.tokens) and dynamic.rows() == fixed.rows()


@pytest.mark.parametrize("settings", [dict(temperature=0), dict(temperature=1.0), dict(temperature=0.7, top_p=0.8),
                                      dict(temperature=1.3, top_n_sigma=1.0), dict(temperature=1.0, top_k=20),
                                      dict(temperature=0.9, min_p=0.2, typical_p=0.9), dict(temperature=1.0, eta_cutoff=0.05),
                                      dict(temperature=1.0, top_h=0.5)],
                         ids=["T=0", "T=1", "top-p", "top-nsigma", "top-k above K", "min-p typical", "eta", "top-H"])
def test_tree_nodes_are_ranked_on_the_scored_tokens_as_on_the_whole_vocabulary(settings):
    # The tree ranks nodes on the K tokens the output layer scores; on the whole vocabulary (the
    # others at -inf) every rule must give the same log-probabilities to those K and -inf elsewhere.
    target = tiny_llama(2, seed=0, vocab=16)
    vocab = torch.tensor([7, 2, 11, 5, 3, 13, 0, 9])  # out of order, half the vocabulary
    drafter = FeatureDrafter(target, vocab=vocab)
    h = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(0)) * 3
    config = SamplingConfig(**settings)
    full = drafter.logits(h)
    if config.temperature > 0:
        full = ll.sampling.pipeline.process_logits(full.reshape(-1, 16), config).view(full.shape)
    expected = torch.log_softmax(full, dim=-1)
    got = EagleDrafter(drafter).confidence(h, config)
    assert got.shape == (3, 4, len(vocab))
    torch.testing.assert_close(got, expected[..., vocab], rtol=0, atol=1e-5)
    outside = torch.ones(16, dtype=torch.bool)
    outside[vocab] = False
    assert expected[..., outside].isneginf().all()
    cuts = settings.keys() - {"temperature", "top_k"}  # top-k 20 keeps all K = 8: the k > K path
    assert got.isneginf().any() == bool(cuts)  # each rule does cut some of the K tokens here


@pytest.mark.parametrize("tree", [dict(top_k=3, nodes=6), dict(branching=(3, 2))], ids=["dynamic", "fixed"])
def test_a_tree_on_part_of_the_vocabulary_proposes_only_its_tokens_and_stays_greedy(tree):
    target = tiny_llama(2, seed=0, vocab=16)
    vocab = torch.tensor([7, 2, 11, 5, 3, 13, 0, 9])
    drafter = FeatureDrafter(target, vocab=vocab)

    drafting = Proposals(drafter, tree=tree)
    prompts = [[1, 2, 3], [4, 5]]
    run = speculative_generate(target, drafting, prompts, gamma=2, max_new_tokens=20, temperature=0, eos_token_id=[])
    plain = ll.generate(target, prompts, max_new_tokens=20, temperature=0, eos_token_id=[])
    assert [t.tolist() for t in run.new_tokens] == [t.tolist() for t in plain.new_tokens]
    proposed = torch.cat([t.tokens.flatten() for t in drafting.trees])
    assert set(proposed.tolist()) <= set(vocab.tolist()) and len(set(proposed.tolist())) > 3


@pytest.mark.parametrize("tree", [None, dict(top_k=2, nodes=5), dict(top_k=3, nodes=8), dict(branching=(3, 2, 1)),
                                  dict(branching=(2, 2, 2, 2))], ids=["chain", "k2", "k3", "fixed321", "fixed2222"])
def test_chains_and_dynamic_trees_are_greedy_in_a_batch(trained, tree):
    target, drafter = trained[:2]
    prompts = [[1, 2], [3, 4, 5, 1], [2], [5, 5, 4]]
    out = speculative_generate(target, EagleDrafter(drafter, tree=tree), prompts, gamma=3,
                               max_new_tokens=30, temperature=0, eos_token_id=[])
    for prompt, got in zip(prompts, out.new_tokens):
        greedy = ll.generate(target, [prompt], max_new_tokens=30, temperature=0, eos_token_id=[]).new_tokens[0]
        assert got.tolist() == greedy.tolist()
    assert sum(n for a in out.accepted for n in a) > 0


@pytest.mark.statistical
@pytest.mark.parametrize("tree", [None, dict(top_k=3, nodes=6), dict(branching=(2, 2))], ids=["chain", "tree", "fixed"])
@pytest.mark.parametrize("settings", [dict(temperature=1.0), dict(temperature=0.8, top_k=4)], ids=["T=1", "T=0.8 top-k 4"])
def test_chains_and_dynamic_trees_are_exact_at_temperature_above_zero(trained, tree, settings):
    target, drafter = trained[:2]
    prompt, rows, length = [1, 2], 10_000, 3
    out = speculative_generate(target, EagleDrafter(drafter, tree=tree), [prompt],
                               gamma=2, max_new_tokens=length, eos_token_id=[], num_return_sequences=rows,
                               generator=torch.Generator().manual_seed(0), **settings)
    assert 0.05 < out.alpha < 0.99  # rejections too, by the hundred in 10 000 rows: both paths are tested
    probs = exact_llama_probs(target, prompt, length, SamplingConfig(**settings))
    assert pooled_chi_square_pvalue(out.new_tokens, probs) > P_MIN


def test_bad_arguments_raise():
    target = tiny_llama(2, seed=0)
    drafter = FeatureDrafter(target)
    with pytest.raises(ValueError, match="FeatureDrafter"):
        EagleDrafter(target)
    with pytest.raises(ValueError, match="tree"):
        EagleDrafter(drafter, tree=dict(top_k=2))
    with pytest.raises(ValueError, match="branching"):
        EagleDrafter(drafter, tree=dict(branching=(2, 0)))
    with pytest.raises(ValueError, match="tree"):
        EagleDrafter(drafter, tree=dict(branching=()))
    with pytest.raises(ValueError, match="tree"):
        EagleDrafter(drafter, tree=dict(top_k=0, nodes=4))
    with pytest.raises(ValueError, match="children per node"):
        EagleDrafter(drafter, tree=dict(top_k=7, nodes=4))
    with pytest.raises(ValueError, match="target"):
        FeatureDrafter(ll.toy_model(vocab_size=5))


def test_a_drafter_fusing_several_layers_reads_them_where_it_should(tmp_path):
    # EAGLE-3's fused features: the outputs of layers 1 and 3 of a 3-layer target, concatenated.
    target = tiny_llama(3, seed=0)
    gen = torch.Generator().manual_seed(0)
    prompts = [[int(a), int(b)] for a, b in torch.randint(1, 6, (64, 2), generator=gen)]
    out = ll.generate(target, prompts, max_new_tokens=24, eos_token_id=[], generator=gen)
    rows = [(s, 2, None, None) for s in out.sequences]
    feats = row_features(target, rows, layers=(1, 3))
    with torch.no_grad():
        states = target.model(rows[0][0][None], output_hidden_states=True).hidden_states
    torch.testing.assert_close(feats[0], torch.cat([states[1][0], states[3][0]], dim=-1))
    drafter = FeatureDrafter(target, layers=(1, 3))
    train(drafter, rows, feats, steps=150, lr=3e-3, batch=16, progress=False)
    assert accuracy(drafter, rows, feats)[0] > 0.5
    recording = Recording(drafter)
    assert recording.feature_layers == (1, 3)
    prompt = [1, 2, 3]
    result = speculative_generate(target, recording, [prompt], gamma=3, max_new_tokens=20, temperature=0,
                                  eos_token_id=[])
    greedy = ll.generate(target, [prompt], max_new_tokens=20, temperature=0, eos_token_id=[]).new_tokens[0]
    assert result.new_tokens[0].tolist() == greedy.tolist() and sum(a[0] for a in result.accepted) > 0
    text = result.sequences[0]
    with torch.no_grad():
        fused = row_features(target, [(text, 3, None, None)], layers=(1, 3))[0]
        reference, _ = drafter(fused[None, :-1], text[None, 1:])
    lengths = torch.tensor([1] + [a[0] + 1 for a in result.accepted]).cumsum(0)[:-1] + len(prompt)
    for h, length in zip(recording.catch_up_calls, lengths.tolist()):
        torch.testing.assert_close(h, reference[0, length - 2], atol=1e-5, rtol=1e-4)
    save_drafter(drafter, tmp_path / "fused.safetensors")
    assert load_pretrained(target, tmp_path / "fused.safetensors").layers == (1, 3)
    with pytest.raises(ValueError, match="layers"):
        FeatureDrafter(target, layers=(1, 2))  # the top layer must come last


# --- the shipped drafter on SmolLM2 ------------------------------------------------------------


@pytest.mark.slow
def test_shipped_drafter_is_small_greedy_exact_and_trained():
    import json

    model, tokenizer = ll.load("smollm2-135m", device="cpu")
    assert ll.speculative.eagle.PRETRAINED.stat().st_size <= 10e6
    log = json.loads(ll.speculative.eagle.PRETRAINED.with_suffix(".json").read_text())
    for run in log["runs"]:  # every step logged, the held-out accuracy measured after the last
        assert len(run["loss"]) == run["steps_run"] == run["held_out_accuracy"][-1][0]
    for before, after in zip(log["runs"], log["runs"][1:]):  # each run continued the one before
        assert after["held_out_accuracy"][0][1:] == pytest.approx(before["held_out_accuracy"][-1][1:], abs=2e-3)
    drafter = load_pretrained(model)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Explain how a refrigerator keeps food cold."}],
                                           add_generation_prompt=True, tokenize=False)
    common = dict(tokenizer=tokenizer, max_new_tokens=48, temperature=0, eos_token_id=[])
    greedy = ll.generate(model, [prompt], **common)
    chain = speculative_generate(model, EagleDrafter(drafter), [prompt], gamma=3, **common)
    tree = speculative_generate(model, EagleDrafter(drafter, tree=dict(top_k=3, nodes=10)), [prompt], gamma=4, **common)
    assert chain.new_tokens[0].tolist() == greedy.new_tokens[0].tolist() == tree.new_tokens[0].tolist()
    # Trained: its first draft is kept far more often than untrained, and the tree keeps more per call.
    assert chain.acceptance_by_position()[0] > 0.15  # untrained (the first layer on tokens alone): about 0.08
    assert tree.tokens_per_call > chain.tokens_per_call > 1.1


def test_cropped_rows_lose_only_the_start_of_long_prompts():
    rows = [(torch.arange(8), 5, "v", "i"), (torch.arange(4), 2, "v", "i"), (torch.arange(9), 2, "v", "i")]
    out = cropped(rows, max_len=6)
    # 8 tokens, answer from 5: the first two prompt tokens go; the answer's position moves with them
    assert out[0][0].tolist() == [2, 3, 4, 5, 6, 7] and out[0][1] == 3
    assert out[1][0].tolist() == [0, 1, 2, 3] and out[1][1] == 2  # short enough: untouched
    # an answer longer than max_len keeps all of itself and the two tokens before it
    assert out[2][0].tolist() == list(range(9)) and out[2][1] == 2 and out[2][2:] == ("v", "i")


def test_features_of_cropped_rows_still_come_from_the_whole_row():
    target = tiny_llama(2, seed=0)
    rows = [(torch.tensor([1, 2, 3, 4, 5, 1, 2, 3]), 5, None, None), (torch.tensor([4, 5, 1, 2]), 2, None, None)]
    full = row_features(target, rows)
    kept = row_features(target, rows, max_len=6, dtype=torch.bfloat16)
    assert [len(f) for f in kept] == [len(r[0]) for r in cropped(rows, 6)] == [6, 4]
    assert kept[0].dtype == torch.bfloat16
    # the last six positions' features, as the pass over all eight tokens made them (not over six)
    torch.testing.assert_close(kept[0].float(), full[0][2:], atol=0.02, rtol=0.01)
    torch.testing.assert_close(kept[1].float(), full[1], atol=0.02, rtol=0.01)
    alone = row_features(target, [(rows[0][0][2:], 3, None, None)])[0]
    assert not torch.allclose(alone, full[0][2:], atol=0.02, rtol=0.01)


def test_features_batched_by_length_come_back_in_the_rows_order():
    # Rows of 8, 3, 6 and 4 tokens, two per pass: the passes pair them by length (3 with 4, 6 with
    # 8), and each row's features must still be its own, as a pass over it alone gives them.
    target = tiny_llama(2, seed=0)
    rows = [(torch.tensor(t), 1, None, None) for t in ([1, 2, 3, 4, 5, 1, 2, 3], [4, 5, 1], [3, 3, 1, 2, 5, 4], [2, 1, 4, 4])]
    batched = row_features(target, rows, batch=2)
    alone = [row_features(target, [r])[0] for r in rows]
    assert [len(f) for f in batched] == [8, 3, 6, 4]
    for b, a in zip(batched, alone):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
