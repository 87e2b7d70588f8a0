"""Token Recycling (logitlab.speculative.token_recycling): the template against a brute-force search,
the table read from the target's passes, the tree grown breadth-first through it, and the output
exact through the speculative loop (greedy equality, and a chi-square test of sampled outputs)."""

import itertools
import math
import random

import pytest
import torch

import logitlab as ll
from logitlab.speculative.token_recycling import TokenRecycler, best_size, template_chances, tree_template

from test_speculative import P_MIN, chi_square_pvalue, exact_sequence_probs, tiny_llama


def test_a_worked_template():
    # chances: root children 0.5 and 0.2; under the first, 0.25 and 0.1; under that, 0.125 ...
    assert tree_template(4, (0.5, 0.2)) == ([-1, 0, -1, 1], [0, 0, 1, 0])
    # A rank that was never kept (as measured_rank_probs reports it): its nodes only after the others.
    assert tree_template(3, (0.5, 0.0)) == ([-1, 0, 1], [0, 0, 0])


@pytest.mark.parametrize("seed", range(8))
def test_the_template_keeps_the_likeliest_paths(seed):
    rng = random.Random(seed)
    probs = sorted((rng.uniform(0.05, 0.9) for _ in range(rng.randrange(1, 4))), reverse=True)
    size = rng.randrange(1, 12)
    parents, ranks = tree_template(size, probs)
    assert all(-1 <= p < i for i, p in enumerate(parents))

    def chance(i):
        return probs[ranks[i]] * (chance(parents[i]) if parents[i] >= 0 else 1.0)

    chosen = sorted((chance(i) for i in range(size)), reverse=True)
    every = sorted((math.prod(probs[r] for r in path) for depth in range(1, size + 1)
                    for path in itertools.product(range(len(probs)), repeat=depth)), reverse=True)
    assert chosen == pytest.approx(every[:size])  # the best `size` of every path there is
    assert len({(p, r) for p, r in zip(parents, ranks)}) == size  # no node twice


def test_the_size_weighs_the_expected_tokens_against_the_pass_cost():
    probs = (0.5, 0.2)
    assert template_chances(*tree_template(4, probs), probs) == pytest.approx([0.5, 0.25, 0.2, 0.125])
    # 1 node: 1.5 tokens; 2: 1.75; 3: 1.95; 4: 2.075 expected tokens per call
    assert best_size({2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0}, probs) == 4  # passes cost the same: the largest
    assert best_size({2: 1.0, 3: 1.3, 4: 1.6, 5: 1.9}, probs) == 1  # 1.5 > 1.75 / 1.3 > ...
    assert best_size({2: 1.0, 3: 1.1, 4: 1.6, 5: 1.9}, probs) == 2  # 1.75 / 1.1 = 1.59
    assert best_size({2: 1.0, 3: 1.3, 4: 1.6}, probs, overhead=2.0) == 3  # a fixed cost favours larger trees
    with pytest.raises(ValueError, match="costs must map pass sizes >= 2"):
        best_size({1: 1.0})


def test_the_table_holds_the_targets_last_top_k_and_the_tree_reads_it_breadth_first():
    drafter = TokenRecycler(6, nodes=4, k=2, rank_probs=(0.5, 0.2))  # the worked template above
    logits = torch.tensor([[[0., 5, 4, 0, 0, 0], [0, 0, 0, 0, 9, 8]]])  # after token 1: 1, 2; after 3: 4, 5
    drafter.observe_logits(torch.tensor([[1, 3]]), logits)
    assert drafter.table[1].tolist() == [1, 2] and drafter.table[3].tolist() == [4, 5]
    assert drafter.table[0].tolist() == [0, 0]  # never seen
    drafter.observe_logits(torch.tensor([[1]]), torch.tensor([[[0., 0, 0, 7, 6, 0]]]))
    assert drafter.table[1].tolist() == [3, 4]  # the last time counts
    tree = drafter.propose(torch.tensor([1]), gamma=3, config=None)
    # node 0: table[1, 0] = 3; node 1 (its rank-0 child): table[3, 0] = 4; node 2: table[1, 1] = 4;
    # node 3 (node 1's rank-0 child): table[4, 0] = 0
    assert tree.tokens.tolist() == [[3, 4, 4, 0]] and tree.parents == [-1, 0, -1, 1] and tree.q is None
    shallow = drafter.propose(torch.tensor([1]), gamma=1, config=None)
    assert shallow.tokens.tolist() == [[3, 4]] and shallow.parents == [-1, -1]  # depth 1 only


def test_greedy_output_is_the_targets_own_and_the_table_pays():
    target = tiny_llama(2, 0, vocab=10)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5, 4]]
    plain = ll.generate(target, prompts, max_new_tokens=40, eos_token_id=[], temperature=0)
    drafter = TokenRecycler(10)
    for _ in range(2):  # the second run starts with the table the first one filled
        out = ll.speculative_generate(target, drafter, prompts, gamma=4, max_new_tokens=40, eos_token_id=[],
                                      temperature=0)
        assert [t.tolist() for t in out.new_tokens] == [t.tolist() for t in plain.new_tokens]
    assert out.model_calls < 20  # a tiny model repeats itself: the recycled guesses are kept
    # Each call's pass took the pending token and the tree's nodes (all 12 of the template, no
    # deeper than gamma = 4; fewer near the end, where fewer tokens are left): what the result
    # records as fed, beside the tree's depth.
    assert max(drafter.depths) <= 4 and len(out.fed) == len(out.drafted) == out.model_calls - 1
    assert out.fed[0] == 13 and all(d + 1 <= f <= 13 for d, f in zip(out.drafted, out.fed))


def test_a_table_given_is_a_warm_start_copied_and_checked():
    target = tiny_llama(2, 0, vocab=10)
    prompts = [[1, 2, 3, 1, 2, 3, 1, 2], [4, 5, 4, 5, 4]]
    common = dict(gamma=4, max_new_tokens=40, eos_token_id=[], temperature=0)
    cold = TokenRecycler(10)
    first = ll.speculative_generate(target, cold, prompts, **common)
    warm_table = cold.table.clone()
    warm = TokenRecycler(10, table=warm_table)
    assert warm.propose(torch.tensor([3]), gamma=4, config=None).tokens.tolist() == \
        cold.propose(torch.tensor([3]), gamma=4, config=None).tokens.tolist()  # the same guesses from the start
    again = ll.speculative_generate(target, warm, prompts, **common)
    assert [t.tolist() for t in again.new_tokens] == [t.tolist() for t in first.new_tokens]  # still exact
    assert again.model_calls < first.model_calls  # it starts knowing what the first run learnt
    assert torch.equal(warm_table, cold.table)  # copied: the table given is never changed
    with pytest.raises(ValueError, match=r"table must be None or an integer tensor of shape \(10, 8\)"):
        TokenRecycler(10, table=torch.zeros(10, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="table must be None or an integer tensor"):
        TokenRecycler(10, table=torch.zeros(10, 8))
    with pytest.raises(ValueError, match=r"table must hold token ids in \[0, 10\)"):
        TokenRecycler(10, table=torch.full((10, 8), 10))


def test_the_drafter_counts_how_often_each_rank_was_the_targets_top_token():
    drafter = TokenRecycler(6, nodes=4, k=2, rank_probs=(0.5, 0.2))  # nodes: rank 0, 0, 1, 0
    with pytest.raises(ValueError, match="no tree of this drafter has been verified yet"):
        drafter.measured_rank_probs()
    drafter.table = torch.tensor([[0, 1], [3, 4], [0, 1], [4, 5], [0, 2], [0, 1]])
    tree = drafter.propose(torch.tensor([1]), gamma=3, config=None)
    assert tree.tokens.tolist() == [[3, 4, 4, 0]]
    # the target's top token after the root (1), node 0 (3), node 1 (4), node 2 (4), node 3 (0)
    best = [3, 5, 0, 2, 1]
    logits = torch.nn.functional.one_hot(torch.tensor([best]), 6).float()
    drafter.observe_logits(torch.tensor([[1, 3, 4, 4, 0]]), logits)
    # node 0 (rank 0) = top after the root: hit; node 1 (rank 0) = 4, top after node 0 is 5: miss;
    # node 2 (rank 1) = 4, top after the root is 3: miss; node 3 (rank 0) = 0, top after node 1: hit
    assert drafter.measured_rank_probs() == pytest.approx([2 / 3, 0.0])
    drafter.observe_logits(torch.tensor([[2]]), logits[:, :1])  # a prefill is not a tree: not counted
    assert drafter.measured_rank_probs() == pytest.approx([2 / 3, 0.0])
    chain = TokenRecycler(6, nodes=2, k=3, rank_probs=(0.5, 0.2, 0.1))  # two nodes of rank 0: a chain
    chain.table = torch.tensor([[0, 1, 2], [3, 4, 5], [0, 1, 2], [4, 5, 0], [0, 2, 3], [0, 1, 2]])
    assert chain.propose(torch.tensor([1]), gamma=3, config=None).tokens.tolist() == [[3, 4]]
    chain.observe_logits(torch.tensor([[1, 3, 4]]), torch.nn.functional.one_hot(torch.tensor([[3, 4, 0]]), 6).float())
    assert chain.measured_rank_probs() == [1.0]  # ranks 2 and 3 were never drafted: nothing to report


@pytest.mark.statistical
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_output_follows_the_target_exactly(temperature):
    target = tiny_llama(1, 3, vocab=4)  # a tree needs a cache that keeps the kept path (the toy's cannot)
    prompt = [1, 2, 3, 1, 2]
    rows = 20_000
    out = ll.speculative_generate(target, TokenRecycler(4, nodes=6, k=3), [prompt], gamma=3, max_new_tokens=3,
                                  eos_token_id=[], num_return_sequences=rows, temperature=temperature,
                                  generator=torch.Generator().manual_seed(7))
    probs = exact_sequence_probs(target, prompt, 3, ll.SamplingConfig(temperature=temperature))
    assert chi_square_pvalue(out.new_tokens, probs) > P_MIN
    assert out.alpha > 0


@pytest.mark.parametrize("kwargs, message", [
    (dict(vocab_size=0), "vocab_size must be an integer >= 1"),
    (dict(vocab_size=5, nodes=0), "size must be an integer >= 1"),
    (dict(vocab_size=5, k=0), "k must be an integer >= 1"),
    (dict(vocab_size=5, rank_probs=(0.5, 1.5)), "rank_probs must be a non-empty sequence of probabilities"),
    (dict(vocab_size=5, rank_probs=(0.0, 0.0)), r"rank_probs must be .* not all 0"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TokenRecycler(**kwargs)
