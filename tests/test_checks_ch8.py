"""The checkers of chapter 8's exercises accept right answers and reject typical mistakes."""

import pytest

import logitlab as ll
from logitlab.course.checks import CheckFailed


def training_parents(length, starts, k, slot_parent="previous"):
    parents = [-1] + list(range(length - 1))
    for t in starts:
        for i in range(k):
            if i == 0:
                parents.append(t)
            elif slot_parent == "previous":
                parents.append(len(parents) - 1)
            else:  # every slot hangs from the token: the slots would not see each other
                parents.append(t)
    return parents


def test_check_training_layout(capsys):
    ll.checks.check_training_layout(training_parents)
    assert "check_training_layout: all" in capsys.readouterr().out
    wrong_answers = [
        lambda length, starts, k: training_parents(length, starts, k, slot_parent="token"),
        lambda length, starts, k: training_parents(length, [t + 1 for t in starts], k),  # slots after t + 1
        lambda length, starts, k: [-1] + list(range(length - 1)),  # forgets the slots
    ]
    for wrong in wrong_answers:
        with pytest.raises(CheckFailed):
            ll.checks.check_training_layout(wrong)


def single_call_parents(num_drafts, groups, order=sorted):
    parents = [-1] + list(range(num_drafts))
    for j in order(groups):
        for i in range(groups[j]):
            parents.append(j if i == 0 else len(parents) - 1)
    return parents


def test_check_single_call_layout(capsys):
    ll.checks.check_single_call_layout(single_call_parents)
    assert "check_single_call_layout: all" in capsys.readouterr().out
    wrong_answers = [
        lambda m, groups: single_call_parents(m, groups, order=list),  # groups in the order given
        lambda m, groups: [-1] + [0] * m + [0] * sum(groups.values()),  # everything hangs from the root
        lambda m, groups: single_call_parents(m, {j + 1: s for j, s in groups.items() if j < m}),  # off by one
    ]
    for wrong in wrong_answers:
        with pytest.raises(CheckFailed):
            ll.checks.check_single_call_layout(wrong)


def test_check_training_layout_keeps_the_order_of_starts():
    with pytest.raises(CheckFailed, match="Case starts not in increasing order.*not sorted"):
        ll.checks.check_training_layout(lambda length, starts, k: training_parents(length, sorted(starts), k))


def test_check_single_call_layout_adds_no_node_for_an_empty_group():
    def first_slot_always(num_drafts, groups):  # appends a group's first slot before looking at its size
        parents = [-1] + list(range(num_drafts))
        for j in sorted(groups):
            parents.append(j)
            for _ in range(1, groups[j]):
                parents.append(len(parents) - 1)
        return parents

    with pytest.raises(CheckFailed, match="Case a prefix with no slots.*expected parents \\[-1, 0, 1, 1, 3\\]"):
        ll.checks.check_single_call_layout(first_slot_always)
