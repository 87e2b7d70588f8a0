"""Rows for chapters 6 to 8: prompt lookup, the draft model, Medusa heads and typical acceptance, PaSS."""

from __future__ import annotations

import torch

from ..decoding.generate import generate
from ..devices import generator as seeded_generator
from ..measure.table import Table
from ..measure.timing import forward_seconds, interleaved_median_times
from ..speculative.draft_model import DraftModelDrafter
from ..speculative.loop import speculative_generate
from ..speculative.theory import pooled_alpha
from .costmodel import PassLog, calibrate, predicted_speedups, tally
from .prompts import CALIBRATION, CALIBRATION_GROUNDED, DRAFT_PROMPTS, GROUNDED, OPEN_ENDED, cached_prefix, chat


@torch.inference_mode()
def bench_speculative(table: Table, model, tokenizer, new_tokens: int = 96, gamma: int = 5, repeat: int = 3,
                      stock=None) -> None:
    """Prompt lookup against our AR loop and Hugging Face's prompt lookup (on ``stock``), greedy,
    on input-grounded and open-ended prompts, with the cost model's forecast from other prompts."""
    from transformers import GenerationConfig

    from ..speculative.prompt_lookup import PromptLookupDrafter

    stock = model if stock is None else stock
    vocab = model.config.vocab_size
    context = cached_prefix(tokenizer)

    def lookup(ids, g=None):  # a fresh drafter per run: it keeps no state between runs
        return speculative_generate(model, PromptLookupDrafter(vocab), ids, gamma=gamma, max_new_tokens=new_tokens,
                                    temperature=0, eos_token_id=[])

    tasks = [("input-grounded", GROUNDED, CALIBRATION_GROUNDED), ("open-ended", OPEN_ENDED, CALIBRATION)]
    for label, questions, held_out in tasks:
        prompts = [chat(tokenizer, q) for q in questions]
        calibration = calibrate(model, {"lookup": lookup}, [chat(tokenizer, q) for q in held_out])
        predicted = predicted_speedups(model, calibration, context)["lookup"]
        results = {}

        def ours():
            results["ar"] = [generate(model, ids, max_new_tokens=new_tokens, temperature=0, eos_token_id=[])
                             for ids in prompts]

        def lookup_run():
            results["pl"] = [lookup(ids) for ids in prompts]

        # The same work as ours: no EOS (the model emits <|im_end|> and goes on; forbidding it
        # changes the tokens from there), and an explicit attention mask: with no EOS id,
        # Hugging Face would take the pad token (id 2, <|im_end|>, inside every chat prompt)
        # for padding and decode another context.
        config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=[],
                                  prompt_lookup_num_tokens=gamma, pad_token_id=2)

        def theirs():
            results["hf"] = [stock.generate(ids, attention_mask=torch.ones_like(ids),
                                            generation_config=config) for ids in prompts]

        ar_t, pl_t, hf_t = interleaved_median_times([ours, lookup_run, theirs], repeat=repeat)
        for a, b, h in zip(results["ar"], results["pl"], results["hf"]):
            if not a.new_tokens[0].tolist() == b.new_tokens[0].tolist() == h[0, -new_tokens:].tolist():
                raise AssertionError("prompt lookup (ours or Hugging Face's) changed the greedy tokens")
        runs = results["pl"]
        calls = sum(r.model_calls for r in runs)
        name = f"{len(prompts)} {label} prompts, {new_tokens} tokens each, greedy"
        table.add(f"ll.generate, {name}", ar_t)
        table.add(f"prompt lookup (gamma={gamma}, alpha={pooled_alpha(runs):.2f}, "
                  f"{new_tokens * len(prompts) / calls:.2f} tokens per target call, predicted {predicted:.2f}x), "
                  f"{name}", pl_t, ar_t / pl_t, "faster than our AR loop")
        table.add(f"Hugging Face prompt lookup, {name}", hf_t, hf_t / pl_t, "slower than ours, same algorithm")


@torch.inference_mode()
def bench_draft_model(table: Table, model, tokenizer, new_tokens: int = 128, gammas=(1, 2, 3, 4), repeat: int = 3,
                      stock=None) -> None:
    """The shipped draft model against our AR loop at T = 0 and 1, and against Hugging Face's
    assisted generation at T = 0 (on ``stock``: the model, fast path off). At each temperature
    the cost model, calibrated on other prompts, chooses gamma among ``gammas``; the row gives
    its forecast beside the measured speedup."""
    from ..speculative.draft_model import load_pretrained

    stock = model if stock is None else stock
    draft = load_pretrained(model)
    prompts = [chat(tokenizer, q) for q in DRAFT_PROMPTS]
    held_out = [chat(tokenizer, q) for q in CALIBRATION]
    context = cached_prefix(tokenizer)
    c = forward_seconds(draft, context, 1) / forward_seconds(model, context, 1)

    def drafting(gamma, temperature, tokens):
        return lambda ids, g: speculative_generate(model, DraftModelDrafter(draft), ids, gamma=gamma, generator=g,
                                                   max_new_tokens=tokens, temperature=temperature, eos_token_id=[])

    for temperature in [0.0, 1.0]:
        calibration = calibrate(model, {g: drafting(g, temperature, new_tokens) for g in gammas}, held_out)
        forecast = predicted_speedups(model, calibration, context)
        gamma = max(gammas, key=lambda g: forecast[g])
        runs = {"ll.generate": lambda ids, g: generate(model, ids, generator=g, max_new_tokens=new_tokens,
                                                       temperature=temperature, eos_token_id=[]),
                "spec": drafting(gamma, temperature, new_tokens)}
        if temperature == 0:
            from transformers import GenerationConfig

            # No EOS and an explicit attention mask, as for prompt lookup above; a constant gamma, no early stop.
            config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=[], pad_token_id=2)
            draft.generation_config.update(num_assistant_tokens=gamma, num_assistant_tokens_schedule="constant",
                                           assistant_confidence_threshold=0.0)
            runs["hf"] = lambda ids, g: stock.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                                       assistant_model=draft)
        passes = {}
        times, results = timed_runs(model, runs, prompts, repeat, passes=passes)
        spec = results["spec"]
        own = own_price(model, context)({"spec": spec}, passes)["spec"]
        if temperature == 0:
            for a, b, h in zip(results["ll.generate"], spec, results["hf"]):
                if not a.new_tokens[0].tolist() == b.new_tokens[0].tolist() == h[0, -new_tokens:].tolist():
                    raise AssertionError("greedy speculative decoding changed the greedy tokens")
        per_call = new_tokens * len(prompts) / sum(r.model_calls for r in spec)
        name = f"{len(prompts)} prompts, {new_tokens} tokens each, T={temperature:g}"
        choice = ", ".join(f"{g}: {forecast[g]:.2f}x" for g in gammas)
        table.add(f"ll.generate, {name}", times[0])
        table.add(f"draft model (gamma={gamma}, the cost model's choice of [{choice}]; alpha={pooled_alpha(spec):.2f}, "
                  f"c={c:.3f}, {per_call:.2f} tokens per call, predicted {forecast[gamma]:.2f}x, "
                  f"{own:.2f}x at its own passes), {name}",
                  times[1], times[0] / times[1], "faster than our AR loop")
        if temperature == 0:
            table.add(f"Hugging Face assisted generation, same draft, constant gamma={gamma}, {name}", times[2],
                      times[2] / times[1], "slower than ours, same algorithm")


def timed_runs(model, runs: dict, prompts, repeat: int, warmup: int = 1,
               passes: dict | None = None) -> tuple[list, dict]:
    """Time ``runs`` (label -> fn(ids, generator)) in turn on every prompt, each prompt with its
    own seeded generator, after ``warmup`` untimed rounds; returns the median times and
    ``{label: results of the last round}``. Given a dict, ``passes`` receives ``{label: the
    sizes of the target's passes in the last round}``, the prefills left out (a hook on the
    target's body records them: the same small cost for every contender)."""
    results = {}

    def one(label, i, ids):
        if passes is None:
            return runs[label](ids, seeded_generator(model, i))
        with PassLog(model) as log:
            result = runs[label](ids, seeded_generator(model, i))
        passes[label] += log.sizes[1:]
        return result

    def timed(label):
        def fn():
            if passes is not None:
                passes[label] = []
            results[label] = [one(label, i, ids) for i, ids in enumerate(prompts)]
        return fn

    return interleaved_median_times([timed(label) for label in runs], repeat=repeat, warmup=warmup), results


def time_against_ar(table: Table, model, runs: dict, prompts, temperature: float, new_tokens: int, repeat: int,
                     calls=lambda r: r.model_calls, unit: str = "call", predicted: dict | None = None,
                     warmup: int = 1, describe=None, task: str | None = None, price=None) -> None:
    """Time ``runs`` (label -> fn(ids, generator); the first is the AR baseline ``ll.generate``)
    alternately on every prompt, check at T = 0 that each gives the baseline's greedy tokens, and
    add a row per run with its tokens per ``unit`` (``calls(result)`` counts them; a dict gives
    the count of some labels, the others counting the loop's calls), the cost model's forecast
    (``predicted``: label -> speedup), its speedup, and what ``describe(results)`` says of its
    results. ``price``: fn(results, passes) -> {label: speedup}, the cost model's price of each
    run's own timed passes (``own_price``), added after the forecast: the check of the model's
    costs apart from its forecast of the acceptance. ``task`` names the prompts in the rows."""
    passes = None if price is None else {}
    times, results = timed_runs(model, runs, prompts, repeat, warmup, passes)
    if temperature == 0:
        greedy = [r.new_tokens[0].tolist() for r in results["ll.generate"]]
        for label, outs in results.items():
            if [r.new_tokens[0].tolist() for r in outs] != greedy:
                raise AssertionError(f"{label} changed the greedy tokens")
    own = {} if price is None else price(results, passes)
    name = f"{len(prompts)} {task + ' ' if task else ''}prompts, {new_tokens} tokens each, T={temperature:g}"
    table.add(f"ll.generate, {name}", times[0])
    for label, seconds in list(zip(runs, times))[1:]:
        count = calls.get(label, lambda r: r.model_calls) if isinstance(calls, dict) else calls
        per_call = new_tokens * len(prompts) / sum(count(r) for r in results[label])
        forecast = f", predicted {predicted[label]:.2f}x" if predicted and label in predicted else ""
        forecast += f", {own[label]:.2f}x at its own passes" if label in own else ""
        forecast += describe(results[label]) if describe else ""
        table.add(f"{label} ({per_call:.2f} tokens per {unit}{forecast}), {name}", seconds, times[0] / seconds,
                  "faster than our AR loop")


def own_price(model, context, target_drafts=()):
    """``price`` for ``time_against_ar``: the cost model's speedup of each drafting run from its own
    timed passes (priced at v(n) measured after ``context``) and its drafter's recorded time,
    against plain decoding's one step per token. Where the forecast errs and this does not, the
    acceptance was what it missed. ``target_drafts``: labels that draft with passes of the target
    (PaSS's two calls), already priced as passes, so their drafter time is not added again."""
    def price(results, passes):
        seen = {}
        for label, outs in results.items():
            if label != "ll.generate":
                drafting = (lambda r: 0.0) if label in target_drafts else (lambda r: r.draft_seconds)
                seen[label] = tally(outs, passes[label], drafting)
        return predicted_speedups(model, seen, context)
    return price


@torch.inference_mode()
def bench_typical(table: Table, model, tokenizer, new_tokens: int = 64, gamma: int = 3,
                  trees=((2, 1), (3, 2, 1)), temperatures=(0.0, 0.7, 1.0, 1.3), repeat: int = 3) -> None:
    """The shipped Medusa heads (chapter 7) against our AR loop. At T = 0: as a chain and as
    trees, all greedy (checked to give the same tokens). Above 0, four rows: the chain under
    rejection sampling with the heads proposing their top tokens; the same with the heads
    sampling their proposals; the chain under typical acceptance (Medusa's defaults, argmax next
    token); and the largest tree under typical acceptance."""
    from ..speculative.medusa import MedusaDrafter
    from ..speculative.medusa_heads import load_pretrained, medusa_generate
    from ..speculative.typical import TypicalAcceptance

    heads = load_pretrained(model)
    prompts = [chat(tokenizer, q) for q in DRAFT_PROMPTS]
    held_out = [chat(tokenizer, q) for q in CALIBRATION]
    typical = TypicalAcceptance()
    context = cached_prefix(tokenizer)

    def build(temperature):
        common = dict(max_new_tokens=new_tokens, temperature=temperature, eos_token_id=[])

        def chain(proposals="argmax", acceptance=None):
            return lambda ids, g: speculative_generate(model, MedusaDrafter(heads, proposals), ids, gamma=gamma,
                                                       acceptance=acceptance, generator=g, **common)

        def tree(branching, acceptance=None):
            return lambda ids, g: medusa_generate(model, heads, ids, branching=branching, acceptance=acceptance,
                                                  generator=g, **common)

        runs = {"ll.generate": lambda ids, g: generate(model, ids, generator=g, **common)}
        if temperature == 0:
            runs[f"Medusa heads, chain (gamma={gamma})"] = chain()
            runs.update({f"Medusa heads, tree {b}": tree(b) for b in trees})
        else:
            runs[f"Medusa heads, chain (gamma={gamma}), rejection sampling, argmax proposals"] = chain()
            runs[f"Medusa heads, chain (gamma={gamma}), rejection sampling, sampled proposals"] = chain("sample")
            runs[f"Medusa heads, chain (gamma={gamma}), typical acceptance"] = chain(acceptance=typical)
            runs[f"Medusa heads, tree {trees[-1]}, typical acceptance"] = tree(trees[-1], typical)
        return runs

    for temperature in temperatures:
        runs = build(temperature)
        # The calibration runs every contender once, which also warms each up for the timing.
        predicted = predicted_speedups(model, calibrate(model, runs, held_out), context)
        time_against_ar(table, model, runs, prompts, temperature, new_tokens, repeat, predicted=predicted, warmup=0,
                        price=own_price(model, context))


def pass_calls(result) -> int:
    """Every forward pass of the target in a run: the loop's calls and, for PaSS's two-call
    drafter, its drafting calls (its first step is the shared prefill, already counted)."""
    return result.model_calls + max(0, result.drafter_steps - 1) if result.drafter_steps else result.model_calls


@torch.inference_mode()
def bench_pass(table: Table, model, tokenizer, new_tokens: int = 64, ks=tuple(range(1, 9)), single_ks=(1, 2, 4),
               temperatures=(0.0, 1.0), repeat: int = 3) -> None:
    """PaSS (chapter 8) with the shipped look-ahead embeddings against our AR loop, at T = 0 and 1:
    the paper's two-call algorithm for every k in ``ks``, and the single-call variant with slots
    after every prefix ("all") and after the likeliest one ("likely") for each k in
    ``single_ks``. Each row gives its tokens per target pass (drafting calls included). At T = 0
    every run is checked to give greedy decoding's tokens."""
    from ..speculative.pass_embeddings import load_pretrained, pass_generate

    prompts = [chat(tokenizer, q) for q in DRAFT_PROMPTS]
    held_out = [chat(tokenizer, q) for q in CALIBRATION]
    sets = {k: load_pretrained(model, k=k) for k in set(ks) | set(single_ks)}  # loaded once, outside the timings
    context = cached_prefix(tokenizer)

    def build(temperature):
        common = dict(max_new_tokens=new_tokens, temperature=temperature, eos_token_id=[])
        runs = {"ll.generate": lambda ids, g: generate(model, ids, generator=g, **common)}
        for k in ks:
            runs[f"PaSS two-call, k={k}"] = (
                lambda ids, g, k=k: speculative_generate(model, sets[k], ids, gamma=k + 1, generator=g, **common))
        for k in single_ks:
            for prefixes in ("all", "likely"):
                runs[f"PaSS single-call ({prefixes}), k={k}"] = (
                    lambda ids, g, k=k, prefixes=prefixes: pass_generate(
                        model, sets[k], ids, prefixes=prefixes, generator=g, **common))
        return runs

    for temperature in temperatures:
        runs = build(temperature)
        # PaSS drafts inside the target's own passes, which the cost model prices by their sizes.
        # The calibration runs every contender once, which also warms each up for the timing.
        calibration = calibrate(model, runs, held_out, drafter_seconds=lambda result: 0.0)
        time_against_ar(table, model, runs, prompts, temperature, new_tokens, repeat, calls=pass_calls,
                        unit="target pass", predicted=predicted_speedups(model, calibration, context),
                        warmup=0, price=own_price(model, context, target_drafts=tuple(runs)))


@torch.inference_mode()
def bench_eagle(table: Table, model, tokenizer, new_tokens: int = 128, gamma: int = 3,
                tree: dict | None = None, depth: int = 4, temperatures=(0.0, 1.0), repeat: int = 3) -> None:
    """The shipped EAGLE drafter (chapter 9) against our AR loop at T = 0 and 1: a chain of
    ``gamma`` drafts and EAGLE-2's dynamic tree (``tree``, ``depth`` levels), each under rejection
    sampling (exact), and above T = 0 also under typical acceptance (not exact). At T = 0 every run
    is checked to give greedy decoding's tokens; each row carries the cost model's forecast from
    the calibration prompts and the acceptance rate of each draft position."""
    from ..speculative.eagle import EagleDrafter, load_pretrained
    from ..speculative.typical import TypicalAcceptance

    drafter = load_pretrained(model)
    tree = dict(top_k=3, nodes=10) if tree is None else tree
    prompts = [chat(tokenizer, q) for q in DRAFT_PROMPTS]
    held_out = [chat(tokenizer, q) for q in CALIBRATION]
    context = cached_prefix(tokenizer)

    def build(temperature):
        common = dict(max_new_tokens=new_tokens, temperature=temperature, eos_token_id=[])

        def eagle(shape, g, acceptance=None):
            return lambda ids, gen: speculative_generate(model, EagleDrafter(drafter, tree=shape), ids, gamma=g,
                                                         acceptance=acceptance, generator=gen, **common)

        shape = f"tree (top_k={tree['top_k']}, {tree['nodes']} nodes, depth {depth})"
        runs = {"ll.generate": lambda ids, gen: generate(model, ids, generator=gen, **common),
                f"EAGLE chain (gamma={gamma})": eagle(None, gamma),
                f"EAGLE {shape}": eagle(tree, depth)}
        if temperature > 0:
            runs[f"EAGLE chain (gamma={gamma}), typical acceptance"] = eagle(None, gamma, TypicalAcceptance())
            runs[f"EAGLE {shape}, typical acceptance"] = eagle(tree, depth, TypicalAcceptance())
        return runs

    for temperature in temperatures:
        runs = build(temperature)
        # The calibration runs every contender once, which also warms each up for the timing.
        predicted = predicted_speedups(model, calibrate(model, runs, held_out), context)
        time_against_ar(table, model, runs, prompts, temperature, new_tokens, repeat, predicted=predicted, warmup=0,
                        describe=by_position, price=own_price(model, context))


def by_position(results) -> str:
    """The acceptance rate of each draft position over ``results``: kept / reached."""
    depth = max(max(r.drafted, default=0) for r in results)  # a tree's depth, a chain's gamma
    if depth == 0:  # no call drafted anything (a lookup that never matched)
        return ", no drafts proposed"
    kept, reached = (sum(counts) for counts in zip(*(r.acceptance_counts(depth) for r in results)))
    return ", accepted by position " + "/".join(f"{k / max(n, 1):.2f}" for k, n in zip(kept.tolist(), reached.tolist()))
