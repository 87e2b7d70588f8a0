"""A faster forward pass on a GPU: passes recorded once as CUDA graphs and replayed.

At batch 1 a 135M model leaves a GPU idle most of the time: a decode step launches several
hundred small kernels (30 layers of norms, products, rotary embeddings, attention), each one
queued by Python, and the queueing takes longer than the GPU takes to run them. The weights
(538 MB in float32) are read in a fraction of a millisecond (an H100 reads them in about 0.2 ms). A CUDA graph records the kernels of
one pass once and replays them as a single launch, with no Python in between: the step then
costs what the GPU needs, not what the interpreter needs.

A graph replays exactly what it recorded: the same kernels, on the same memory, with the same
shapes. So the pass must have fixed shapes and fixed addresses, which the stock model's cache
does not (it grows by one position per step). ``enable`` switches a model to the static path:
every ``logitlab.decoding.forward`` on it uses a ``StaticCache`` (keys and values in buffers of
fixed size, written in place; each pass's mask spans the whole buffer) and, on a GPU, a
:class:`Graphs` that records each shape of pass the second time it meets it (a decode step;
a verification over n drafts; a tree) and replays it from then on. Graphs belong to the buffers
they were recorded on; when a cache is gone, its buffers and graphs go back to the model's
:class:`Pool`, and the next cache of the same batch and capacity (the next ``generate``) takes
them, its passes recorded already.

``ll.load`` enables it on CUDA; ``ll.load(..., fast=False)``, ``LOGITLAB_FAST_GPU=0`` or
:func:`disable` switch it off. The static path runs on any device (the tests check it on the
CPU: the same logits as the stock model to float rounding, the same tokens in every loop); the
recording needs CUDA. Where recording fails (a model whose forward pass asks the host a question
mid-pass), the pass runs as it is, and a warning says so (once per storage).
"""

from __future__ import annotations

import collections
import os
import warnings
from dataclasses import dataclass, field

import torch

ROOM = 512  # positions a new cache leaves after the prompt before it must grow
RECORD_AFTER = 2  # a shape of pass is recorded the second time it is met (a prefill is met once)
KEPT = 4  # static-cache storages a model keeps for reuse (batch sizes and capacities it met last)


class Pool:
    """Things nobody holds any more, each kept under a key for the next one who asks for that
    key: a model's static-cache storages (their buffers and recorded passes), by batch and
    capacity, so that the next ``generate`` replays the passes the last one recorded. At most
    ``size`` are kept (the oldest given back goes first)."""

    def __init__(self, size: int = KEPT):
        self.size, self.free = size, []  # (key, thing), oldest first

    def take(self, key, make):
        """A thing given back under ``key``, or ``make()`` where there is none."""
        for i, (held, thing) in enumerate(self.free):
            if held == key:
                del self.free[i]
                return thing
        return make()

    def give(self, key, thing) -> None:
        self.free.append((key, thing))
        del self.free[:-self.size]


@dataclass(frozen=True)
class Plan:
    """What ``enable`` switched on: ``room`` after each prompt, whether passes are recorded, and
    the model's ``pool`` of static-cache storages."""

    room: int
    graphs: bool
    pool: Pool = field(default_factory=Pool, compare=False, repr=False)


def wanted(device) -> bool:
    """Whether ``ll.load`` enables the static path: on CUDA, unless ``LOGITLAB_FAST_GPU=0``."""
    return torch.device(device).type == "cuda" and os.environ.get("LOGITLAB_FAST_GPU", "1") != "0"


def supports(model) -> bool:
    """Whether ``model`` can take the static path: a transformers decoder whose layers cache their
    keys and values through the ``Cache`` interface, with grouped-query heads (Llama, Mistral,
    Qwen and their kind, SmolLM2 among them)."""
    config = getattr(model, "config", None)
    return all(hasattr(config, name) for name in ("num_key_value_heads", "num_attention_heads", "num_hidden_layers"))


def enable(model, graphs: bool | None = None, room: int = ROOM):
    """Switch ``model`` (a transformers causal LM) to the static path: the passes of the book's
    loops use a ``StaticCache`` of ``prompt + room`` positions (it grows when needed) and, with
    ``graphs`` (default: on CUDA), are recorded as CUDA graphs and replayed. Returns the model."""
    if not supports(model):
        raise ValueError(f"model: a {type(model).__name__} cannot take the static path; it needs a Llama-like "
                         "transformers decoder (config.num_key_value_heads)")
    on_cuda = next(model.parameters()).device.type == "cuda"
    if graphs is None:
        graphs = on_cuda
    if not isinstance(graphs, bool) or (graphs and not on_cuda):
        raise ValueError("graphs must be True (only for a model on CUDA), False or None (True on CUDA)")
    if isinstance(room, bool) or not isinstance(room, int) or room < 1:
        raise ValueError(f"room must be a positive int (positions after the prompt), got {room!r}")
    model.logitlab_static = Plan(room, graphs)
    return model


def follow(model, target):
    """Put ``model`` (a drafter's own model) on the path ``target`` is on: the static path with
    the same recording where ``target`` has it, the stock cache where not. Returns ``model``."""
    plan = getattr(target, "logitlab_static", None)
    if plan is None:
        disable(model)
        return model
    return enable(model, graphs=plan.graphs, room=plan.room)


def recorded(model) -> dict:
    """What the static path of ``model`` has recorded, over the storages in its pool (the caches
    that are gone): ``{"passes": recorded passes, "failed": storages where recording failed}``."""
    plan = getattr(model, "logitlab_static", None)
    graphs = [] if plan is None else [s.graphs for _, s in plan.pool.free if s.graphs is not None]
    return {"passes": sum(len(g.recorded) for g in graphs), "failed": sum(g.failed for g in graphs)}


def disable(model) -> None:
    """Give ``model`` back the stock cache (passes after this one; a cache already made stays)."""
    vars(model).pop("logitlab_static", None)


class Graphs:
    """The passes recorded on one static-cache storage, as CUDA graphs (one per shape), replayed."""

    def __init__(self):
        self.recorded, self.met = {}, collections.Counter()
        self.pool = None  # one memory pool for all of them: a storage's passes never run at once
        self.failed = False

    def run(self, key, inputs: dict, run):
        """``run(inputs)`` (a tuple of tensors or None), replayed from a graph when ``key`` (the
        shapes and settings of the pass) has been met before."""
        if key not in self.recorded:
            self.met[key] += 1
            if self.met[key] < RECORD_AFTER or self.failed:
                return run(inputs)
            self.recorded[key] = self._record(inputs, run)
            if self.recorded[key] is None:
                del self.recorded[key]
                return run(inputs)
        static_inputs, graph, outputs = self.recorded[key]
        for name, tensor in inputs.items():
            static_inputs[name].copy_(tensor)
        graph.replay()
        # The outputs' memory is the graph's, overwritten by the next replay: hand out copies.
        return tuple(None if t is None else t.clone() for t in outputs)

    def _record(self, inputs: dict, run):
        """``(static inputs, graph, outputs)``, or None where the pass cannot be recorded. Nothing
        here changes the cache: a run writes this pass's keys and values, which the replay that
        follows writes again, the same."""
        static_inputs = {name: tensor.clone() for name, tensor in inputs.items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # a first run off the main stream, as recording requires
            run(static_inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool):
                outputs = run(static_inputs)
        except RuntimeError as error:
            warnings.warn(f"logitlab.fast_gpu: this model's passes cannot be recorded as CUDA graphs ({error}); "
                          "they run unrecorded", RuntimeWarning, stacklevel=2)
            self.failed = True  # do not try again
            return None
        self.pool = graph.pool()
        return static_inputs, graph, outputs
