"""Token trees: exact masks and positions, one-pass scoring against path-by-path scoring (SmolLM2
and the toy model), exact path probabilities of tree sampling, Gumbel-top-k, the checker, and
argument checks. Statistical tests use fixed seeds and a false-positive rate of 1e-4."""

import itertools

import pytest
import torch
from scipy.stats import binomtest, chisquare

import logitlab as ll
from logitlab.course.checks import CheckFailed, check_tree_mask
from logitlab.sampling.pipeline import SamplingConfig, process_logits
from logitlab.decoding.tree_shape import tree_attention_mask, tree_position_ids
from logitlab.search.trees import TokenTree, gumbel_top_k, sample_tree, score_paths, score_tree

ALPHA = 1e-4  # the false-positive rate of every statistical test here

#   prompt ─┬─ 0 ─┬─ 2 ─── 5
#           │     └─ 3
#           └─ 1 ─── 4
PARENTS = [-1, -1, 0, 0, 1, 2]


def exact_logprob(model, prompt, tree, i, config=None):
    """log p(token i | prompt + its ancestors), from the toy model's exact distribution."""
    path = tree.ancestors(i)
    context = torch.tensor([prompt + tree.tokens[path[:-1]].tolist()])
    logits = model(context, use_cache=False).logits[:, -1]
    if config is not None:
        logits = process_logits(logits, config)
    return ll.log_softmax(logits)[0, tree.tokens[i]]


# --- Masks, positions and the TokenTree helpers --------------------------------------------------


def test_mask_and_positions_of_a_small_tree():
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [0, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [0, 1, 0, 0, 1, 0],
        [1, 0, 1, 0, 0, 1],
    ], dtype=torch.bool)
    mask = tree_attention_mask(PARENTS)
    assert mask.dtype == torch.bool and torch.equal(mask, expected)
    assert tree_position_ids(PARENTS, 7).tolist() == [7, 7, 8, 8, 8, 9]
    assert tree_position_ids(PARENTS).tolist() == [0, 0, 1, 1, 1, 2]


def test_chain_is_causal_and_star_is_diagonal():
    assert torch.equal(tree_attention_mask([-1, 0, 1, 2]), torch.ones(4, 4, dtype=torch.bool).tril())
    assert torch.equal(tree_attention_mask([-1, -1, -1]), torch.eye(3, dtype=torch.bool))
    assert torch.equal(tree_attention_mask(torch.tensor([-1])), torch.ones(1, 1, dtype=torch.bool))
    assert tree_position_ids([-1, 0, 1, 2], 3).tolist() == [3, 4, 5, 6]
    assert tree_position_ids([-1, -1, -1], 3).tolist() == [3, 3, 3]


def test_token_tree_helpers():
    tokens = torch.tensor([10, 11, 12, 13, 14, 15])
    lp = torch.tensor([-1.0, -2.0, -0.5, -0.25, -3.0, -0.125])
    tree = TokenTree(PARENTS, tokens, lp, 2 * lp)
    assert len(tree) == 6
    assert tree.depths == [1, 1, 2, 2, 2, 3]
    assert tree.children(-1) == [0, 1] and tree.children(0) == [2, 3] and tree.children(5) == []
    assert tree.leaves() == [3, 4, 5]
    assert tree.ancestors(5) == [0, 2, 5] and tree.ancestors(1) == [1]
    assert tree.paths() == [[0, 3], [1, 4], [0, 2, 5]]
    sequences, scores = tree.leaf_sequences()
    assert [s.tolist() for s in sequences] == [[10, 13], [11, 14], [10, 12, 15]]
    assert scores.tolist() == [-1.25, -5.0, -1.625]
    assert tree.leaf_sequences(raw=True)[1].tolist() == [-2.5, -10.0, -3.25]
    with pytest.raises(ValueError, match="tokens"):
        TokenTree(PARENTS, tokens[:5], lp, lp)


@pytest.mark.parametrize("parents", [[], [0], [-2], [-1, 1], [-1, 0, 3], [-1, 0.0], [-1, True], "ab", None])
def test_bad_parents_raise(parents):
    with pytest.raises(ValueError, match="parents"):
        tree_attention_mask(parents)
    with pytest.raises(ValueError, match="parents"):
        tree_position_ids(parents, 0)


def test_bad_offset_raises():
    with pytest.raises(ValueError, match="offset"):
        tree_position_ids([-1], -1)


# --- One forward pass equals path by path --------------------------------------------------------


def test_score_tree_equals_score_paths_on_smollm2(smollm):
    model, tok = smollm
    ids = tok("The best thing about autumn is", return_tensors="pt").input_ids
    tree = sample_tree(model, ids, branching=(3, 2, 2), temperature=1.2, generator=torch.Generator().manual_seed(0))
    assert len(tree) == 3 + 6 + 12
    logprobs, logits = score_tree(model, ids, tree.parents, tree.tokens)
    ref_logprobs, ref_logits = score_paths(model, ids, tree.parents, tree.tokens)
    assert logits.shape == (21, model.config.vocab_size)
    assert torch.allclose(logprobs, ref_logprobs, atol=1e-4)
    assert torch.allclose(logits, ref_logits, atol=1e-3)
    assert torch.allclose(tree.raw_logprobs, logprobs, atol=1e-4)  # sample_tree's own scores agree
    # The test can fail: a causal pass over the same tokens (siblings see each other) differs.
    with torch.no_grad():
        causal = model(torch.cat([ids, tree.tokens[None]], dim=1)).logits[0, ids.shape[1]:].float()
    assert (causal - ref_logits).abs().max() > 1.0


def test_score_tree_as_a_list_prompt_with_eager_attention(smollm):
    model, tok = smollm
    ids = tok("One, two, three,", return_tensors="pt").input_ids
    tokens = torch.tensor(tok(" four five six seven eight nine ten eleven").input_ids[:6])
    sdpa = score_tree(model, ids, PARENTS, tokens)[0]
    model.set_attn_implementation("eager")  # adds the mask to the scores: it must be additive
    try:
        eager = score_tree(model, ids[0].tolist(), PARENTS, tokens.tolist())[0]
    finally:
        model.set_attn_implementation("sdpa")
    assert torch.allclose(sdpa, eager, atol=1e-4)
    assert torch.allclose(sdpa, score_paths(model, ids, PARENTS, tokens)[0], atol=1e-4)


@pytest.mark.parametrize("order", [2, 3])
def test_score_tree_equals_score_paths_on_the_toy_model(order):
    model = ll.toy_model(vocab_size=5, order=order, seed=1)
    prompt = [1, 2, 3]
    tree = sample_tree(model, prompt, branching=(3, 2, 2), generator=torch.Generator().manual_seed(0))
    logprobs, logits = score_tree(model, prompt, tree.parents, tree.tokens)
    ref_logprobs, ref_logits = score_paths(model, prompt, tree.parents, tree.tokens)
    assert torch.equal(logprobs, ref_logprobs) and torch.equal(logits, ref_logits)
    exact = torch.stack([exact_logprob(model, prompt, tree, i) for i in range(len(tree))])
    assert torch.allclose(logprobs, exact, atol=1e-6)


# --- Sampling a tree ------------------------------------------------------------------------------


@pytest.mark.statistical
@pytest.mark.parametrize("config", [SamplingConfig(), SamplingConfig(temperature=0.7, top_k=3)])
def test_sampled_paths_follow_exact_path_probabilities(config):
    """Toy bigram model, vocabulary 4, branching (2, 2): 16 possible paths, exact probabilities.

    Paths through different children of the root are independent, and each is an exact sample,
    so every tree gives two independent samples: one leaf under each child of the root (which
    leaf alternates from tree to tree, so every leaf position is tested). Chi-square test.
    """
    model = ll.toy_bigram(vocab_size=4, seed=3)
    settings = dict(temperature=config.temperature, top_k=config.top_k)
    probs = torch.softmax(process_logits(model.table.double(), config), dim=-1)  # row a: after token a
    gen = torch.Generator().manual_seed(11)
    counts = torch.zeros(16, dtype=torch.float64)
    trees = 3000
    for t in range(trees):
        tree = sample_tree(model, [2], branching=(2, 2), generator=gen, **settings)
        assert tree.parents == [-1, -1, 0, 0, 1, 1]
        for leaf in (2 + t % 2, 4 + (t // 2) % 2):
            a, b = tree.tokens[tree.ancestors(leaf)].tolist()
            counts[4 * a + b] += 1
        if t < 5:  # per-node log-probs are the exact ones (sampled and raw distributions)
            for i in range(len(tree)):
                assert torch.allclose(tree.logprobs[i].double(), exact_logprob(model, [2], tree, i, config).double())
                assert torch.allclose(tree.raw_logprobs[i], exact_logprob(model, [2], tree, i))
    exact = torch.tensor([probs[2, a] * probs[a, b] for a, b in itertools.product(range(4), repeat=2)])
    possible = exact > 0
    assert counts[~possible].sum() == 0  # truncated paths never appear
    expected = exact[possible] / exact.sum() * counts.sum()
    assert chisquare(counts[possible].numpy(), expected.numpy()).pvalue > ALPHA
    # The same counts reject a plausible bug: the second token drawn after the prompt's last token
    # instead of its parent. (Over the paths that bug can produce, so that no expected count is 0.)
    wrong = torch.tensor([probs[2, a] * probs[2, b] for a, b in itertools.product(range(4), repeat=2)])
    cells = wrong > 0
    expected = wrong[cells] / wrong[cells].sum() * counts[cells].sum()
    assert chisquare(counts[cells].numpy(), expected.numpy()).pvalue < ALPHA


@pytest.mark.statistical
def test_without_replacement_children_are_distinct_and_scored_exactly():
    model = ll.toy_model(vocab_size=6, order=3, seed=2)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        tree = sample_tree(model, [0, 5], branching=(4, 3, 2), with_replacement=False, temperature=0.9,
                           generator=gen)
        for node in [-1] + list(range(len(tree))):
            children = tree.tokens[tree.children(node)].tolist()
            assert len(children) == len(set(children))
    config = SamplingConfig(temperature=0.9)
    for i in range(len(tree)):
        assert torch.allclose(tree.logprobs[i], exact_logprob(model, [0, 5], tree, i, config), atol=1e-6)


def test_temperature_zero_gives_the_top_k_children_in_order():
    model = ll.toy_model(vocab_size=6, order=2, seed=4)
    for with_replacement in (True, False):
        tree = sample_tree(model, [1], branching=(3, 2), temperature=0, with_replacement=with_replacement,
                           generator=torch.Generator().manual_seed(int(with_replacement)))
        top = model.table.argsort(dim=-1, descending=True)  # row a: tokens after a, most likely first
        assert tree.tokens[tree.children(-1)].tolist() == top[1, :3].tolist()
        for node in tree.children(-1):
            assert tree.tokens[tree.children(node)].tolist() == top[tree.tokens[node], :2].tolist()
        assert (tree.logprobs == 0).all()
        for i in range(len(tree)):
            assert torch.allclose(tree.raw_logprobs[i], exact_logprob(model, [1], tree, i))


def test_sample_tree_on_smollm2_matches_score_tree(smollm):
    model, tok = smollm
    ids = tok("My favourite fruit is", return_tensors="pt").input_ids
    config = SamplingConfig(temperature=0.8, top_p=0.9)
    tree = sample_tree(model, ids, branching=(2, 2), temperature=0.8, top_p=0.9,
                       generator=torch.Generator().manual_seed(1))
    logprobs, logits = score_tree(model, ids, tree.parents, tree.tokens)
    assert torch.allclose(tree.raw_logprobs, logprobs, atol=1e-4)
    with torch.no_grad():
        first = model(ids).logits[:, -1].float()
    before = torch.cat([first, logits])[torch.tensor(tree.parents) + 1]  # each node's parent's logits
    sampled = ll.log_softmax(process_logits(before, config)).gather(-1, tree.tokens[:, None]).squeeze(-1)
    assert torch.allclose(tree.logprobs, sampled, atol=1e-4)
    greedy = sample_tree(model, ids, branching=(3, 1), temperature=0)
    assert greedy.tokens[0] == first.argmax() and greedy.tokens[:3].tolist() == first[0].topk(3).indices.tolist()


# --- Gumbel-top-k ----------------------------------------------------------------------------------


def test_gumbel_top_k_is_sampling_without_replacement():
    logits = torch.tensor([1.0, 0.5, 0.0, -1.0, float("-inf")])
    p = torch.softmax(logits.double(), dim=-1)
    n = 40_000
    pairs = gumbel_top_k(logits.expand(n, -1), 2, torch.Generator().manual_seed(0))
    assert pairs.shape == (n, 2) and pairs.dtype == torch.long
    assert (pairs[:, 0] != pairs[:, 1]).all() and (pairs != 4).all()
    # Ordered pairs: P(first i, then j) = p_i * p_j / (1 - p_i). Chi-square over the 12 pairs.
    counts = torch.bincount(4 * pairs[:, 0] + pairs[:, 1], minlength=16).double()
    exact = torch.tensor([p[i] * p[j] / (1 - p[i]) if i != j else 0.0 for i in range(4) for j in range(4)])
    cells = exact > 0
    assert chisquare(counts[cells].numpy(), (exact[cells] * n).numpy()).pvalue > ALPHA
    # Inclusion: P(i in the set) = p_i + sum_{j != i} p_j * p_i / (1 - p_j); a binomial test per
    # token, each at ALPHA / 4, so all four together at ALPHA.
    for i in range(4):
        included = p[i] + sum(p[j] * p[i] / (1 - p[j]) for j in range(4) if j != i)
        hits = int((pairs == i).any(dim=-1).sum())
        assert binomtest(hits, n, float(included)).pvalue > ALPHA / 4
        # ... which is not p_i doubled, what drawing twice with replacement would give.
        assert binomtest(hits, n, float(1 - (1 - p[i]) ** 2)).pvalue < ALPHA


def test_gumbel_top_k_bad_arguments():
    logits = torch.tensor([[0.0, 1.0, float("-inf")]])
    assert sorted(gumbel_top_k(logits, 2)[0].tolist()) == [0, 1]
    with pytest.raises(ValueError, match="k=3"):
        gumbel_top_k(logits, 3)
    with pytest.raises(ValueError, match="k must"):
        gumbel_top_k(logits, 0)
    with pytest.raises(ValueError, match="generator"):
        gumbel_top_k(logits, 1, generator=5)
    with pytest.raises(ValueError, match="NaN"):
        gumbel_top_k(torch.tensor([[0.0, float("nan")]]), 1)


# --- The checker and argument checks ---------------------------------------------------------------


def test_check_tree_mask_accepts_the_reference_and_rejects_wrong_masks(capsys, untraced):
    from test_checks_and_viz import student_copy

    tree_attention_mask = student_copy(ll.tree_attention_mask)  # the checks forbid the library's own
    check_tree_mask(tree_attention_mask)
    assert "check_tree_mask: all 10 cases passed." in capsys.readouterr().out
    check_tree_mask(lambda parents: tree_attention_mask(parents).int())  # 1/0 is as good as True/False
    with pytest.raises(CheckFailed, match="star.*plain causal mask"):
        check_tree_mask(lambda parents: torch.ones(len(parents), len(parents), dtype=torch.bool).tril())
    with pytest.raises(CheckFailed, match="single node.*attend to itself"):
        check_tree_mask(lambda parents: tree_attention_mask(parents) & ~torch.eye(len(parents), dtype=torch.bool))

    def parent_only(parents):
        mask = torch.eye(len(parents), dtype=torch.bool)
        for i, p in enumerate(parents):
            if p >= 0:
                mask[i, p] = True
        return mask

    with pytest.raises(CheckFailed, match=r"chain.*entry \[2, 0\] is False but should be True"):
        check_tree_mask(parent_only)

    def in_place(parents):
        mask = tree_attention_mask(parents)
        parents.reverse()
        return mask

    with pytest.raises(CheckFailed, match="Case 2 of 10 .*changed the parents list it was given"):
        check_tree_mask(in_place)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(branching=()), "branching"),
        (dict(branching=(2, 0)), "branching"),
        (dict(branching=2), "branching"),
        (dict(branching=(2, True)), "branching"),
        (dict(branching=(2,), with_replacement=1), "with_replacement"),
        (dict(branching=(2,), generator=5), "generator"),
        (dict(branching=(2,), temperature=-1), "temperature"),
        (dict(branching=(2,), top_p=1.5), "top_p"),
        (dict(branching=(2,), top_k=0), "top_k"),
        (dict(branching=(3,), top_k=2, with_replacement=False), "distinct children"),
        (dict(branching=(7,), temperature=0), "children"),
    ],
)
def test_sample_tree_bad_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sample_tree(ll.toy_bigram(vocab_size=6), [1, 2], **kwargs)


@pytest.mark.parametrize("prompt", [[], torch.tensor([[1, 2], [3, 4]]), torch.tensor([1, 2]), torch.tensor([[1.0]]),
                                    [[1, 2], [3]], [7], "text"])
def test_bad_prompts_raise(prompt):
    model = ll.toy_bigram(vocab_size=6)
    for call in (lambda: sample_tree(model, prompt, branching=(2,)),
                 lambda: score_tree(model, prompt, [-1], [1]), lambda: score_paths(model, prompt, [-1], [1])):
        with pytest.raises(ValueError, match="input_ids"):
            call()


def test_score_tree_bad_tokens_raise():
    model = ll.toy_bigram(vocab_size=6)
    for tokens in ([1], [1, 2, 3], [1, 6], torch.tensor([1.0, 2.0])):
        with pytest.raises(ValueError, match="tokens"):
            score_tree(model, [1], [-1, 0], tokens)
    with pytest.raises(ValueError, match="parents"):
        score_tree(model, [1], [-1, 2], [1, 2])


def test_a_prompt_as_a_one_row_batch_is_the_same_prompt():
    # [[1, 2]] (one row, as ll.generate takes it) and torch.tensor([[1, 2]]) mean the prompt [1, 2].
    model = ll.toy_bigram(vocab_size=6)
    want = sample_tree(model, [1, 2], branching=(2, 2), generator=torch.Generator().manual_seed(0))
    for prompt in ([[1, 2]], torch.tensor([[1, 2]])):
        got = sample_tree(model, prompt, branching=(2, 2), generator=torch.Generator().manual_seed(0))
        assert got.parents == want.parents and torch.equal(got.tokens, want.tokens)
        assert torch.equal(score_tree(model, prompt, want.parents, want.tokens)[0],
                           score_tree(model, [1, 2], want.parents, want.tokens)[0])
