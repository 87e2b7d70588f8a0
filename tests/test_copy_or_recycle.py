"""CopyOrRecycle (logitlab.speculative.copy_or_recycle): a copied chain where every row has a match,
Token Recycling's tree elsewhere; the automaton follows the kept path of every tree (the loop's
``kept_path``), and the output stays exact (greedy equality, a chi-square test of samples)."""

import pytest
import torch

import logitlab as ll
from logitlab.speculative.copy_or_recycle import CopyOrRecycle
from logitlab.speculative.drafter import DraftTree

from test_speculative import P_MIN, chi_square_pvalue, exact_sequence_probs, tiny_llama

PROMPT = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3]  # a repeat to copy, and tokens the answer has not seen


@pytest.mark.parametrize("min_match", [1, 2, 3])
def test_greedy_output_is_the_targets_and_both_kinds_of_call_are_made(min_match):
    target = tiny_llama(1, 6, vocab=16)
    plain = ll.generate(target, [PROMPT], max_new_tokens=24, temperature=0, eos_token_id=[]).new_tokens[0].tolist()
    drafter = CopyOrRecycle(16, min_match=min_match, nodes=5, k=3)
    out = ll.speculative_generate(target, drafter, [PROMPT], gamma=4, max_new_tokens=24, temperature=0,
                                  eos_token_id=[])
    assert out.new_tokens[0].tolist() == plain
    assert drafter.copied > 0 and drafter.recycled > 0
    # The automaton holds the prompt and every kept token, whichever kind of call kept it.
    text = drafter.copy.rows[0].tokens
    assert text == (PROMPT + plain)[:len(text)] and len(text) >= len(PROMPT) + 24 - 5


def test_the_path_of_a_tree_reaches_the_automaton():
    drafter = CopyOrRecycle(6, min_match=3, nodes=3, k=2)
    drafter.start(torch.tensor([[1, 2, 3]]), torch.ones(1, 3))
    drafter.observe_logits(torch.tensor([[4]]), torch.tensor([[[0., 0, 0, 0, 0, 9]]]))  # after 4: 5
    tree = drafter.propose(torch.tensor([4]), 3, None)  # no match of 3 tokens: a tree from the table
    assert isinstance(tree, DraftTree) and tree.tokens[0, 0].item() == 5
    drafter.kept_path([[0, 1]])  # the loop kept node 1 (token 5)
    drafter.rollback(torch.tensor([1]))
    assert drafter.copy.rows[0].tokens == [1, 2, 3, 4, 5]


@pytest.mark.statistical
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampled_output_follows_the_target_exactly(temperature):
    target = tiny_llama(1, 3, vocab=4)
    prompt = [1, 2, 3, 1, 2]
    out = ll.speculative_generate(target, CopyOrRecycle(4, min_match=1, nodes=4, k=2), [prompt], gamma=3,
                                  max_new_tokens=3, eos_token_id=[], num_return_sequences=20_000,
                                  temperature=temperature, generator=torch.Generator().manual_seed(11))
    probs = exact_sequence_probs(target, prompt, 3, ll.SamplingConfig(temperature=temperature))
    assert chi_square_pvalue(out.new_tokens, probs) > P_MIN
    assert out.alpha > 0


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="min_match must be an integer >= 1"):
        CopyOrRecycle(5, min_match=0)
    with pytest.raises(ValueError, match="size must be an integer >= 1"):
        CopyOrRecycle(5, nodes=0)
