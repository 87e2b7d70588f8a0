"""Validated once: the loops read from the device only what they must.

Every value a loop reads back (``Tensor.item``, ``tolist``, ``bool(tensor)``, ...) makes a GPU wait
for all the work queued before it. ``ll.generate`` and ``ll.beam_search`` read one value set per
step (which rows finished, and whether the step's logits were valid), a token tree one per level,
and each one more for each rule that must ask the device a question of its own; a speculative
call reads a few (how many drafts each row keeps, the caches' new lengths, the tokens), and so
does a PaSS call. The reads are counted here on the CPU, where they are cheap, so that a change
that adds one to every step fails. Reads made inside transformers (its attention-mask helper
reads one per forward pass) are not the library's and are not counted.
"""

import collections
import contextlib
import sys
from pathlib import Path

import pytest
import torch

import logitlab as ll
from logitlab.sampling.penalties import RepetitionPenalty
from logitlab.search.trees import sample_tree
from logitlab.speculative.draft_model import DraftModelDrafter
from logitlab.speculative.pass_embeddings import LookaheadEmbeddings, pass_generate

from test_speculative import tiny_llama

LIB = str(Path(ll.__file__).parent)
READS = ["item", "tolist", "__bool__", "__int__", "__float__", "__index__"]


@contextlib.contextmanager
def library_reads():
    """Count the reads whose caller (the innermost frame outside torch) is the library's code."""
    counts = collections.Counter()
    saved = {name: getattr(torch.Tensor, name) for name in READS}

    def counted(name, method):
        def read(self, *args, **kwargs):
            frame = sys._getframe(1)
            while frame is not None and "/torch/" in frame.f_code.co_filename.replace("\\", "/"):
                frame = frame.f_back
            if frame is not None and frame.f_code.co_filename.startswith(LIB):
                counts[f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"] += 1
            return method(self, *args, **kwargs)
        return read

    for name in READS:
        setattr(torch.Tensor, name, counted(name, saved[name]))
    try:
        yield counts
    finally:
        for name in READS:
            setattr(torch.Tensor, name, saved[name])


TARGET, DRAFT = tiny_llama(2, 0, vocab=50), tiny_llama(1, 1, vocab=50)
N = 30  # new tokens


# Reads per step: the step's one (finished rows, valid logits), plus one for each rule that asks
# the device a question of its own: a penalty whether it pushed a logit out of range, a
# temperature below 1 whether it overflowed, top-k whether a tie keeps more than k tokens.
@pytest.mark.parametrize("settings, per_step", [
    (dict(temperature=0), 1), (dict(temperature=1.0), 1), (dict(temperature=1.0, top_p=0.9), 1),
    (dict(temperature=0.7, top_k=10, repetition_penalty=1.2), 4)], ids=["greedy", "T=1", "top-p", "T=0.7 top-k penalty"])
def test_generate_reads_one_value_set_per_step(settings, per_step):
    with library_reads() as counts:
        out = ll.generate(TARGET, [[1, 2, 3]], max_new_tokens=N, eos_token_id=[],
                          generator=torch.Generator().manual_seed(0), **settings)
    assert len(out.new_tokens[0]) == N
    # per step, and a few for the prompt (its padding) before the first step
    assert sum(counts.values()) <= per_step * N + 3, counts.most_common(5)


@pytest.mark.parametrize("temperature", [0, 1.0], ids=["greedy", "T=1"])
def test_a_speculative_call_reads_a_few_values(temperature):
    with library_reads() as counts:
        out = ll.speculative_generate(TARGET, DraftModelDrafter(DRAFT), [[1, 2, 3]], gamma=3, max_new_tokens=N,
                                      eos_token_id=[], temperature=temperature,
                                      generator=torch.Generator().manual_seed(0))
    calls = out.model_calls - 1  # the prefill is not a call
    # per call: the kept counts (with the logits' check) and the tokens; the caches' rollbacks
    # and the draft model's catching up take the counts already read
    assert sum(counts.values()) <= 2 * calls + 12, counts.most_common(8)


@pytest.mark.parametrize("tree", [dict(top_k=2, nodes=6), dict(branching=(2, 2, 1))], ids=["dynamic", "fixed"])
def test_a_tree_call_reads_a_few_values(tree):
    from logitlab.speculative.eagle import EagleDrafter, FeatureDrafter

    feature = FeatureDrafter(TARGET)
    torch.nn.init.normal_(feature.fc.weight, std=0.2, generator=torch.Generator().manual_seed(1))
    with library_reads() as counts:
        out = ll.speculative_generate(TARGET, EagleDrafter(feature, tree=tree), [[1, 2, 3]], gamma=3,
                                      max_new_tokens=N, eos_token_id=[], temperature=0)
    calls = out.model_calls - 1
    # per call: the tree's parents (a dynamic tree's are on the device), the logits' check, the
    # kept path (chosen on the host), the tokens; none of the tree's own checks on the drafter's values
    assert sum(counts.values()) <= 4 * calls + 12, counts.most_common(8)


def beam(**settings):
    return ll.beam_search(TARGET, [[1, 2, 3]], num_beams=4, max_new_tokens=N, eos_token_id=[], **settings)


# As for generate: one read per step, and one more for a rule that asks its own question (the
# penalty: whether it pushed a logit out of range).
@pytest.mark.parametrize("settings, per_step", [({}, 1), (dict(logits_processor=[RepetitionPenalty(1.2)]), 2)],
                         ids=["plain", "with a penalty"])
def test_beam_search_reads_one_value_set_per_step(settings, per_step):
    with library_reads() as counts:
        out = beam(**settings)
    assert len(out.history) == N
    # per step: whether it ended or stored a hypothesis, and whether the logits were valid; at
    # the end, the best hypothesis's score, reason and tokens (no hypothesis was stored before
    # the last step: there is no EOS); two for the prompt
    assert sum(counts.values()) <= per_step * N + 3 + 2, counts.most_common(5)


def tree(branching=(4, 4, 2), **settings):
    return sample_tree(TARGET, [1, 2, 3], branching=branching, generator=torch.Generator().manual_seed(0), **settings)


# One read per level (the logits' check with the fewest possible tokens), and one more for a
# temperature below 1 (whether it overflowed); two for the prompt.
@pytest.mark.parametrize("settings, per_level", [
    (dict(temperature=1.0, top_p=0.9), 1), (dict(temperature=0.7, with_replacement=False), 2), (dict(temperature=0), 1)],
    ids=["top-p", "T=0.7 without replacement", "greedy"])
def test_a_token_tree_reads_one_value_set_per_level(settings, per_level):
    with library_reads() as counts:
        out = tree(**settings)
    assert len(out) == 4 + 16 + 32
    assert sum(counts.values()) <= per_level * 3 + 2, counts.most_common(5)


def pass_call(temperature):
    return pass_generate(TARGET, LookaheadEmbeddings(TARGET, 3), [1, 2, 3], max_new_tokens=N, temperature=temperature,
                         generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("temperature", [0, 1.0], ids=["greedy", "T=1"])
def test_a_pass_call_reads_a_few_values(temperature):
    with library_reads() as counts:
        out = pass_call(temperature)
    calls = out.model_calls - 1
    # per call: the kept count (with the logits' check), the tokens, the next drafts' confidences;
    # the prompt and the prefill a few more
    assert sum(counts.values()) <= 3 * calls + 12, counts.most_common(8)


def test_the_counter_sees_the_library_validate_every_token_again(monkeypatch):
    """The test has power: with the rules checking their logits again on every token (as they do
    when called directly), the counts go over every bound above."""
    import logitlab._validate as validate

    monkeypatch.setattr(validate, "checking_values", lambda: True)
    with library_reads() as counts:
        ll.generate(TARGET, [[1, 2, 3]], max_new_tokens=N, eos_token_id=[], temperature=0)
    assert sum(counts.values()) > N + 3
    with library_reads() as counts:
        out = ll.speculative_generate(TARGET, DraftModelDrafter(DRAFT), [[1, 2, 3]], gamma=3, max_new_tokens=N,
                                      eos_token_id=[], temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert sum(counts.values()) > 5 * (out.model_calls - 1) + 12
    with library_reads() as counts:
        beam(logits_processor=[RepetitionPenalty(1.2)])
    assert sum(counts.values()) > 2 * N + 5
    with library_reads() as counts:
        tree(temperature=1.0, top_p=0.9)
    assert sum(counts.values()) > 3 + 2
    with library_reads() as counts:
        out = pass_call(1.0)
    assert sum(counts.values()) > 3 * (out.model_calls - 1) + 12
