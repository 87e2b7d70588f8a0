"""``python -m logitlab.bench``: the book's performance table, as ratios measured in one run.

The machines that build the book are shared and noisy, so absolute times drift from run to
run; ratios of times taken in the same run, on the same machine, are what the book reports.
Each time is the median of several repetitions after a warm-up. The table is printed as
Markdown and written as JSON (``--json``, default ``bench-out/bench.json``).

Rows:

* loading SmolLM2-135M: first load (dequantise the GGUF file) against the cached load
  (chapter 1);
* drawing one token per row of ``[64, 49152]`` logits: ``ll.sample`` and ``ll.gumbel_max``
  against Hugging Face's temperature warper + softmax + ``torch.multinomial`` (chapter 1);
* truncation on ``[64, 49152]`` logits: top-k 50 then top-p 0.9, and top-p 0.9 alone, ours
  against Hugging Face's warpers, after checking that both keep the same tokens (chapter 2);
* parallel sampling: N samples of 32 tokens with ``num_return_sequences`` (N = 1, 4, 16, 64)
  against one sample; scoring a (4, 4, 2) token tree in one forward pass against path by path;
  ``ll.beam_search`` against Hugging Face's beam search (chapters 4 and 5);
* speculative decoding (chapter 6): prompt lookup at temperature 0 on input-grounded prompts
  (the answer copies the prompt) and on open-ended ones, against our autoregressive loop and
  against Hugging Face's prompt-lookup decoding, with the same tokens; the shipped draft model
  at temperature 0 and 1 against our autoregressive loop, with its acceptance rate, cost ratio
  and the speedup the cost model predicts, and against Hugging Face's assisted generation with
  the same draft;
* Medusa heads and typical acceptance (chapter 7): the shipped heads at temperature 0 as a chain
  and as trees (same tokens as greedy decoding), and at 0.7, 1.0 and 1.3 as a chain under
  rejection sampling (top-token and sampled proposals) and under typical acceptance, and as a
  tree under typical acceptance, each with its tokens per target call, against our
  autoregressive loop;
* PaSS (chapter 8): the shipped look-ahead embeddings with the paper's two-call algorithm for
  k = 1 .. 8 and with our single-call variant (slots after every prefix, or after the likeliest
  one) at temperature 0 (same tokens as greedy decoding) and 1, each with its tokens per target
  pass, against our autoregressive loop;
* the decoding loop: ``ll.generate`` against Hugging Face ``generate``, 128 new tokens, greedy
  and sampled, as a tokens-per-second ratio (the two loops run alternately, so both see the
  same machine load); decoding with against without the KV cache
  (chapter 3).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from . import models
from .beam import beam_search
from .generate import _model_device, generate
from .speculative import pooled_alpha, speculative_generate
from .tree import sample_tree, score_paths, score_tree
from .sampling import SamplingConfig, gumbel_max, next_token, process_logits, sample


def median_time(fn, repeat: int = 7, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_median_times(fns, repeat: int = 7, warmup: int = 1) -> list[float]:
    """Median wall time of each function in ``fns``, running them in turn: A, B, A, B, ...

    For long runs (seconds each) on a shared machine, the load drifts between the first and the
    last repetition; alternating the contenders exposes both to the same drift, so their ratio
    is fair even when the absolute times are not.
    """
    for _ in range(warmup):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, ts in zip(fns, times):
            start = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - start)
    return [statistics.median(ts) for ts in times]


class Table:
    """Rows of (what, seconds, ratio, what the ratio is against)."""

    def __init__(self):
        self.rows = []

    def add(self, name: str, seconds: float, ratio: float | None = None, against: str = "") -> None:
        self.rows.append({"measurement": name, "seconds": seconds, "ratio": ratio, "against": against})

    def markdown(self) -> str:
        lines = ["| measurement | median time | ratio |", "|:---|---:|---:|"]
        for r in self.rows:
            against = r["against"]
            if r["ratio"] is not None and r["ratio"] < 1 and against.startswith("faster than "):
                against = f"(slower than {against[len('faster than '):]})"  # 0.8x "faster" is slower
            ratio = f"{r['ratio']:.2f}x {against}".strip() if r["ratio"] is not None else ""
            lines.append(f"| {r['measurement']} | {r['seconds'] * 1000:.1f} ms | {ratio} |")
        return "\n".join(lines)


def bench_load(table: Table) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        old = models.os.environ.get("LOGITLAB_CACHE")
        models.os.environ["LOGITLAB_CACHE"] = tmp
        try:
            first = models.load("smollm2-135m", device="cpu")[0].logitlab_load_seconds
            cached = models.load("smollm2-135m", device="cpu")[0].logitlab_load_seconds
        finally:
            if old is None:
                del models.os.environ["LOGITLAB_CACHE"]
            else:
                models.os.environ["LOGITLAB_CACHE"] = old
    table.add("load SmolLM2-135M, first time (dequantise GGUF, save cache)", first, first / cached, "the cached load")
    table.add("load SmolLM2-135M from the cache", cached)


@torch.inference_mode()
def bench_sampling(table: Table, model, tokenizer, batch: int = 64) -> None:
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    out = model(ids, use_cache=True)
    cache, step_ids = out.past_key_values, ids[:, -1:]

    def decode_step():
        # One new token on a cached prefix; crop the cache back so every repeat is the same.
        model(step_ids, past_key_values=cache, use_cache=True)
        cache.crop(-1)

    step = median_time(decode_step)
    table.add("one decode step of SmolLM2-135M (batch 1)", step)

    # Realistic logits: 64 different next-token distributions from a real generation.
    text = generate(model, ids, max_new_tokens=batch, temperature=1.0, eos_token_id=[],
                    generator=torch.Generator().manual_seed(0)).sequences[0][None]
    logits = model(text).logits[0, -batch:].float().contiguous()
    gen = torch.Generator().manual_seed(0)
    shape = f"[{batch}, {logits.shape[-1]}]"

    def hf_sample(warpers):
        scores = logits.clone()
        for w in warpers:
            scores = w(ids, scores)
        return torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=gen)

    hf_t = median_time(lambda: hf_sample([TemperatureLogitsWarper(0.7)]))
    table.add(f"Hugging Face warper+softmax+multinomial, T=0.7, {shape}", hf_t, hf_t / step, "a decode step")
    for name, fn in [("ll.sample", sample), ("ll.gumbel_max", gumbel_max)]:
        t = median_time(lambda: fn(logits, 0.7, gen))
        table.add(f"{name}, T=0.7, {shape}", t, hf_t / t, "faster than Hugging Face")

    # Truncation: check the kept sets agree before timing anything.
    for label, config, warpers in [
        ("top-k 50 then top-p 0.9", SamplingConfig(top_k=50, top_p=0.9), [TopKLogitsWarper(50), TopPLogitsWarper(0.9)]),
        ("top-p 0.9 alone", SamplingConfig(top_p=0.9), [TopPLogitsWarper(0.9)]),
    ]:
        ours = process_logits(logits, config)
        theirs = logits.clone()
        for w in warpers:
            theirs = w(ids, theirs)
        if not torch.equal(ours.isneginf(), theirs.isneginf()):
            raise AssertionError(f"{label}: our kept set differs from Hugging Face's")
        hf_t = median_time(lambda: hf_sample(warpers))
        t = median_time(lambda: next_token(logits, config, generator=gen))
        table.add(f"Hugging Face {label} + sample, {shape}", hf_t)
        table.add(f"ll {label} + sample, {shape} (same kept sets)", t, hf_t / t, "faster than Hugging Face")


@torch.inference_mode()
def bench_generate(table: Table, model, tokenizer, new_tokens: int = 128, repeat: int = 5) -> None:
    from transformers import GenerationConfig

    ids = tokenizer("Write a short story about a lighthouse keeper.", return_tensors="pt").input_ids
    settings = {"greedy": dict(temperature=0), "sampled T=0.7 top-p 0.9": dict(temperature=0.7, top_p=0.9)}
    for label, kwargs in settings.items():
        # Both loops do the same work: exactly new_tokens tokens, EOS forbidden until then.
        do_sample = kwargs["temperature"] > 0
        hf_config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=do_sample,
                                     temperature=kwargs["temperature"] or None, top_p=kwargs.get("top_p"),
                                     top_k=None, pad_token_id=model.generation_config.eos_token_id)
        results = {}

        def ours():
            results["ours"] = generate(model, ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs,
                                       generator=torch.Generator().manual_seed(0)).new_tokens[0]

        def theirs():
            torch.manual_seed(0)
            results["theirs"] = model.generate(ids, generation_config=hf_config)[0, ids.shape[1]:]

        hf_t, t = interleaved_median_times([theirs, ours], repeat=repeat)
        if len(results["ours"]) != new_tokens or len(results["theirs"]) != new_tokens:
            raise AssertionError(f"{label}: a loop did not produce {new_tokens} tokens")
        if not do_sample and not torch.equal(results["ours"], results["theirs"]):
            raise AssertionError("greedy: ll.generate and Hugging Face chose different tokens")
        table.add(f"Hugging Face generate, {label}, {new_tokens} tokens", hf_t)
        table.add(f"ll.generate, {label}, {new_tokens} tokens", t, hf_t / t, "Hugging Face's tokens/s")

    # Without the cache every step runs the model on the whole sequence so far.
    short = 64

    def no_cache():
        seq = ids
        for _ in range(short):
            seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)

    def with_cache():
        generate(model, ids, max_new_tokens=short, temperature=0, eos_token_id=[])

    without, with_cache = interleaved_median_times([no_cache, with_cache], repeat=3)
    table.add(f"greedy, {short} tokens, no KV cache (whole sequence every step)", without)
    table.add(f"ll.generate greedy, {short} tokens, with the KV cache", with_cache, without / with_cache,
              "faster than without the cache")


@torch.inference_mode()
def bench_parallel(table: Table, model, tokenizer) -> None:
    from transformers import GenerationConfig

    ids = tokenizer("Write one sentence about the sea:", return_tensors="pt").input_ids

    def samples(n):
        return lambda: generate(model, ids, max_new_tokens=32, num_return_sequences=n, eos_token_id=[],
                                generator=torch.Generator().manual_seed(n))

    sizes = [1, 4, 16, 64]
    times = interleaved_median_times([samples(n) for n in sizes], repeat=3)
    for n, t in zip(sizes, times):
        table.add(f"{n} samples of 32 tokens (num_return_sequences={n})", t, t / times[0], "the time of one sample")

    # A (4, 4, 2) tree after a prompt: 52 nodes, 32 paths of three tokens.
    story = tokenizer("Once upon a time, in a small village,", return_tensors="pt").input_ids
    tree = sample_tree(model, story, branching=(4, 4, 2), generator=torch.Generator().manual_seed(2))
    one, paths = interleaved_median_times([lambda: score_tree(model, story, tree.parents, tree.tokens),
                                           lambda: score_paths(model, story, tree.parents, tree.tokens)])
    table.add("score a (4, 4, 2) tree path by path (32 forward passes)", paths)
    table.add("score a (4, 4, 2) tree in one forward pass (tree mask)", one, paths / one, "faster than path by path")

    # Beam search, 4 beams, 32 tokens, both implementations returning the same best sequence.
    config = GenerationConfig(num_beams=4, max_new_tokens=32, do_sample=False, eos_token_id=[], pad_token_id=2)
    results = {}

    def ours():
        results["ours"] = beam_search(model, ids, num_beams=4, max_new_tokens=32, eos_token_id=[]).best[0].tokens

    def theirs():
        results["theirs"] = model.generate(ids, generation_config=config)[0, ids.shape[1]:]

    hf_t, t = interleaved_median_times([theirs, ours], repeat=3)
    if not torch.equal(results["ours"], results["theirs"]):
        raise AssertionError("beam search: ll.beam_search and Hugging Face returned different sequences")
    table.add("Hugging Face beam search, 4 beams, 32 tokens", hf_t)
    table.add("ll.beam_search, 4 beams, 32 tokens (same sequence)", t, hf_t / t, "faster than Hugging Face")


GROUNDED_TEXT = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named after "
    "the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889. It was "
    "constructed as the centrepiece of the 1889 World's Fair, and to crown the centennial anniversary of the "
    "French Revolution."
)
GROUNDED = [f"Repeat the following text exactly:\n\n{GROUNDED_TEXT}",
            f"Rewrite the following text, replacing 'tower' with 'monument':\n\n{GROUNDED_TEXT}"]
OPEN_ENDED = ["Write a short story about a lighthouse keeper.", "Explain why the sky is blue."]


def _chat(tokenizer, question):
    encoded = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    return torch.tensor([list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)])


@torch.inference_mode()
def bench_speculative(table: Table, model, tokenizer, new_tokens: int = 96, gamma: int = 5, repeat: int = 3) -> None:
    from transformers import GenerationConfig

    from .drafters import PromptLookupDrafter

    from .speculative import speedup

    vocab = model.config.vocab_size
    context = _chat(tokenizer, GROUNDED[0])[0].tolist()
    step = forward_seconds(model, context, 1)
    verify_cost = forward_seconds(model, context, gamma + 1) / step
    for label, questions in [("input-grounded", GROUNDED), ("open-ended", OPEN_ENDED)]:
        prompts = [_chat(tokenizer, q) for q in questions]
        results = {}

        def ours():
            results["ar"] = [generate(model, ids, max_new_tokens=new_tokens, temperature=0, eos_token_id=[])
                             for ids in prompts]

        def lookup():
            results["pl"] = [speculative_generate(model, PromptLookupDrafter(vocab), ids, gamma=gamma,
                                                  max_new_tokens=new_tokens, temperature=0, eos_token_id=[])
                             for ids in prompts]

        config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                  prompt_lookup_num_tokens=gamma, pad_token_id=2)

        def theirs():
            results["hf"] = [model.generate(ids, generation_config=config) for ids in prompts]

        ar_t, pl_t, hf_t = interleaved_median_times([ours, lookup, theirs], repeat=repeat)
        for a, b in zip(results["ar"], results["pl"]):
            if a.new_tokens[0].tolist() != b.new_tokens[0].tolist():
                raise AssertionError("prompt lookup changed the greedy tokens")
        runs = results["pl"]
        calls = sum(r.target_calls for r in runs)
        alpha = pooled_alpha(runs)
        # c: the lookup's time per proposed token, in target steps (it proposes up to gamma at once)
        c = sum(r.draft_seconds for r in runs) / max(1, gamma * sum(len(r.accepted) for r in runs)) / step
        predicted = speedup(min(alpha, 0.999999), gamma, c, verify_cost)
        name = f"{len(prompts)} {label} prompts, {new_tokens} tokens each, greedy"
        table.add(f"ll.generate, {name}", ar_t)
        table.add(f"prompt lookup (gamma={gamma}, alpha={alpha:.2f}, c={c:.4f}, v={verify_cost:.2f}, "
                  f"{new_tokens * len(prompts) / calls:.2f} tokens per target call, predicted {predicted:.2f}x), "
                  f"{name}", pl_t, ar_t / pl_t, "faster than our AR loop")
        table.add(f"Hugging Face prompt lookup, {name}", hf_t, hf_t / pl_t, "slower than ours (same algorithm)")


def forward_seconds(model, context_ids, tokens: int, repeat: int = 15) -> float:
    """Median time of one forward pass of ``model`` on ``tokens`` new tokens after a cached
    context (``context_ids``, a list of ids): a decode step for ``tokens = 1``, a speculative
    verification of ``tokens - 1`` drafts otherwise. The cache is cropped back after each pass."""
    with torch.inference_mode():
        device = _model_device(model)
        cache = model(input_ids=torch.tensor([list(context_ids)], device=device), use_cache=True).past_key_values
        new = torch.full((1, tokens), context_ids[-1], device=device)  # which tokens does not change the time
        times = []
        for _ in range(repeat + 1):
            start = time.perf_counter()
            cache = model(input_ids=new, past_key_values=cache, use_cache=True).past_key_values
            times.append(time.perf_counter() - start)
            cache.crop(-tokens)  # back to the context
    return statistics.median(times[1:])  # the first pass warms up



def pass_costs(model, context_ids, sizes, rounds: int = 7) -> dict:
    """The cost of one forward pass of ``model`` over ``n`` new tokens after a cached context,
    in decode steps, for each ``n`` in ``sizes``. The sizes (and the one-token decode step) are
    timed in turn, round after round, so that a machine that slows down or speeds up meanwhile
    affects them all alike; each cost is a median over the rounds (the first round warms up)."""
    order = [1] + [n for n in dict.fromkeys(sizes) if n != 1]
    times = {n: [] for n in order}
    with torch.inference_mode():
        device = _model_device(model)
        cache = model(input_ids=torch.tensor([list(context_ids)], device=device), use_cache=True).past_key_values
        for r in range(rounds + 1):
            for n in order:
                new = torch.full((1, n), context_ids[-1], device=device)
                start = time.perf_counter()
                cache = model(input_ids=new, past_key_values=cache, use_cache=True).past_key_values
                if r:
                    times[n].append(time.perf_counter() - start)
                cache.crop(-n)  # back to the context
    step = statistics.median(times[1])
    return {n: statistics.median(times[n]) / step for n in sizes}


# Held out from the draft model's training prompts (see logitlab.train_draft).
DRAFT_PROMPTS = ["Write a short story about a lighthouse keeper.", "Explain how a refrigerator keeps food cold."]


@torch.inference_mode()
def bench_draft_model(table: Table, model, tokenizer, new_tokens: int = 128, gamma: int = 4, repeat: int = 3) -> None:
    """The shipped draft model against our AR loop at T = 0 and 1, with the predicted speedup,
    and against Hugging Face's assisted generation with the same draft at T = 0."""
    from .drafters import load_pretrained
    from .speculative import speedup

    draft = load_pretrained(model)
    prompts = [_chat(tokenizer, q) for q in DRAFT_PROMPTS]
    context = prompts[0][0].tolist() + list(range(1000, 1060))
    step = forward_seconds(model, context, 1)
    c = forward_seconds(draft, context, 1) / step
    verify_cost = forward_seconds(model, context, gamma + 1) / step
    draft.generation_config.num_assistant_tokens = gamma  # Hugging Face: a constant gamma, no early stop
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    for temperature in [0.0, 1.0]:
        results = {}
        seeds = lambda: [torch.Generator().manual_seed(i) for i in range(len(prompts))]  # noqa: E731

        def ours():
            results["ar"] = [generate(model, ids, max_new_tokens=new_tokens, temperature=temperature,
                                      eos_token_id=[], generator=g) for ids, g in zip(prompts, seeds())]

        def spec():
            results["sd"] = [speculative_generate(model, draft, ids, gamma=gamma, max_new_tokens=new_tokens,
                                                  temperature=temperature, eos_token_id=[], generator=g)
                             for ids, g in zip(prompts, seeds())]

        contenders = [ours, spec]
        if temperature == 0:
            from transformers import GenerationConfig

            config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                      pad_token_id=2)

            def theirs():
                results["hf"] = [model.generate(ids, generation_config=config, assistant_model=draft)
                                 for ids in prompts]

            contenders.append(theirs)
        times = interleaved_median_times(contenders, repeat=repeat)
        runs = results["sd"]
        if temperature == 0:
            for a, b, h in zip(results["ar"], runs, results["hf"]):
                if not a.new_tokens[0].tolist() == b.new_tokens[0].tolist() == h[0, -new_tokens:].tolist():
                    raise AssertionError("greedy speculative decoding changed the greedy tokens")
        alpha = pooled_alpha(runs)
        per_call = new_tokens * len(prompts) / sum(r.target_calls for r in runs)
        predicted = speedup(min(alpha, 0.999999), gamma, c, verify_cost)
        name = f"{len(prompts)} prompts, {new_tokens} tokens each, T={temperature:g}"
        table.add(f"ll.generate, {name}", times[0])
        table.add(f"draft model (gamma={gamma}, alpha={alpha:.2f}, c={c:.3f}, v={verify_cost:.2f}, "
                  f"{per_call:.2f} tokens per call, predicted {predicted:.2f}x), {name}",
                  times[1], times[0] / times[1], "faster than our AR loop")
        if temperature == 0:
            table.add(f"Hugging Face assisted generation, same draft, constant gamma={gamma}, {name}", times[2],
                      times[2] / times[1], "slower than ours (same algorithm)")


def _time_against_ar(table: Table, runs: dict, prompts, temperature: float, new_tokens: int, repeat: int,
                     calls=lambda r: r.target_calls, unit: str = "call") -> None:
    """Time ``runs`` (label -> fn(ids, generator); the first is the AR baseline ``ll.generate``)
    alternately on every prompt, check at T = 0 that each gives the baseline's greedy tokens, and
    add a row per run with its tokens per ``unit`` (``calls(result)`` counts them) and its speedup."""
    results = {}

    def timed(label):
        run = runs[label]

        def fn():
            results[label] = [run(ids, torch.Generator().manual_seed(i)) for i, ids in enumerate(prompts)]
        return fn

    times = interleaved_median_times([timed(label) for label in runs], repeat=repeat)
    if temperature == 0:
        greedy = [r.new_tokens[0].tolist() for r in results["ll.generate"]]
        for label, outs in results.items():
            if [r.new_tokens[0].tolist() for r in outs] != greedy:
                raise AssertionError(f"{label} changed the greedy tokens")
    name = f"{len(prompts)} prompts, {new_tokens} tokens each, T={temperature:g}"
    table.add(f"ll.generate, {name}", times[0])
    for label, seconds in list(zip(runs, times))[1:]:
        per_call = new_tokens * len(prompts) / sum(calls(r) for r in results[label])
        table.add(f"{label} ({per_call:.2f} tokens per {unit}), {name}", seconds, times[0] / seconds,
                  "faster than our AR loop")


@torch.inference_mode()
def bench_typical(table: Table, model, tokenizer, new_tokens: int = 64, gamma: int = 3,
                  trees=((2, 1), (3, 2, 1)), temperatures=(0.0, 0.7, 1.0, 1.3), repeat: int = 3) -> None:
    """The shipped Medusa heads (chapter 7) against our AR loop. At T = 0: as a chain and as
    trees, all greedy (checked to give the same tokens). Above 0, four rows: the chain under
    rejection sampling with the heads proposing their top tokens; the same with the heads
    sampling their proposals; the chain under typical acceptance (Medusa's defaults, argmax next
    token); and the largest tree under typical acceptance."""
    from .drafters import MedusaDrafter
    from .medusa import load_heads, medusa_generate
    from .typical_acceptance import TypicalAcceptance

    heads = load_heads(model)
    prompts = [_chat(tokenizer, q) for q in DRAFT_PROMPTS]
    typical = TypicalAcceptance()
    for temperature in temperatures:
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
        _time_against_ar(table, runs, prompts, temperature, new_tokens, repeat)


def pass_calls(result) -> int:
    """Every forward pass of the target in a run: the loop's calls and, for PaSS's two-call
    drafter, its drafting calls (its first step is the shared prefill, already counted)."""
    return result.target_calls + max(0, result.drafter_steps - 1) if result.drafter_steps else result.target_calls


@torch.inference_mode()
def bench_pass(table: Table, model, tokenizer, new_tokens: int = 64, ks=tuple(range(1, 9)), single_ks=(1, 2, 4),
               temperatures=(0.0, 1.0), repeat: int = 3) -> None:
    """PaSS (chapter 8) with the shipped look-ahead embeddings against our AR loop, at T = 0 and 1:
    the paper's two-call algorithm for every k in ``ks``, and the single-call variant with slots
    after every prefix ("all") and after the likeliest one ("likely") for each k in
    ``single_ks``. Each row gives its tokens per target pass (drafting calls included). At T = 0
    every run is checked to give greedy decoding's tokens."""
    from .lookahead import load_pretrained, pass_generate

    prompts = [_chat(tokenizer, q) for q in DRAFT_PROMPTS]
    sets = {k: load_pretrained(model, k) for k in set(ks) | set(single_ks)}  # loaded once, outside the timings
    for temperature in temperatures:
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
        _time_against_ar(table, runs, prompts, temperature, new_tokens, repeat,
                         calls=pass_calls, unit="target pass")


def cpu_name() -> str:
    """The processor's model name where Linux tells it, else the architecture."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def main(argv=None) -> Table:
    parser = argparse.ArgumentParser(prog="python -m logitlab.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--skip-load", action="store_true", help="skip the first-load row (about 30 s)")
    parser.add_argument("--skip-generate", action="store_true", help="skip the decoding-loop rows (about 2 min)")
    parser.add_argument("--skip-parallel", action="store_true",
                        help="skip the batch, tree and beam-search rows (about 1 min)")
    parser.add_argument("--skip-speculative", action="store_true",
                        help="skip the speculative-decoding rows (about 8 min)")
    parser.add_argument("--skip-typical", action="store_true",
                        help="skip the Medusa-heads and typical-acceptance rows (about 6 min)")
    parser.add_argument("--skip-pass", action="store_true",
                        help="skip the PaSS look-ahead rows (about 25 min)")
    parser.add_argument("--json", default="bench-out/bench.json", help="where to write the results as JSON")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    table = Table()
    if not args.skip_load:
        bench_load(table)
    model, tokenizer = models.load("smollm2-135m", device="cpu")
    bench_sampling(table, model, tokenizer)
    if not args.skip_generate:
        bench_generate(table, model, tokenizer)
    if not args.skip_parallel:
        bench_parallel(table, model, tokenizer)
    if not args.skip_speculative:
        bench_speculative(table, model, tokenizer)
        bench_draft_model(table, model, tokenizer)
    if not args.skip_typical:
        bench_typical(table, model, tokenizer)
    if not args.skip_pass:
        bench_pass(table, model, tokenizer)
    machine = f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, device cpu"
    print(f"Machine: {machine}")
    print(table.markdown())
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine, "rows": table.rows}, indent=2))
    print(f"(written to {path})")
    return table


if __name__ == "__main__":
    main()
