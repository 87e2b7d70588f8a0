"""Every drafter on Spec-Bench's six tasks (the shipped sample, ``logitlab.spec_bench``): tokens
per target call, the acceptance of each draft position and the speedup over ``ll.generate``, task
by task, as the field's leaderboard reports them (for a 7B target on a GPU; ours is SmolLM2-135M on
this machine)."""

from __future__ import annotations

import re
import statistics

import torch

from .. import spec_bench
from ..decoding.generate import generate
from ..devices import model_device
from ..speculative.loop import speculative_generate
from .costmodel import calibrate, predicted_speedups
from .drafting import by_position, own_price, pass_calls, time_against_ar
from .prompts import chat


def shipped_drafters(model) -> dict:
    """The book's trained drafters for ``model``: the draft model, the Medusa heads, the EAGLE
    drafter and two PaSS look-ahead embeddings (k = 2)."""
    from ..speculative import draft_model, eagle, medusa_heads, pass_embeddings

    return {"draft": draft_model.load_pretrained(model), "medusa": medusa_heads.load_pretrained(model),
            "eagle": eagle.load_pretrained(model), "lookahead": pass_embeddings.load_pretrained(model, k=2)}


PASS = "PaSS two-call, k=2"  # its drafting calls are target passes too (pass_calls)
# A warm table's guesses are kept deeper into the tree: the cold row's 8 nodes, and 24, which
# keeps more tokens per call for a dearer pass (chapter 10 weighs the two).
WARM_NODES = (8, 24)
WARMED = "Token Recycling, table warmed on {} other prompt{} ({}-node tree, depth <= 6)"


def warmed_table(model, tokenizer, prompts: int, new_tokens: int) -> torch.Tensor:
    """Token Recycling's table after the target answered the first ``prompts`` of the book's 40
    training prompts (``logitlab.training.data``; none is a Spec-Bench prompt), greedily,
    ``new_tokens`` tokens each, through a 24-node tree: guesses the target made on other text."""
    from ..speculative.token_recycling import TokenRecycler
    from ..training.data import prompt_ids

    every = prompt_ids(tokenizer)  # tokenised once: the check and the loop both need them
    if not isinstance(prompts, int) or isinstance(prompts, bool) or not 1 <= prompts <= len(every):
        raise ValueError(f"warm_prompts must be an int between 1 and {len(every)}, got {prompts!r}")
    recycler = TokenRecycler(model.config.vocab_size, nodes=24)
    for ids in every[:prompts]:
        speculative_generate(model, recycler, torch.tensor([ids], device=model_device(model)), gamma=6,
                             max_new_tokens=new_tokens, temperature=0, eos_token_id=[])
    return recycler.table


def drafting_runs(model, drafters: dict, temperature: float, new_tokens: int) -> dict:
    """label -> fn(ids, generator): ``ll.generate`` first, then each drafter in one setting
    (prompt lookup, the suffix automaton, Token Recycling, the two combined, the draft model's
    chain, Medusa's tree, PaSS, EAGLE's chain and tree), all exact (rejection sampling, or greedy
    at T = 0). The drafters without a model start empty on every prompt: Token Recycling's table
    learns only from the passes of the run it drafts for, never from another prompt of the
    benchmark. Where ``drafters`` holds a ``"recycling table"`` (``warmed_table``, on ``n`` other
    prompts), two more rows start every prompt from a copy of it (``WARMED``, trees of ``WARM_NODES``)."""
    from ..speculative.copy_or_recycle import CopyOrRecycle
    from ..speculative.draft_model import DraftModelDrafter
    from ..speculative.eagle import EagleDrafter
    from ..speculative.medusa_heads import medusa_generate
    from ..speculative.prompt_lookup import PromptLookupDrafter
    from ..speculative.suffix_automaton import SuffixDrafter
    from ..speculative.token_recycling import TokenRecycler

    common = dict(max_new_tokens=new_tokens, temperature=temperature, eos_token_id=[])

    def chain(make, gamma):
        return lambda ids, g: speculative_generate(model, make(), ids, gamma=gamma, generator=g, **common)

    tree = dict(top_k=3, nodes=10)
    prompts, table = drafters.get("warm prompts"), drafters.get("recycling table")
    warm = {} if table is None else {
        WARMED.format(prompts, "" if prompts == 1 else "s", n): chain(
            lambda n=n: TokenRecycler(model.config.vocab_size, nodes=n, table=table), 6) for n in WARM_NODES}
    return {
        "ll.generate": lambda ids, g: generate(model, ids, generator=g, **common),
        "prompt lookup (gamma=5)": chain(lambda: PromptLookupDrafter(model.config.vocab_size), 5),
        "suffix automaton (gamma=5)": chain(lambda: SuffixDrafter(model.config.vocab_size), 5),
        "Token Recycling (8-node tree, depth <= 6)": chain(lambda: TokenRecycler(model.config.vocab_size, nodes=8), 6),
        "suffix match else Token Recycling (min_match=2, 8 nodes)": chain(
            lambda: CopyOrRecycle(model.config.vocab_size, min_match=2, nodes=8), 6),
        **warm,
        "draft model (gamma=3)": chain(lambda: DraftModelDrafter(drafters["draft"]), 3),
        "Medusa heads, tree (3, 2, 1)": lambda ids, g: medusa_generate(
            model, drafters["medusa"], ids, branching=(3, 2, 1), generator=g, **common),
        PASS: chain(lambda: drafters["lookahead"], 3),
        "EAGLE chain (gamma=3)": chain(lambda: EagleDrafter(drafters["eagle"]), 3),
        "EAGLE tree (top_k=3, 10 nodes, depth 4)": chain(lambda: EagleDrafter(drafters["eagle"], tree=tree), 4),
    }


def forecasts(model, runs: dict, held_out, context) -> dict:
    """The cost model's forecast of each drafter's speedup (``ll.generate`` excluded), its pass
    sizes and drafter time taken from a run on ``held_out`` prompts (not the timed ones), every
    pass priced at v(n) after ``context``. PaSS drafts with passes of the target, which the cost
    model already prices, so its drafter time is not added a second time."""
    drafters = {label: fn for label, fn in runs.items() if label != "ll.generate"}
    seen = calibrate(model, {label: fn for label, fn in drafters.items() if label != PASS}, held_out)
    if PASS in drafters:
        seen |= calibrate(model, {PASS: drafters[PASS]}, held_out, drafter_seconds=lambda result: 0.0)
    return predicted_speedups(model, seen, context)


@torch.inference_mode()
def bench_spec_bench(table, model, tokenizer, per_task: int = 2, new_tokens: int = 128, temperatures=(0.0, 1.0),
                     repeat: int = 3, tasks=None, drafters: dict | None = None, only: str | None = None,
                     warm_prompts: int = 40) -> None:
    """For each of Spec-Bench's tasks (``tasks``, default all six), the first turn of the first
    ``per_task`` questions of the shipped sample, ``new_tokens`` tokens each, at each temperature:
    every drafter of ``drafting_runs`` timed in turn with ``ll.generate`` (checked to give the
    greedy tokens at T = 0); each row carries its tokens per target pass (PaSS's drafting calls
    counted), the cost model's forecast of its speedup and the acceptance of each draft position.
    The forecast is calibrated on the task's next question (``per_task + 1``-th, never timed) and
    prices passes after a context as long as the timed prompts plus half the new tokens, the
    middle of their answers. ``drafters``: the trained drafters to measure (default
    ``shipped_drafters``), e.g. newly trained ones against the shipped. ``only``: a regular
    expression; only the drafters whose label it finds run (``ll.generate`` always does), e.g.
    ``"lookup|suffix|Recycling"`` for the drafters that need no training (chapter 10).
    ``warm_prompts``: how many of the book's training prompts warm the table of the rows that
    start Token Recycling warm (``warmed_table``, made once, before any row is timed)."""
    chosen = {task: spec_bench.questions(task) for task in tasks or spec_bench.TASKS}  # bad names fail here
    if not all(1 <= per_task < len(found) for found in chosen.values()):  # one question is kept for the forecast
        raise ValueError(f"per_task must be between 1 and {spec_bench.SAMPLE_PER_TASK - 1}, got {per_task!r}")
    if only is not None:
        try:
            re.compile(only)
        except (TypeError, re.error) as err:
            raise ValueError(f"only must be a regular expression over the drafters' labels, got {only!r}") from err
    drafters = shipped_drafters(model) if drafters is None else drafters  # loaded once the input is known good
    if only is None or re.search(only, WARMED):
        drafters = {**drafters, "warm prompts": warm_prompts,
                    "recycling table": warmed_table(model, tokenizer, warm_prompts, new_tokens)}
    for task, found in chosen.items():
        prompts = [chat(tokenizer, q.turns[0]) for q in found[:per_task]]
        held_out = [chat(tokenizer, found[per_task].turns[0])]
        # A pass's time depends on how long the cached context is, not on which tokens it holds.
        length = round(statistics.mean(ids.shape[1] for ids in prompts)) + new_tokens // 2
        context = [int(prompts[0][0, -1])] * length
        for temperature in temperatures:
            runs = {label: fn for label, fn in drafting_runs(model, drafters, temperature, new_tokens).items()
                    if only is None or label == "ll.generate" or re.search(only, label)}
            time_against_ar(table, model, runs, prompts, temperature, new_tokens, repeat, calls={PASS: pass_calls},
                            unit="target pass", predicted=forecasts(model, runs, held_out, context),
                            price=own_price(model, context, target_drafts=(PASS,)), describe=by_position,
                            task=f"Spec-Bench {task}")
