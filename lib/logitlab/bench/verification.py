"""Rows for the cost of a forward pass (chapter 5's roofline, chapter 6's v(n)): the memory-bound
limit, the decode step and the verification pass, with and without the CPU fast path."""

from __future__ import annotations

import statistics

import torch

from ..devices import model_device
from ..measure.table import Table
from ..measure.timing import forward_breakdown, pass_times_in_turn, read_bandwidth
from .prompts import cached_prefix

SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16)


def weight_bytes(model) -> int:
    """The bytes a forward pass must read: every parameter once (tied weights counted once;
    the fast path's packed and transposed copies replace the weights they copy, so they are not
    counted)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


@torch.inference_mode()
def bench_verification(table: Table, model, stock, tokenizer, rounds: int = 7) -> dict:
    """The memory-bound limit of a decode step, the step and v(n) with the fast path (``model``)
    and without (``stock``, the model as Hugging Face gives it), timed in turn; returns the
    per-part breakdown of a pass over 1 and 8 tokens with the fast path."""
    context = cached_prefix(tokenizer)
    bandwidth = read_bandwidth(model_device(model))
    limit = weight_bytes(model) / bandwidth
    table.add(f"memory-bound decode step: {weight_bytes(model) / 1e6:.0f} MB of weights at the read bandwidth "
              f"({bandwidth / 1e9:.0f} GB/s, sum/amax over 512 MB)", limit)
    costs = pass_times_in_turn({"fast": model, "stock": stock}, context, SIZES, rounds)
    steps = {}
    for name in ("stock", "fast"):
        step = statistics.median(costs[name][1])
        steps[name] = step
        what = "fast path" if name == "fast" else "stock model"
        table.add(f"decode step, {what}, {len(context)}-token cached prefix", step, step / limit,
                  "the memory-bound step")
    table.add("decode step, fast path against the stock model", steps["fast"], steps["stock"] / steps["fast"],
              "faster than the stock model")
    for n in SIZES[1:]:
        for name in ("stock", "fast"):
            t = statistics.median(costs[name][n])
            what = "fast path" if name == "fast" else "stock model"
            table.add(f"pass over {n} new tokens, {what} (v({n}) in its decode steps)", t, t / steps[name],
                      "decode steps")
    return {n: forward_breakdown(model, context, n) for n in (1, 8)}
