"""Trees of drafts under a constraint (chapter 11 with chapters 7 and 9): every node of a tree is
verified against the target masked in the state after its own path, so that speculative decoding
with a tree drafter (EAGLE's dynamic and fixed trees, Medusa's tree) follows the masked target
exactly, as ``ll.generate`` with the same constraint does: the same tokens at temperature 0, the
same distribution above it.

Statistical tests reject at a p-value below 1e-4 (P_MIN), the false-positive rate of each test
when the code is right.
"""

import json
import re
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare
from test_constrained import chat, masked_sequence_probs
from test_medusa import random_heads
from test_speculative import P_MIN, tiny_llama

import logitlab as ll
from logitlab.constrained.constraint import Constraint, DraftStates
from logitlab.speculative.drafter import Drafter, DraftTree
from logitlab.speculative.medusa import MedusaDrafter
from logitlab.speculative.eagle import EagleDrafter, FeatureDrafter
from logitlab.speculative.medusa_heads import medusa_generate
from logitlab.sampling.pipeline import SamplingConfig
from logitlab.speculative.loop import speculative_generate

VOCAB = [b"a", b"b", b"ab", b"c", b"d", None]  # tiny_llama's six tokens; 5 is EOS
EOS = 5
# "a" must be followed by "b" or "c": the state, and with it what is allowed, changes along a path.
PATTERN = r"(ab|ac|d)+"
A, B, AB, C, D = range(5)


def constraint(pattern=PATTERN):
    return Constraint(pattern, vocab=VOCAB, eos_token_id=EOS)


# --- The state of every node -------------------------------------------------------------------


def test_each_node_is_in_the_state_after_its_own_path():
    c = constraint()
    start, after_a, loop = 0, c.next_state(0, A), c.next_state(0, D)
    # Node: 0 root, 1 "a", 2 "d", 3 "c" (forbidden at the start), 4 "b" after "a", 5 "a" after "a"
    # (forbidden), 6 "d" under the forbidden 3, 7 EOS after "d" (complete), 8 EOS after "a" (not
    # complete), 9 "a" after "d" (a match would need 2 more tokens, 1 is left), 10 "ab" after "d".
    parents = [-1, 0, 0, 0, 1, 1, 3, 2, 1, 2, 2]
    tokens = torch.tensor([[D, A, D, C, B, A, D, EOS, EOS, A, AB]])
    nodes = DraftStates([c], [start], [2]).tree(tokens, [parents])
    assert nodes.states == [start, after_a, loop, -1, loop, -1, -1, loop, -1, -1, loop]
    assert nodes.tokens_left == [2, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0]
    allowed = torch.isfinite(nodes.mask(torch.zeros(11, 6)))
    assert allowed.any(dim=-1).all()  # every node keeps a token: its distribution exists
    assert allowed[[3, 5, 6, 8, 9]].tolist() == [[False] * 5 + [True]] * 5  # off the pattern: EOS only
    assert allowed[1].nonzero().flatten().tolist() == [B, C]
    unconstrained = DraftStates([None], [0], [2]).tree(tokens, [parents])
    assert unconstrained.states == [0] * 11 and not torch.isinf(unconstrained.mask(torch.zeros(11, 6))).any()


class Fixed(Drafter):
    """Proposes "a" at every place, as a chain, or as a tree of two levels: "a" and "c" under the
    root and under its "a", whatever the constraint allows."""

    vocab_size = 6

    def __init__(self, tree: bool):
        self.tree = tree

    def propose(self, next_tokens, gamma, config, generator=None):
        if self.tree:
            return DraftTree(torch.tensor([[A, C, A, C]]).expand(len(next_tokens), -1), [-1, -1, 0, 0])
        tokens = torch.full((len(next_tokens), gamma), A)
        return tokens, torch.nn.functional.one_hot(tokens, 6).float()


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_draft_only_the_budget_forbids_is_rejected(tree, temperature):
    # After "b", "a" is allowed by the pattern but needs three more tokens, and only two are left:
    # the budget forbids it. The position after it must keep a token (only EOS there), or the
    # target's distribution would not exist (a ValueError, before the budget counted here).
    out = speculative_generate(tiny_llama(2, seed=0), Fixed(tree), [[1, 2]], gamma=2, max_new_tokens=3,
                               eos_token_id=[EOS], temperature=temperature, num_return_sequences=20,
                               constraint=constraint(r"b(c|aaab)"), generator=torch.Generator().manual_seed(0))
    assert {tuple(t.tolist()) for t in out.new_tokens} == {(B, C, EOS)}  # "bc": the only match that fits


# --- Temperature 0: the tokens of constrained greedy decoding ------------------------------------


def tree_drafters(target):
    feature = FeatureDrafter(target)
    torch.nn.init.normal_(feature.fc.weight, std=0.2, generator=torch.Generator().manual_seed(1))  # reads features too
    heads = random_heads(target, 3, seed=2)
    return {"eagle dynamic": EagleDrafter(feature, tree=dict(top_k=2, nodes=6)),
            "eagle fixed": EagleDrafter(feature, tree=dict(branching=(2, 2, 1))),
            "medusa": MedusaDrafter(heads, tree=(3, 2, 1))}


@pytest.mark.parametrize("name", ["eagle dynamic", "eagle fixed", "medusa"])
def test_tree_drafters_under_a_constraint_are_greedy_in_a_batch(name):
    # One constraint per row, one row without: rows keep paths of different lengths under
    # different masks, and any node masked in the wrong state changes some row's output.
    target = tiny_llama(2, seed=0)
    prompts = [[1, 2], [3, 4, 5, 1], [2], [5, 5, 4]]
    constraints = [constraint(), constraint(r"d(ab)*c?"), None, constraint(r"(a|b|d)+c")]
    plain = ll.generate(target, prompts, max_new_tokens=12, temperature=0, eos_token_id=[EOS], constraint=constraints)
    out = speculative_generate(target, tree_drafters(target)[name], prompts, gamma=3, max_new_tokens=12,
                               temperature=0, eos_token_id=[EOS], constraint=constraints)
    assert [t.tolist() for t in out.new_tokens] == [t.tolist() for t in plain.new_tokens]
    assert sum(n for a in out.accepted for n in a) > 0


def test_medusa_generate_takes_a_constraint():
    target = tiny_llama(2, seed=0)
    prompts = [[1, 2], [3, 4, 5, 1]]
    plain = ll.generate(target, prompts, max_new_tokens=12, temperature=0, eos_token_id=[EOS], constraint=constraint())
    out = medusa_generate(target, random_heads(target, 3, seed=2), prompts, branching=(3, 2, 1), max_new_tokens=12,
                          eos_token_id=[EOS], constraint=constraint())
    assert [t.tolist() for t in out.new_tokens] == [t.tolist() for t in plain.new_tokens]


# --- Above temperature 0: the distribution of constrained sampling ------------------------------


def softer_target():
    """tiny_llama with its output layer 8 times smaller: its continuations spread over many
    sequences, so that drafts are accepted and rejected at every depth."""
    target = tiny_llama(2, seed=0)
    with torch.no_grad():
        target.lm_head.weight.div_(8)
    return target


def sampled_tree_drafters(target):
    feature = FeatureDrafter(target)
    torch.nn.init.normal_(feature.fc.weight, std=0.2, generator=torch.Generator().manual_seed(1))
    heads = random_heads(target, 2, seed=1, scale=0.5)
    return {"eagle dynamic": EagleDrafter(feature, tree=dict(top_k=2, nodes=5)),
            "medusa": MedusaDrafter(heads, tree=(2, 2)), "medusa sampled": MedusaDrafter(heads, "sample", (2, 2))}


def chi_square_pvalue(samples, probs, least=5):
    """The chi-square test of ``samples`` against ``probs``, the sequences expected fewer than
    ``least`` times pooled into one cell (where the test's approximation fails); 0 when a sample
    has probability 0 (an output the constraint forbids)."""
    counts = Counter(tuple(t.tolist()) for t in samples)
    if not set(counts) <= set(probs):
        return 0.0
    n, total = len(samples), sum(probs.values())
    expected = {k: n * v / total for k, v in probs.items()}
    common = [k for k in expected if expected[k] >= least]
    observed, wanted = [counts.get(k, 0) for k in common], [expected[k] for k in common]
    if len(common) < len(expected):
        observed.append(n - sum(observed))
        wanted.append(n - sum(wanted))
    return chisquare(observed, wanted).pvalue


def constrained_tree_run(name, settings, rows=10_000):
    target = softer_target()
    out = speculative_generate(target, sampled_tree_drafters(target)[name], [[1, 2]], gamma=2, max_new_tokens=3,
                               eos_token_id=[EOS], num_return_sequences=rows, constraint=constraint(),
                               generator=torch.Generator().manual_seed(0), **settings)
    return out, masked_sequence_probs(target, [1, 2], 3, SamplingConfig(**settings), constraint(), eos=EOS)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eagle dynamic", "medusa", "medusa sampled"])
@pytest.mark.parametrize("settings", [dict(temperature=1.0), dict(temperature=0.8, top_k=3)],
                         ids=["T=1", "T=0.8 top-k 3"])
def test_tree_drafts_under_a_constraint_follow_the_masked_target(name, settings):
    """10 000 samples of at most 3 tokens (about 20 sequences possible), chi-square against the
    exact masked distribution. The drafters do not mask: many of their nodes are forbidden, and
    must be rejected; the others are accepted at both depths."""
    out, probs = constrained_tree_run(name, settings)
    assert 0.1 < out.alpha < 0.9
    assert sum(n == 2 for a in out.accepted for n in a) > 300  # whole paths kept: the deepest masks are used
    assert chi_square_pvalue(out.new_tokens, probs) > P_MIN


@pytest.mark.slow
def test_the_test_catches_nodes_masked_in_the_roots_state(monkeypatch):
    """The likeliest mistake, every node masked in the state of the tree's root (where the chain
    would advance position by position), fails the test above."""

    def roots_state(self, tokens, parents):
        n = tokens.shape[1]
        return DraftStates(*([x for x in values for _ in range(n)]
                           for values in (self.constraints, self.states, self.tokens_left)))

    monkeypatch.setattr(DraftStates, "tree", roots_state)
    out, probs = constrained_tree_run("medusa", dict(temperature=1.0))
    assert chi_square_pvalue(out.new_tokens, probs) < P_MIN


# --- The real model: a regular expression and a JSON schema -------------------------------------


@pytest.mark.slow
def test_every_tree_drafter_is_greedy_under_a_regex_and_a_json_schema(smollm):
    from logitlab.constrained.json_schema import to_regex
    from logitlab.speculative import eagle, medusa_heads
    model, tokenizer = smollm
    pattern = r'\{"name": "[A-Za-z ]{1,20}", "age": [0-9]{1,3}\}'
    schema = {"type": "object", "required": ["name", "age", "city"], "properties": {
        "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0},
        "city": {"enum": ["Paris", "Tokyo", "Lima"]}}}
    prompts = [chat(tokenizer, "Describe a person as JSON with name and age."),
               chat(tokenizer, "Describe a person as JSON.")]
    constraints = [Constraint(pattern, tokenizer), Constraint(to_regex(schema), tokenizer)]
    plain = ll.generate(model, prompts, tokenizer=tokenizer, max_new_tokens=40, temperature=0, constraint=constraints)
    assert re.fullmatch(pattern, plain.texts[0]) and set(json.loads(plain.texts[1])) == set(schema["required"])
    feature = eagle.load_pretrained(model)
    runs = {name: speculative_generate(model, EagleDrafter(feature, tree=tree), prompts, tokenizer=tokenizer, gamma=4,
                                       max_new_tokens=40, temperature=0, constraint=constraints)
            for name, tree in [("eagle dynamic", dict(top_k=4, nodes=16)), ("eagle fixed", dict(branching=(3, 2, 1)))]}
    runs["medusa"] = medusa_generate(model, medusa_heads.load_pretrained(model), prompts, branching=(3, 2, 1), max_new_tokens=40,
                                     tokenizer=tokenizer, constraint=constraints)
    for name, out in runs.items():
        assert [t.tolist() for t in out.new_tokens] == [t.tolist() for t in plain.new_tokens], name
        assert sum(n for a in out.accepted for n in a) > 0, name
