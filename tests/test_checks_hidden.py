"""The checks test the method, not a table (issue 84): under the grader's hidden seed
(``common.hidden_cases``) every check draws some of its cases from that seed, so that

* the chapter's own solution passes on any seed, as it does in the notebook;
* an answer that replays the answers it recorded on the public run (a lookup table) passes the
  public check and fails a hidden one;
* check_gumbel_max wants the exercise's own method for the generator it is given: a sampler that
  is right in distribution (torch.multinomial) or that ignores the generator fails.
"""

import contextlib
import copy
import io
import math

import pytest
import torch

import logitlab as ll
from logitlab.course.checks import CheckFailed, check_gumbel_max
from logitlab.course.checks.common import hidden_cases

from test_grade import chapter_cell

CHECKS = sorted(name for name in ll.checks.__all__ if name.startswith("check_"))
SEEDS = (1, 12345, 2**61 + 3)
# check_verify's statistical test makes 20,000 calls by default (25 s here); its seed is fixed
# while grading too, so a smaller one tests the same hidden cases.
OPTIONS = {"check_verify": {"trials": 2000}}


def solution(check: str):
    """The function that the chapter's own solution cell hands to ``check``."""
    head, argument = chapter_cell(check).rsplit(f"ll.checks.{check}(", 1)
    namespace = {"torch": torch, "ll": ll, "math": math, "contextlib": contextlib}
    exec(head, namespace)
    return namespace[argument.split(")")[0]]


def run(check: str, fn) -> str:
    """What ``check`` prints when ``fn`` passes (it raises CheckFailed otherwise)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        getattr(ll.checks, check)(fn, **OPTIONS.get(check, {}))
    return out.getvalue()


def key(value):
    """Something hashable that two equal arguments share: a tensor's dtype, shape and bytes, a
    generator's state, containers item by item, anything else its repr."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().contiguous()
        return "tensor", str(value.dtype), tuple(value.shape), value.numpy().tobytes()
    if isinstance(value, torch.Generator):
        return "generator", value.get_state().numpy().tobytes()
    if isinstance(value, (list, tuple)):
        return type(value).__name__, tuple(key(v) for v in value)
    if isinstance(value, dict):
        return "dict", tuple((key(k), key(v)) for k, v in value.items())
    return repr(value)


class LookupTable:
    """A cheat: while ``recording``, calls the solution and stores its answer under the arguments'
    key, with the state it left any generator argument in; then answers from the table alone
    (setting the generators to the stored states, as the solution's own draws would have) and
    returns None, a wrong answer for every check, on arguments it has not seen."""

    def __init__(self, fn):
        self.fn, self.answers, self.recording, self.misses = fn, {}, True, 0

    def __call__(self, *args):
        generators = [a for a in args if isinstance(a, torch.Generator)]
        seen = key(args)  # before the call, which moves the generators on
        if self.recording:
            got = self.fn(*args)
            self.answers[seen] = copy.deepcopy(got), [g.get_state() for g in generators]
            return got
        if seen not in self.answers:
            self.misses += 1
            return None
        got, states = self.answers[seen]
        for generator, state in zip(generators, states):
            generator.set_state(state)
        return copy.deepcopy(got)


@pytest.mark.parametrize("check", CHECKS)
def test_the_chapter_solution_passes_on_hidden_seeds(check):
    fn = solution(check)
    public = run(check, fn)
    assert "passed" in public
    for seed in SEEDS:
        with hidden_cases(seed):
            assert run(check, fn) == public  # the same cases, counted alike; other inputs


@pytest.mark.parametrize("check", CHECKS)
def test_a_lookup_table_passes_the_public_check_and_fails_a_hidden_one(check):
    table = LookupTable(solution(check))
    run(check, table)
    table.recording = False
    assert "passed" in run(check, table) and table.misses == 0  # the public cases, replayed
    with hidden_cases(SEEDS[1]), pytest.raises(CheckFailed):
        run(check, table)
    assert table.misses == 1  # it failed at the first case it had not seen


def test_hidden_seeds_change_the_cases_and_the_public_cases_stay_the_same():
    table = LookupTable(solution("check_softmax"))
    run("check_softmax", table)
    public = set(table.answers)
    run("check_softmax", table)
    assert set(table.answers) == public  # a notebook sees the same cases every run
    for seed in SEEDS:
        with hidden_cases(seed):
            run("check_softmax", table)
    assert len(table.answers) == len(public) + 3 * len(SEEDS)  # three random cases, new on each seed


def multinomial_sampler(logits, generator):
    # right in distribution, reproducible with the generator: but not the exercise's method
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator).reshape(probs.shape[:-1])


def low_discrepancy_sampler(logits, generator):
    # inverse transform with a fixed sequence (the golden ratio's multiples): very even
    # frequencies, the same tokens whatever the seed
    rows = logits.reshape(-1, logits.shape[-1])
    u = torch.arange(len(rows), dtype=torch.float64) * 0.6180339887498949 % 1
    cdf = torch.softmax(rows.double(), dim=-1).cumsum(dim=-1)
    tokens = torch.searchsorted(cdf, u[:, None]).squeeze(-1).clamp_max(rows.shape[-1] - 1)
    return tokens.reshape(logits.shape[:-1])


@pytest.mark.parametrize("sampler, message", [
    (multinomial_sampler, r"The method case .*your tokens differ from the reference method's on \d+ of 4000 rows"),
    (low_discrepancy_sampler, r"The method case .*generators seeded \d+ and \d+ gave the same 4000 tokens"),
])
def test_check_gumbel_max_wants_the_method_for_the_generator_given(sampler, message):
    # Both pass every case before the method case: it is what catches them.
    with pytest.raises(CheckFailed, match=message):
        check_gumbel_max(sampler)
    with hidden_cases(SEEDS[0]), pytest.raises(CheckFailed, match=message):
        check_gumbel_max(sampler)


def test_check_gumbel_max_allows_rare_rounding_ties_only():
    fn = solution("check_gumbel_max")

    def one_row_in_500_wrong(logits, generator):  # 8 of 4000 rows: more than 0.1%
        tokens = fn(logits, generator)
        if len(tokens) == 4000:
            tokens[::500] = (tokens[::500] + 1) % logits.shape[-1]
        return tokens

    def one_row_wrong(logits, generator):
        tokens = fn(logits, generator)
        if len(tokens) == 4000:
            tokens[7] = (tokens[7] + 1) % logits.shape[-1]
        return tokens

    with pytest.raises(CheckFailed, match="differ from the reference method's on 8 of 4000 rows"):
        check_gumbel_max(one_row_in_500_wrong)
    with contextlib.redirect_stdout(io.StringIO()):
        check_gumbel_max(one_row_wrong)
