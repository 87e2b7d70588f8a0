"""The checkers of chapters 4 and 5 accept the right answers and reject plausible wrong ones."""

import pytest
import torch

import logitlab as ll
from logitlab.course.checks import CheckFailed


def beam_step(logprobs, beam_scores, num_beams):
    vocab = logprobs.shape[-1]
    scores, flat = (beam_scores[:, None] + logprobs).flatten().topk(num_beams)
    return scores, flat // vocab, flat % vocab


def backtrack(parents, tokens, beam):
    out = []
    for t in range(len(tokens) - 1, -1, -1):
        out.append(int(tokens[t][beam]))
        beam = int(parents[t][beam])
    return out[::-1]


def tree_positions(parents, offset):
    positions = []
    for p in parents:
        positions.append(offset if p < 0 else positions[p] + 1)
    return torch.tensor(positions)


def test_right_answers_pass(capsys):
    ll.checks.check_beam_step(beam_step)
    ll.checks.check_backtrack(backtrack)
    ll.checks.check_tree_positions(tree_positions)
    out = capsys.readouterr().out
    assert "check_beam_step: all" in out and "check_backtrack: all" in out and "check_tree_positions: all" in out


@pytest.mark.parametrize("check, wrong", [
    # Ignores the beams' scores so far: picks by the next token alone.
    (ll.checks.check_beam_step, lambda lp, s, n: beam_step(lp, torch.zeros_like(s), n)),
    # The best extension of each beam, instead of the best over all beams.
    (ll.checks.check_beam_step, lambda lp, s, n: (lambda v, i: (v, torch.arange(len(v)), i))(
        *(s[:, None] + lp).max(dim=-1))),
    # Reads the tokens of one row instead of following the parents.
    (ll.checks.check_backtrack, lambda p, t, b: [int(x[b]) for x in t]),
    # Positions of the flattened sequence instead of depths.
    (ll.checks.check_tree_positions, lambda p, o: torch.arange(len(p)) + o),
    # Depth counted from 1.
    (ll.checks.check_tree_positions, lambda p, o: tree_positions(p, o) + 1),
])
def test_wrong_answers_fail(check, wrong):
    with pytest.raises(CheckFailed):
        check(wrong)


def verify_one(draft_tokens, q, p, generator):
    for i, d in enumerate(draft_tokens.tolist()):
        if torch.rand(1, generator=generator).item() * q[i, d] >= p[i, d]:  # rejected
            residual = (p[i] - q[i]).clamp_min(0)
            return i, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))
    return len(draft_tokens), int(torch.multinomial(p[-1], 1, generator=generator))


def test_check_verify_accepts_a_right_answer_and_rejects_wrong_ones(capsys):
    ll.checks.check_verify(verify_one, trials=5000)
    assert "check_verify: all" in capsys.readouterr().out

    def residual_is_p(draft_tokens, q, p, generator):
        for i, d in enumerate(draft_tokens.tolist()):
            if torch.rand(1, generator=generator).item() * q[i, d] >= p[i, d]:
                return i, int(torch.multinomial(p[i], 1, generator=generator))
        return len(draft_tokens), int(torch.multinomial(p[-1], 1, generator=generator))

    def accept_always(draft_tokens, q, p, generator):
        return len(draft_tokens), int(torch.multinomial(p[-1], 1, generator=generator))

    for wrong in (residual_is_p, accept_always):
        with pytest.raises(CheckFailed):
            ll.checks.check_verify(wrong, trials=5000)


def test_check_expected_tokens_accepts_a_right_answer_and_rejects_wrong_ones(capsys):
    ll.checks.check_expected_tokens(lambda alpha, gamma: sum(alpha ** i for i in range(gamma + 1)))
    assert "check_expected_tokens: all" in capsys.readouterr().out

    wrong_answers = [
        lambda alpha, gamma: sum(alpha ** i for i in range(1, gamma + 1)),  # forgets the token every call yields
        lambda alpha, gamma: (1 - alpha ** gamma) / (1 - alpha),  # forgets the bonus token (and divides by 0)
        lambda alpha, gamma: 1 / (1 - alpha) if alpha < 1 else float(gamma + 1),  # gamma = infinity
        lambda alpha, gamma: None,  # forgets to return
    ]
    for wrong in wrong_answers:
        with pytest.raises(CheckFailed):
            ll.checks.check_expected_tokens(wrong)


def beam_step_best_of_each_row_first(logprobs, beam_scores, num_beams):
    # keeps the num_beams best extensions of each row, then the best of those: a row has only V
    values, tokens = (beam_scores[:, None] + logprobs).topk(num_beams, dim=-1)
    scores, flat = values.flatten().topk(num_beams)
    return scores, flat // num_beams, tokens.flatten()[flat]


def test_check_beam_step_wants_more_beams_than_tokens_to_work():
    with pytest.raises(CheckFailed, match="Case 7 of 7 \\(more beams to keep than tokens in the vocabulary\\).*raised"):
        ll.checks.check_beam_step(beam_step_best_of_each_row_first)


def verify_one_global_random(draft_tokens, q, p, generator):
    # right in distribution, but its random numbers come from torch's global generator
    for i, d in enumerate(draft_tokens.tolist()):
        if torch.rand(1).item() * q[i, d] >= p[i, d]:
            residual = (p[i] - q[i]).clamp_min(0)
            return i, int(torch.multinomial(residual / residual.sum(), 1))
    return len(draft_tokens), int(torch.multinomial(p[-1], 1))


def test_check_verify_wants_every_random_number_from_the_generator():
    with pytest.raises(CheckFailed, match="The reproducibility case \\(the same seed twice\\).*generator you are given"):
        ll.checks.check_verify(verify_one_global_random, trials=5000)
