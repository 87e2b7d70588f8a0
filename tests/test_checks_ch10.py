"""The checkers of chapter 10's exercises accept right answers and reject typical mistakes, each at
the case that explains it; the answer that hands the exercise back to the library is refused."""

import pytest

from logitlab.course.checks import CheckFailed, check_suffix_automaton, check_tree_size
from logitlab.speculative.suffix_automaton import SuffixAutomaton
from logitlab.speculative.token_recycling import best_size, template_chances, tree_template


def suffix_automaton(tokens, clone=True, copy_transitions=True):
    """The online construction, written again here (the check forbids the library's), with two
    switches for two mistakes: never cloning, and sharing the original's transitions in a clone."""
    nxt, link, length, last = [{}], [-1], [0], 0
    for token in tokens:
        nxt.append({})
        link.append(-1)
        length.append(length[last] + 1)
        new, p = len(nxt) - 1, last
        while p != -1 and token not in nxt[p]:
            nxt[p][token] = new
            p = link[p]
        if p == -1:
            link[new] = 0
        else:
            q = nxt[p][token]
            if length[q] == length[p] + 1 or not clone:
                link[new] = q
            else:
                nxt.append(dict(nxt[q]) if copy_transitions else nxt[q])
                link.append(link[q])
                length.append(length[p] + 1)
                c = len(nxt) - 1
                while p != -1 and nxt[p].get(token) == q:
                    nxt[p][token] = c
                    p = link[p]
                link[q] = link[new] = c
        last = new
    return nxt, link, length


def test_a_right_automaton_passes(capsys):
    check_suffix_automaton(suffix_automaton)
    assert "check_suffix_automaton: all 10 cases passed" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, case", [
    (lambda t: suffix_automaton(t, clone=False), "[1, 2, 2]"),
    (lambda t: suffix_automaton(t, copy_transitions=False), "Case [1, 2, 2, 2, 2]"),
    (lambda t: (lambda n, l, m: (n, l, [x - 1 if x else 0 for x in m]))(*suffix_automaton(t)), "Case [1]"),
    (lambda t: (lambda n, l, m: (n, [0] + l[1:], m))(*suffix_automaton(t)), "Case [1]"),
    (lambda t: (lambda n, l, m: (n, [-1] + [0] * (len(l) - 1), m))(*suffix_automaton(t)), "Case [1, 1]: the suffix link"),
])
def test_wrong_automata_fail_at_their_case(wrong, case):
    with pytest.raises(CheckFailed, match=case.replace("[", r"\[").replace("]", r"\]")):
        check_suffix_automaton(wrong)


def test_a_trie_of_every_substring_is_too_big():
    def trie(tokens):  # accepts exactly the substrings, one state per distinct substring
        nxt, strings = [{}], [()]
        for i in range(len(tokens)):
            state = 0
            for token in tokens[i:]:
                if token not in nxt[state]:
                    nxt.append({})
                    strings.append(strings[state] + (token,))
                    nxt[state][token] = len(nxt) - 1
                state = nxt[state][token]
        node = {s: i for i, s in enumerate(strings)}
        return nxt, [-1] + [node[s[1:]] for s in strings[1:]], [len(s) for s in strings]

    with pytest.raises(CheckFailed, match=r"Case \[1, 2, 1\]: expected 4 states \(one per set of end positions\), got 6"):
        check_suffix_automaton(trie)


def test_the_library_answer_is_refused():
    with pytest.raises(CheckFailed, match=r"library's own code \(ll\.speculative\.suffix_automaton\."):
        check_suffix_automaton(lambda t: (lambda a: (a.next, a.link, a.length))(SuffixAutomaton(t)))
    with pytest.raises(CheckFailed, match=r"library's own code \(ll\.speculative\.token_recycling\.best_size\)"):
        check_tree_size(best_size)


def tree_size(costs, rank_probs, overhead):
    sizes = sorted(n - 1 for n in costs if n >= 2)
    rate = [(1 + sum(template_chances(*tree_template(n, rank_probs), rank_probs))) / (costs[n + 1] + overhead)
            for n in sizes]
    return sizes[rate.index(max(rate))]


def test_a_right_tree_size_passes_and_agrees_with_the_library(capsys):
    check_tree_size(tree_size)
    assert "check_tree_size: all 7 cases passed" in capsys.readouterr().out
    cpu = {1: 1.0, 2: 1.07, 3: 1.11, 5: 1.08, 9: 1.21, 17: 1.44, 33: 2.0}
    assert tree_size(cpu, (0.45, 0.15, 0.08), 0.0) == best_size(cpu, (0.45, 0.15, 0.08))


@pytest.mark.parametrize("wrong, case", [
    (lambda c, r, o: max((n - 1 for n in c if n >= 2), key=lambda n: 1 + sum(
        template_chances(*tree_template(n, r), r)) / (c[n] + o)), r"this CPU's v\(n\).*raised KeyError"),
    (lambda c, r, o: tree_size(c, r, 0.0), "adds half a step per call"),
    (lambda c, r, o: tree_size(c, (0.45, 0.15, 0.08, 0.05, 0.04, 0.03, 0.02, 0.02), o), "measured on the book"),
    (lambda c, r, o: max(n - 1 for n in c), "this CPU's v\\(n\\)"),
])
def test_wrong_tree_sizes_fail_at_their_case(wrong, case):
    with pytest.raises(CheckFailed, match=case):
        check_tree_size(wrong)
