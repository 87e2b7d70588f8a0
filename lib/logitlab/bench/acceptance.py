"""Draft quality without a clock: how many tokens each trained drafter yields per target pass,
and how often each draft position is kept, on Spec-Bench questions the timed bench never uses.

The bench's Spec-Bench section times the first questions of each task and calibrates its forecast
on the next one; choosing a training recipe on those questions would tune the drafters to the
test. This module runs the trained drafters (the same settings as that section) on the *other*
questions of the shipped sample, the development set, and counts instead of timing: tokens per
target pass and the acceptance of every draft position, per task and over all of them. Counts
do not depend on what else the machine is doing, so it can run beside a training run, and one
run settles a comparison (at T = 0 the drafts and verdicts are deterministic).

    python -m logitlab.bench.acceptance --eagle new_eagle.safetensors --only EAGLE

compares a newly trained EAGLE drafter (any of ``--draft``, ``--medusa``, ``--eagle``,
``--lookahead`` replaces the shipped weights) on the development questions.

At T = 0 it also runs the draft model once over each of its runs' final text (``first_guesses``):
its per-token first guess, the alpha that ``expected_tokens`` wants at T = 0, beside the per-call
first draft kept, which understates it because misses come in runs.
"""

from __future__ import annotations

import argparse
import re

import torch

from .. import spec_bench
from ..devices import generator as seeded_generator
from ..speculative.theory import expected_tokens, greedy_chain_calls
from .drafting import by_position, pass_calls
from .prompts import chat
from .spec_bench import PASS, drafting_runs

# The timed bench uses each task's first two questions and calibrates on the third.
FIRST_DEV = 3
TRAINED = "draft model|Medusa|PaSS|EAGLE"
DRAFT = "draft model (gamma=3)"


def dev_prompts(tokenizer, tasks=None, per_task: int | None = None) -> dict:
    """task -> the chat prompts of its development questions (the sample's ``FIRST_DEV``-th on),
    the first ``per_task`` of them if given."""
    if per_task is not None and (isinstance(per_task, bool) or not isinstance(per_task, int)
                                 or not 1 <= per_task <= spec_bench.SAMPLE_PER_TASK - FIRST_DEV):
        raise ValueError(f"per_task must be an int between 1 and {spec_bench.SAMPLE_PER_TASK - FIRST_DEV}, "
                         f"got {per_task!r}")
    chosen = {task: spec_bench.questions(task)[FIRST_DEV:] for task in tasks or spec_bench.TASKS}
    return {task: [chat(tokenizer, q.turns[0]) for q in found[:per_task]] for task, found in chosen.items()}


@torch.inference_mode()
def acceptance(model, prompts: dict, drafters: dict, new_tokens: int = 128, temperature: float = 0.0,
               only: str = TRAINED) -> dict:
    """label -> task -> (new tokens, target passes, the results): every drafter of
    ``drafting_runs`` whose label ``only`` finds, on ``prompts`` (``dev_prompts``), prompt i with
    a generator seeded i (as the bench seeds them). PaSS's drafting passes count as target passes
    (``pass_calls``)."""
    try:
        pattern = re.compile(only)
    except (TypeError, re.error) as err:
        raise ValueError(f"only must be a regular expression over the drafters' labels, got {only!r}") from err
    runs = {label: fn for label, fn in drafting_runs(model, drafters, temperature, new_tokens).items()
            if label != "ll.generate" and pattern.search(label)}
    if not runs:
        raise ValueError(f"only={only!r} matches none of the drafters")
    out = {}
    for label, fn in runs.items():
        count = pass_calls if label == PASS else (lambda r: r.model_calls)  # a draft model's steps are its own
        out[label] = {}
        for task, found in prompts.items():
            results = [fn(ids, seeded_generator(model, i)) for i, ids in enumerate(found)]
            tokens = sum(len(r.new_tokens[0]) for r in results)
            out[label][task] = (tokens, sum(map(count, results)), results)
    return out


def report(found: dict) -> str:
    """One line per drafter and task, and one over all tasks: tokens per target pass and the
    acceptance by draft position."""
    lines = []
    width = max(len(task) for tasks in found.values() for task in [*tasks, "all tasks"])
    for label, tasks in found.items():
        lines.append(label)
        for task, (tokens, passes, results) in tasks.items():
            lines.append(f"  {task:<{width}} {tokens / passes:.2f} tokens per target pass{by_position(results)}")
        tokens, passes = (sum(t[i] for t in tasks.values()) for i in (0, 1))
        every = [r for *_, results in tasks.values() for r in results]
        lines.append(f"  {'all tasks':<{width}} {tokens / passes:.2f} tokens per target pass{by_position(every)}")
    return "\n".join(lines)


@torch.inference_mode()
def first_guesses(draft, results) -> list[list[bool]]:
    """For each greedy run in ``results``: whether ``draft``, run once over the run's final text,
    guesses each new token from the tokens before it (the hits of ``greedy_chain_calls``)."""
    hits = []
    for r in results:
        sequence, new = r.sequences[0], r.new_tokens[0]
        logits = draft(sequence[None]).logits[0, len(sequence) - len(new) - 1: -1]
        hits.append((logits.argmax(-1) == new).tolist())
    return hits


def first_guess_report(draft, tasks: dict, gamma: int = 3) -> str:
    """Per task (``acceptance``'s entry for the draft model, greedy runs): the per-token first
    guess over the tokens a call can draft (all but the prefill's), how often a miss follows a
    miss, ``expected_tokens`` at that first guess, and how many runs made exactly the calls their
    hits give (a near-tie that falls the other way in the loop's passes can cost one)."""
    lines = [f"{DRAFT}, run once over each greedy run's text"]
    width = max(len(task) for task in [*tasks, "all tasks"])
    every, matched = [], 0
    for task, (*_, results) in tasks.items():
        hits = first_guesses(draft, results)
        matched += sum(greedy_chain_calls(h, gamma) == [row[0] for row in r.accepted] for h, r in zip(hits, results))
        every += hits
        lines.append(f"  {task:<{width}} " + _guess_line(hits, gamma))
    lines.append(f"  {'all tasks':<{width}} " + _guess_line(every, gamma))
    lines.append(f"  {matched} of {len(every)} runs made exactly the calls their hits give")
    return "\n".join(lines)


def first_guess_stats(hits: list[list[bool]]) -> tuple[float, float]:
    """Over runs' hits (``first_guesses``), leaving out each run's first token (the prefill's):
    the share of tokens guessed, and the share of misses that follow a miss."""
    drafted = [h for run in hits for h in run[1:]]
    if not drafted:
        raise ValueError("hits must hold at least one run with two or more tokens")
    after_miss = [b for run in hits for a, b in zip(run[1:], run[2:]) if not a]
    return sum(drafted) / len(drafted), sum(not b for b in after_miss) / max(len(after_miss), 1)


def _guess_line(hits: list[list[bool]], gamma: int) -> str:
    guess, after_miss = first_guess_stats(hits)
    return (f"first guess {guess:.3f} per token, a miss after a miss {after_miss:.3f} (any miss "
            f"{1 - guess:.3f}), expected_tokens at the first guess {expected_tokens(guess, gamma):.2f}")


def main(argv=None) -> None:
    import logitlab as ll
    from ..speculative import draft_model, eagle, medusa_heads, pass_embeddings

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("draft", "medusa", "eagle", "lookahead"):
        parser.add_argument(f"--{name}", help=f"the {name} weights to measure (default: the shipped ones)")
    parser.add_argument("--only", default=TRAINED, help="a regular expression over the drafters' labels")
    parser.add_argument("--per-task", type=int, help="development questions per task (default all)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--device", help="cuda, mps or cpu (default: the best there is)")
    args = parser.parse_args(argv)
    model, tokenizer = ll.load("smollm2-135m", device=args.device)
    prompts = dev_prompts(tokenizer, per_task=args.per_task)
    drafters = {"draft": draft_model.load_pretrained(model, args.draft),
                "medusa": medusa_heads.load_pretrained(model, args.medusa),
                "eagle": eagle.load_pretrained(model, args.eagle),
                "lookahead": pass_embeddings.load_pretrained(model, args.lookahead, k=2)}
    found = acceptance(model, prompts, drafters, args.new_tokens, args.temperature, args.only)
    print(report(found))
    if args.temperature == 0 and DRAFT in found:
        print(first_guess_report(drafters["draft"], found[DRAFT]))


if __name__ == "__main__":
    main()
