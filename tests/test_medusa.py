"""Medusa heads (logitlab.speculative.medusa_heads, ll.speculative.medusa.MedusaDrafter): their construction, the hidden state
the loop hands them, exactness of the chain under rejection sampling, greedy equality of the
chain and of the tree, and the shipped heads on SmolLM2."""

from collections import Counter

import pytest
import torch
from scipy.stats import chisquare
from test_speculative import P_MIN, chi_square_pvalue, exact_llama_probs, tiny_llama

import logitlab as ll
from logitlab.speculative.medusa import MedusaDrafter
from logitlab.speculative.medusa_heads import MedusaHeads, load_pretrained, medusa_generate, save_heads
from logitlab.decoding.tree_shape import cartesian_tree
from logitlab.sampling.pipeline import SamplingConfig
from logitlab.speculative.loop import speculative_generate


def random_heads(model, num_heads=3, seed=0, scale=3.0, vocab=None):
    """Heads whose blocks are random (not the identity), so their guesses differ from the target's."""
    heads = MedusaHeads(model.lm_head.weight, num_heads, vocab)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for block in heads.blocks:
            block.linear.weight.copy_(scale * torch.randn(block.linear.weight.shape, generator=gen))
    return heads.eval()


def test_cartesian_tree_by_hand():
    assert cartesian_tree((2, 1)) == [-1, 0, 0, 1, 2]
    assert cartesian_tree((1, 2)) == [-1, 0, 1, 1]
    assert len(cartesian_tree((3, 2, 1))) == 1 + 3 + 6 + 6
    assert cartesian_tree(()) == [-1]  # the root alone: a call that only takes the next token
    for bad in [(2, 0), "21", (1.5,), (True,)]:
        with pytest.raises(ValueError, match="branching"):
            cartesian_tree(bad)


def test_untrained_heads_are_the_target_output_layer_and_a_subset_scores_only_itself():
    model = tiny_llama(2, seed=0)
    h = torch.randn(5, 16)
    heads = MedusaHeads(model.lm_head.weight, 2)
    with torch.no_grad():
        expected = model.lm_head(h)
        out = heads(h)
    assert out.shape == (5, 2, 6)
    torch.testing.assert_close(out[:, 0], expected)  # the blocks start at the identity
    torch.testing.assert_close(out[:, 1], expected)
    subset = MedusaHeads(model.lm_head.weight, 2, torch.tensor([1, 4]))
    with torch.no_grad():
        scores = subset(h)
    assert torch.isinf(scores[..., [0, 2, 3, 5]]).all()
    torch.testing.assert_close(scores[..., [1, 4]], expected[:, None, [1, 4]].expand(5, 2, 2))
    with pytest.raises(ValueError, match="num_heads"):
        MedusaHeads(model.lm_head.weight, 0)


def test_save_and_load_round_trip(tmp_path):
    model = tiny_llama(2, seed=0)
    heads = random_heads(model, 3, vocab=torch.tensor([0, 2, 3, 5]))
    save_heads(heads, str(tmp_path / "h.safetensors"))
    loaded = load_pretrained(model, tmp_path / "h.safetensors")
    assert loaded.num_heads == 3 and loaded.output.vocab.tolist() == [0, 2, 3, 5]
    h = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(h), heads(h), atol=0.05, rtol=0.01)  # float16 weights
    with pytest.raises(ValueError, match="target"):
        load_pretrained(ll.toy_model(vocab_size=5), tmp_path / "h.safetensors")


@pytest.mark.statistical
@pytest.mark.parametrize("settings", [dict(temperature=1.0), dict(temperature=0.9, top_k=3)],
                         ids=["T=1", "T=0.9 top-k 3"])
def test_rejection_sampling_with_sampled_head_proposals_is_exact(settings):
    # The heads' q at a position does not depend on the drafts before it; any q keeps the output
    # exact, as long as the proposal is drawn from the q the rule is given.
    target = tiny_llama(2, seed=0)
    drafter = MedusaDrafter(random_heads(target, 2, seed=1), proposals="sample")
    prompts, rows, length = [[1, 2], [3, 4, 5]], 20_000, 3
    out = speculative_generate(target, drafter, prompts, gamma=2, max_new_tokens=length, eos_token_id=[],
                               num_return_sequences=rows, generator=torch.Generator().manual_seed(0), **settings)
    assert 0.05 < out.alpha < 0.95
    for b, prompt in enumerate(prompts):
        samples = [t for t, i in zip(out.new_tokens, out.prompt_index) if i == b]
        assert chi_square_pvalue(samples, exact_llama_probs(target, prompt, length, SamplingConfig(**settings))) > P_MIN


@pytest.mark.parametrize("branching", [(2, 2), (3, 2, 1)])
def test_chain_and_tree_are_greedy_at_temperature_zero_on_a_tiny_llama(branching):
    # Random heads on a 6-token vocabulary: some guesses pass and many fail, so paths of every
    # length are kept and the cache is compacted to them. Any mistake there changes the output.
    target = tiny_llama(2, seed=0)
    heads = random_heads(target, 3, seed=2)
    for prompt in ([1, 2], [3, 4, 5, 1]):
        greedy = ll.generate(target, [prompt], max_new_tokens=30, temperature=0, eos_token_id=[]).new_tokens[0]
        chain = speculative_generate(target, MedusaDrafter(heads), [prompt], gamma=3, max_new_tokens=30,
                                     temperature=0, eos_token_id=[])
        tree = medusa_generate(target, heads, [prompt], branching=branching, max_new_tokens=30, eos_token_id=[])
        assert chain.new_tokens[0].tolist() == greedy.tolist()
        assert tree.new_tokens[0].tolist() == greedy.tolist()
        assert 0 < tree.alpha and sum(a[0] for a in tree.accepted) > sum(a[0] for a in chain.accepted) * 0.5
        assert {a[0] for a in tree.accepted} != {0}  # something was accepted


def test_a_batch_of_trees_is_greedy_row_by_row():
    # Rows of different lengths keep paths of different lengths in every call: the cache is
    # compacted row by row, and any mistake there changes some row's output.
    target = tiny_llama(2, seed=0)
    heads = random_heads(target, 3, seed=2)
    prompts = [[1, 2], [3, 4, 5, 1], [2], [5, 5, 4]]
    batch = medusa_generate(target, heads, prompts, branching=(3, 2, 1), max_new_tokens=30, eos_token_id=[])
    for prompt, got in zip(prompts, batch.new_tokens):
        greedy = ll.generate(target, [prompt], max_new_tokens=30, temperature=0, eos_token_id=[]).new_tokens[0]
        assert got.tolist() == greedy.tolist()
    assert len({tuple(a) for a in batch.accepted}) > 1  # rows kept different numbers of drafts


class SoftQOnTopK(MedusaDrafter):
    """The tempting mistake: the heads' top tokens, handed to verification with the heads' soft
    distributions as if they had been sampled from them."""

    def propose(self, next_tokens, gamma, config, generator=None):
        tree = super().propose(next_tokens, gamma, config, generator)
        logits = self.heads(self.hidden)[:, : tree.depth].float()
        heads_of_nodes = [d - 2 for d in ll.decoding.tree_shape.depths(tree.rows()[0])[1:]]
        tree.q = torch.softmax(logits[:, heads_of_nodes] / config.temperature, dim=-1)
        return tree


@pytest.mark.statistical
@pytest.mark.parametrize("proposals", ["argmax", "sample", "soft q on top-k"])
def test_trees_under_rejection_sampling_are_exact_and_the_test_catches_the_soft_q(proposals):
    target = tiny_llama(2, seed=0)
    heads = random_heads(target, 2, seed=1)
    make = SoftQOnTopK if proposals == "soft q on top-k" else MedusaDrafter
    drafter = make(heads, proposals="sample" if proposals == "sample" else "argmax", tree=(2, 2))
    prompt, rows, length = [1, 2], 10_000, 3
    out = speculative_generate(target, drafter, [prompt], gamma=2, max_new_tokens=length, eos_token_id=[],
                               num_return_sequences=rows, generator=torch.Generator().manual_seed(0))
    assert 0.05 < out.alpha < 0.95
    pvalue = pooled_chi_square_pvalue(out.new_tokens, exact_llama_probs(target, prompt, length, SamplingConfig()))
    assert (pvalue < P_MIN) if proposals == "soft q on top-k" else (pvalue > P_MIN)


def pooled_chi_square_pvalue(samples, probs, least=5):
    """The chi-square test with the sequences expected fewer than ``least`` times pooled into one
    cell: this target is so peaked that most sequences are expected less than once, where the
    test's approximation fails (one sequence of expected count 1e-3 seen once gives p = 1e-40)."""
    counts = Counter(tuple(t.tolist()) for t in samples)
    assert set(counts) <= set(probs), "a sequence of probability 0 was generated"
    n, total = len(samples), sum(probs.values())
    expected = {k: n * v / total for k, v in probs.items()}
    common = [k for k in expected if expected[k] >= least]
    observed = [counts.get(k, 0) for k in common] + [n - sum(counts.get(k, 0) for k in common)]
    wanted = [expected[k] for k in common] + [n - sum(expected[k] for k in common)]
    return chisquare(observed, wanted).pvalue


def test_tree_bad_arguments_raise():
    target = tiny_llama(2, seed=0)
    heads = random_heads(target, 2)
    class ChainOnly(ll.speculative.AcceptanceRule):
        def __call__(self, draft_tokens, q, p, target_logits, config, generator):
            return ll.speculative.greedy_verify(draft_tokens, target_logits)

    with pytest.raises(ValueError, match="cannot verify a tree"):
        medusa_generate(target, heads, [[1, 2]], max_new_tokens=5, temperature=1.0, branching=(2, 1),
                        acceptance=ChainOnly())
    with pytest.raises(ValueError, match=r"branching has 3 levels.*only 2"):
        medusa_generate(target, heads, [[1, 2]], max_new_tokens=5, branching=(2, 1, 1))
    with pytest.raises(ValueError, match="at least one level"):
        medusa_generate(target, heads, [[1, 2]], max_new_tokens=5, branching=())
    with pytest.raises(ValueError, match="guesses per head"):
        medusa_generate(target, heads, [[1, 2]], max_new_tokens=5, branching=(7,))
    with pytest.raises(ValueError, match="heads"):
        medusa_generate(target, MedusaDrafter(heads), [[1, 2]], max_new_tokens=5, branching=(2,))
    with pytest.raises(ValueError, match="max_new_tokens"):
        medusa_generate(target, heads, [[1, 2]], max_new_tokens=0, branching=(2, 1))
    with pytest.raises(ValueError, match="target"):
        medusa_generate(ll.toy_model(vocab_size=5), heads, [[1, 2]], max_new_tokens=5)
    with pytest.raises(ValueError, match="heads"):
        MedusaDrafter("heads")
    with pytest.raises(ValueError, match="proposals"):
        MedusaDrafter(heads, proposals="top")
    with pytest.raises(ValueError, match="target"):
        speculative_generate(ll.toy_model(vocab_size=6), MedusaDrafter(heads), [[1, 2]], gamma=2, max_new_tokens=4)


# --- the shipped heads on SmolLM2 --------------------------------------------------------------


class RecordingDrafter(MedusaDrafter):
    """Keeps the hidden state it was given at each proposal."""

    def start(self, input_ids, attention_mask, target=None, cache=None):
        super().start(input_ids, attention_mask, target, cache)
        self.seen = []

    def propose(self, next_tokens, gamma, config, generator=None):
        self.seen.append(self.hidden.clone())
        return super().propose(next_tokens, gamma, config, generator)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_heads_read_the_hidden_state_where_the_pending_token_was_predicted(smollm, temperature):
    model, tokenizer = smollm
    drafter = RecordingDrafter(load_pretrained(model))
    out = speculative_generate(model, drafter, ["The capital of France is"], tokenizer=tokenizer, gamma=3,
                               max_new_tokens=40, temperature=temperature, eos_token_id=[],
                               generator=torch.Generator().manual_seed(0))
    sequence = out.sequences[0]
    prompt_len = len(sequence) - len(out.new_tokens[0])
    with torch.inference_mode():
        fresh = model.model(sequence[None]).last_hidden_state[0]
    new_index = 0  # the pending token of each call is this new token
    for seen, accepted in zip(drafter.seen, out.accepted):
        # It was predicted at the position just before it.
        torch.testing.assert_close(seen[0], fresh[prompt_len + new_index - 1], atol=2e-3, rtol=1e-3)
        new_index += accepted[0] + 1
    assert len(drafter.seen) == len(out.accepted) > 5


@pytest.mark.slow
def test_shipped_heads_are_small_greedy_exact_and_beat_no_drafting(smollm):
    model, tokenizer = smollm
    assert ll.speculative.medusa_heads.PRETRAINED_HEADS.stat().st_size <= 5e6
    heads = load_pretrained(model)
    assert heads.num_heads >= 3
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Explain how a refrigerator keeps food cold."}],
                                           add_generation_prompt=True, tokenize=False)
    greedy = ll.generate(model, [prompt], tokenizer=tokenizer, max_new_tokens=48, temperature=0, eos_token_id=[])
    chain = speculative_generate(model, MedusaDrafter(heads), [prompt], tokenizer=tokenizer, gamma=3,
                                 max_new_tokens=48, temperature=0, eos_token_id=[])
    tree = medusa_generate(model, heads, [prompt], tokenizer=tokenizer, branching=(3, 2, 1), max_new_tokens=48,
                           eos_token_id=[])
    assert chain.new_tokens[0].tolist() == greedy.new_tokens[0].tolist() == tree.new_tokens[0].tolist()
    # Without drafting a call yields one token; measured here: 1.14 (chain) and 1.23 (tree).
    assert chain.tokens_per_call > 1.1
    assert tree.tokens_per_call > chain.tokens_per_call + 0.05
    typical = medusa_generate(model, heads, [prompt], tokenizer=tokenizer, branching=(3, 2, 1), max_new_tokens=24,
                              temperature=0.7, acceptance=ll.TypicalAcceptance(), eos_token_id=[],
                              generator=torch.Generator().manual_seed(0))
    assert len(typical.new_tokens[0]) == 24 and typical.tokens_per_call > 1


# --- the training script's data preparation ------------------------------------------------------


def test_training_tensors_pair_each_head_with_the_right_target_and_renormalise_on_the_vocabulary():
    from logitlab.training.medusa import accuracy, head_losses, training_tensors

    # One row with 4 recorded positions, top-2 logits each; the output vocabulary is {1, 3, 5}.
    topi = torch.tensor([[1, 2], [3, 5], [5, 1], [2, 0]], dtype=torch.int32)
    topv = torch.tensor([[2.0, 1.0], [0.0, 0.0], [1.0, 0.0], [3.0, 1.0]]).half()
    row = (torch.arange(10), 6, topv, topi)
    states = [torch.randn(4, 16)]
    hidden, sub, probs, target_row = training_tensors([row], states, torch.tensor([1, 3, 5]), 8, num_heads=2)
    # Head 1 at position j learns position j + 1's distribution, head 2 position j + 2's.
    assert target_row.tolist() == [[1, 2, 3, -1], [2, 3, -1, -1]]
    # Token 2 is outside the vocabulary: position 0 keeps only token 1 (index 0), with all the mass.
    assert sub[0].tolist()[0] == 0 and probs[0].tolist() == [1.0, 0.0]
    torch.testing.assert_close(probs[1], torch.tensor([0.5, 0.5]))  # tokens 3 and 5, equal logits
    assert sub[1].tolist() == [1, 2]
    assert probs[3].sum() == 0  # nothing of position 3 is in the vocabulary: it teaches nothing

    model = tiny_llama(2, seed=0)
    heads = MedusaHeads(model.lm_head.weight, 2, torch.tensor([1, 3, 5]))
    losses = head_losses(heads, hidden, sub, probs, target_row, torch.arange(4))
    assert losses.shape == (2,) and (losses >= 0).all()
    # A head that puts all its mass on the target's only token has zero loss there: check by hand.
    logq = torch.log_softmax(heads.small_logits(hidden[:1]).detach(), dim=-1)[0, 0]  # head 1 at position 0
    kl = -(probs[1] * logq[sub[1]]).sum() + (probs[1] * probs[1].log()).sum()
    both = head_losses(heads, hidden, sub, probs, target_row, torch.tensor([0]))
    torch.testing.assert_close(both[0].detach(), kl)
    assert len(accuracy(heads, hidden, sub, probs, target_row)) == 2


def test_hidden_states_are_those_of_the_positions_that_predict_new_tokens():
    from logitlab.training.medusa import hidden_states

    model = tiny_llama(2, seed=0)
    rows = [(torch.tensor([1, 2, 3, 4, 5]), 2, None, None), (torch.tensor([5, 4, 3]), 1, None, None)]
    states = hidden_states(model, rows)
    with torch.no_grad():
        for (tokens, new_from, _, _), got in zip(rows, states):
            alone = model.model(tokens[None]).last_hidden_state[0]  # no padding, one row at a time
            torch.testing.assert_close(got, alone[new_from - 1: len(tokens) - 1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_a_one_path_tree_is_the_chain_under_typical_acceptance(temperature):
    # With argmax proposals and Medusa's argmax next token nothing is random: a tree with one
    # guess per level must give the chain's tokens, the first token included.
    target = tiny_llama(2, seed=0)
    heads = random_heads(target, 3, seed=2)
    rule = ll.TypicalAcceptance(0.09, 0.3)
    for prompt in ([1, 2], [3, 4, 5, 1]):
        chain = speculative_generate(target, MedusaDrafter(heads), [prompt], gamma=3, max_new_tokens=25,
                                     temperature=temperature, acceptance=rule, eos_token_id=[])
        tree = medusa_generate(target, heads, [prompt], branching=(1, 1, 1), max_new_tokens=25,
                               temperature=temperature, acceptance=rule, eos_token_id=[])
        assert tree.new_tokens[0].tolist() == chain.new_tokens[0].tolist()
        assert [a[0] for a in tree.accepted] == [a[0] for a in chain.accepted]
        assert 0 < sum(a[0] for a in chain.accepted)  # some drafts were kept


def test_the_first_token_under_typical_argmax_is_the_target_argmax():
    target = tiny_llama(2, seed=0)
    with torch.no_grad():
        best = int(target(torch.tensor([[1, 2]])).logits[0, -1].argmax())
    for seed in range(5):
        out = speculative_generate(target, MedusaDrafter(random_heads(target, 2)), [[1, 2]], gamma=2, max_new_tokens=1,
                                   temperature=1.5, acceptance=ll.TypicalAcceptance(), eos_token_id=[],
                                   generator=torch.Generator().manual_seed(seed))
        assert out.new_tokens[0].tolist() == [best]
