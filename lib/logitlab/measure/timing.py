"""Timing that is fair on a shared machine and on an accelerator.

Chapters 5 to 8 and ``python -m logitlab.bench`` time code with these. Every clock read waits
for the device first (``ll.devices.now``: GPU work is asynchronous), each time is a median
over repetitions after a warm-up, and contenders that are compared run in turn (A, B, A, B, ...)
so that a machine that slows down meanwhile slows them all alike.
"""

from __future__ import annotations

import statistics

import torch

from ..decoding.cache import crop_cache
from ..decoding.passes import forward
from ..devices import model_device, now
from ..fast_gpu import RECORD_AFTER

WARMUP_ROUNDS = RECORD_AFTER  # a pass is recorded (on a GPU) the second time it is met: both untimed


def median_time(fn, repeat: int = 7, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` in seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = now()
        fn()
        times.append(now() - start)
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
            start = now()
            fn()
            ts.append(now() - start)
    return [statistics.median(ts) for ts in times]


def read_bandwidth(device=None, megabytes: int = 512, repeat: int = 7) -> float:
    """Bytes per second that ``device`` (default: the CPU) reads from memory: a reduction over a
    float32 tensor far larger than any cache, the fastest of ``repeat`` runs of ``sum`` and of
    ``amax`` (what the machine can give, not what a busy moment leaves). A forward pass reads
    every weight once, so weight bytes over this bandwidth is the least time a decode step can
    take: its memory-bound limit."""
    data = torch.ones(megabytes * 2**20 // 4, device=device)
    best = float("inf")
    for reduce in (torch.sum, torch.amax):
        reduce(data)
        times = []
        for _ in range(repeat):
            start = now(device)
            reduce(data)
            times.append(now(device) - start)
        best = min(best, *times)
    return data.numel() * 4 / best


def forward_seconds(model, context_ids, tokens: int, repeat: int = 15) -> float:
    """Median time of one forward pass of ``model`` on ``tokens`` new tokens after a cached
    context (``context_ids``, a list of ids): a decode step for ``tokens = 1``, a speculative
    verification of ``tokens - 1`` drafts otherwise."""
    return statistics.median(pass_times(model, context_ids, [tokens], repeat)[tokens])


def pass_costs(model, context_ids, sizes, rounds: int = 7) -> dict:
    """The cost of one forward pass of ``model`` over ``n`` new tokens after a cached context,
    in decode steps, for each ``n`` in ``sizes``. The sizes (and the one-token decode step) are
    timed in turn, round after round, so that a machine that slows down or speeds up meanwhile
    affects them all alike; each cost is a median over the rounds."""
    times = pass_times(model, context_ids, [1] + [n for n in dict.fromkeys(sizes) if n != 1], rounds)
    step = statistics.median(times[1])
    return {n: statistics.median(times[n]) / step for n in sizes}


def pass_times(model, context_ids, sizes, rounds: int) -> dict:
    """``rounds`` times of one pass over ``n`` new tokens after the cached ``context_ids``, for
    each ``n`` in ``sizes`` in turn (after two rounds that warm up). The cache is cropped
    back to the context after each pass, so every pass sees the same context."""
    return pass_times_in_turn({"model": model}, context_ids, sizes, rounds)["model"]


@torch.inference_mode()
def pass_times_in_turn(models: dict, context_ids, sizes, rounds: int) -> dict:
    """``{name: {n: times}}``: :func:`pass_times` for several models (``{name: model}``), one
    round of each in turn, so that a machine whose speed drifts affects them all alike. Each
    model's cache is filled once and cropped back after every pass. The passes go through
    ``decoding.forward``, as the loops' do: a model on the static path (``fast_gpu``) is timed on
    it, its passes recorded in the two rounds that warm up."""
    caches = {}
    for name, model in models.items():
        device = model_device(model)
        caches[name] = forward(model, input_ids=torch.tensor([list(context_ids)], device=device), logits_to_keep=1).cache
    times = {name: {n: [] for n in sizes} for name in models}
    for r in range(rounds + WARMUP_ROUNDS):
        for name, model in models.items():
            device = model_device(model)
            # With several models, one untimed pass first: right after another model ran, the first
            # pass is slower (measured: a decode step 35 ms instead of 30), biasing the first size.
            warm = [(sizes[0], False)] if len(models) > 1 else []
            for n, timed in warm + [(n, r >= WARMUP_ROUNDS) for n in sizes]:
                new = torch.full((1, n), context_ids[-1], device=device)  # which tokens does not change the time
                start = now(device)
                forward(model, input_ids=new, cache=caches[name])
                if timed:
                    times[name][n].append(now(device) - start)
                crop_cache(caches[name], len(context_ids))
    return times


@torch.inference_mode()
def forward_breakdown(model, context_ids, tokens: int, rounds: int = 5) -> dict:
    """Where one pass over ``tokens`` new tokens after the cached ``context_ids`` spends its time.

    Returns ``{part: seconds}`` (medians over ``rounds`` passes): every ``nn.Linear`` grouped by
    its weight's shape (``"linear 576x576"``), every other module type by its own time without
    its children (``"LlamaAttention"``: rotary embedding, cache update and attention itself), and
    ``"total"``, the pass's wall time. Hooks time each module, which adds a few microseconds per
    module to the total; the model's own code outside every submodule (masks, positions, Python)
    is the top module's line.
    """
    device = model_device(model)
    cache = model(input_ids=torch.tensor([list(context_ids)], device=device), use_cache=True).past_key_values
    new = torch.full((1, tokens), context_ids[-1], device=device)
    stack, current, handles = [], {}, []

    def part(module):
        if isinstance(module, torch.nn.Linear):
            return f"linear {module.out_features}x{module.in_features}"
        return type(module).__name__

    def before(module, args):
        stack.append([now(device), 0.0])

    def after(module, args, output):
        start, children = stack.pop()
        spent = now(device) - start
        current[part(module)] = current.get(part(module), 0.0) + spent - children
        if stack:
            stack[-1][1] += spent

    for module in model.modules():
        handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    samples = []
    try:
        for r in range(rounds + 1):
            current.clear()
            start = now(device)
            model(input_ids=new, past_key_values=cache, use_cache=True)
            current["total"] = now(device) - start
            crop_cache(cache, len(context_ids))
            if r:  # the first pass warms up
                samples.append(dict(current))
    finally:
        for handle in handles:
            handle.remove()
    return {name: statistics.median(s[name] for s in samples) for name in samples[0]}


def breakdown_table(parts: dict) -> str:
    """``{tokens: forward_breakdown(...)}`` as a Markdown table, one column per pass size, the
    total first and then the largest parts."""
    sizes = list(parts)
    names = sorted(parts[sizes[0]], key=lambda k: (k != "total", -parts[sizes[0]][k]))
    lines = ["| part of the pass | " + " | ".join(f"{n} token{'s' * (n > 1)}" for n in sizes) + " |",
             "|:---|" + "---:|" * len(sizes)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{parts[n].get(name, 0) * 1000:.2f} ms" for n in sizes) + " |")
    return "\n".join(lines)

