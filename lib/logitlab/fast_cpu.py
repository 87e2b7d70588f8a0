"""A faster forward pass on a CPU: better kernels for few-row products (chapter 5's roofline).

A decode step, and a verification pass over a handful of drafts, is almost nothing but
products ``x @ Wᵀ`` of a few rows ``x`` ([n, k], n = 1..16) with a large weight ``W`` ([m, k]);
a batch, a beam search or a short prompt's prefill is the same with a few dozen rows.
They are memory-bound: the weights are read once whatever n, so a pass over 8 tokens should
cost about what a pass over one costs. PyTorch's ``F.linear`` falls short of that on CPUs: it
runs one row as a matrix-vector product on a single core (PyTorch issue 96643) and a few rows
through a GEMM kernel made for many, both streaming the weights far below what the memory gives.
Two other ways compute the same products:

* ``"turned"``: ``(W @ xᵀ)ᵀ``, the rows as the small side of the GEMM (one row padded to two,
  since a one-column product goes back to the single-core kernel);
* ``"packed"``: oneDNN's linear on a copy of ``W`` laid out for it once at load (the kernel
  ``torch.compile`` uses on CPUs); it costs a second copy of the weights in memory.

Which one wins depends on the CPU, its BLAS and the number of rows, so :func:`enable` times
every product of the model with each kernel, for 1, 2, 4, 8, 16, 32 and 64 rows, and keeps
the fastest for each weight shape and row count (several seconds). A pass over n rows uses the
choice for the next count up; more than 64 rows (a long prompt's prefill) use ``F.linear``.
(On the book's CPU oneDNN's kernel computed the output layer for 17 to 64 rows two to three
times as fast as ``F.linear``, which is why the calibration goes past 16.) ``ll.load`` calls
it for models on the CPU and keeps the choice in its cache folder, one small file per machine
(CPU, thread count, PyTorch, weight shapes), so that only the first load on a machine measures:
later loads are quicker and choose the same kernels, hence the same logits to the last bit
(timings a few percent apart would otherwise choose differently from one load to the next).
Delete the file (:func:`remembered_choice` names it) to measure again. A model on a GPU or a
Mac is left alone (their kernels do this already), and so is any forward that records gradients
(training). Only the order of the additions inside each dot product changes, so the logits
agree with the plain forward to float rounding (the tests check the same greedy tokens over long
generations).
Attention gets one change too (:func:`gqa_attention`): SmolLM2 has 9 query heads sharing 3
key/value heads, and for a pass over several tokens Hugging Face's attention copies every
key/value head three times before SDPA; SDPA can read them in place (``enable_gqa``).

Switch it off with ``ll.load(..., fast=False)``, the environment variable
``LOGITLAB_FAST_CPU=0``, or :func:`disable`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import statistics
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

ROWS = (1, 2, 4, 8, 16, 32, 64)  # the calibrated row counts
# A pass over n rows (1..64) uses the choice made for BUCKET[n], the next calibrated count up.
BUCKET = [None] + [next(r for r in ROWS if r >= n) for n in range(1, ROWS[-1] + 1)]
KERNELS = ("linear", "turned", "packed")
ATTENTION = "logitlab_gqa"  # the name :func:`gqa_attention` is registered under in transformers


def wanted(device) -> bool:
    """Whether ``ll.load`` enables the fast path: on a CPU, unless ``LOGITLAB_FAST_CPU=0``."""
    return torch.device(device).type == "cpu" and os.environ.get("LOGITLAB_FAST_CPU", "1") != "0"


@torch.inference_mode()
def enable(model, rounds: int = 2, remember: str | Path | None = None) -> dict:
    """Give every ``nn.Linear`` of ``model`` the kernel measured fastest for its weight's shape
    and its number of rows.

    Returns (and keeps in ``model.logitlab_fast_cpu``) ``{(out_features, in_features): {rows:
    kernel}}`` for each count in :data:`ROWS`. A model that is not on the CPU is left as it is
    (the result is empty). With ``remember`` (a folder), a choice saved there for this machine
    and these weights is used instead of measuring, and a new measurement is saved there.
    """
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not linears or linears[0].weight.device.type != "cpu":
        return {}
    disable(model)
    file = None if remember is None else remembered_choice(remember, linears)
    choice = _read_choice(file, linears) if file else None
    # Packed copies of the weights only where a saved choice uses them (or to measure them).
    if choice is not None and _uses_packed(choice) and not _pack(linears):
        choice = None  # saved where oneDNN packing worked: measure again without it
    if choice is None:
        kernels = ["linear", "turned"] + (["packed"] if _pack(linears) else [])
        choice = _measure(linears, kernels, rounds)
        if file:
            _write_choice(file, choice)
    uses_packed = _uses_packed(choice)
    for layer in linears:
        layer.logitlab_kernels = choice[_shape(layer)]
        layer.forward = types.MethodType(_forward, layer)
        if not uses_packed:
            vars(layer).pop("logitlab_packed", None)  # a second copy of the weights that nothing uses
    if _attention(model) == "sdpa":
        _register_attention()
        model.config._attn_implementation = ATTENTION
    model.logitlab_fast_cpu = choice
    return choice


def disable(model) -> None:
    """Give every ``nn.Linear`` of ``model`` back its own forward (and drop packed copies)."""
    for layer in model.modules():
        for name in ("forward", "logitlab_kernels", "logitlab_packed"):
            vars(layer).pop(name, None)
    if _attention(model) == ATTENTION:
        model.config._attn_implementation = "sdpa"
    model.logitlab_fast_cpu = {}


def gqa_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """Hugging Face's ``"sdpa"`` attention, without copying the key/value heads.

    ``query`` is ``[B, heads, n, d]``, ``key`` and ``value`` ``[B, kv_heads, L, d]`` with fewer
    heads (grouped-query attention). Hugging Face repeats each key/value head for its group of
    query heads (``repeat_kv``, a copy of the whole cache in every layer) whenever a pass has
    more than one token; ``enable_gqa`` lets SDPA read them in place. Same mask, same causal
    rule, same result up to float rounding; a forward that records gradients (training) takes
    Hugging Face's own function.
    """
    if torch.is_grad_enabled():
        # Imported here, not per call on the hot path below (30 calls per forward pass).
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    n = query.shape[2]
    # SDPA's causal rule is aligned top-left: query i sees keys 0..i. Hugging Face passes no mask
    # only where that is right (a prefill; with a longer static cache the later keys are unseen).
    causal = (getattr(module, "is_causal", True) if is_causal is None else is_causal) and n > 1 and attention_mask is None
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, is_causal=causal, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def _attention(model):
    """The name of the attention function a transformers model uses (None for other modules)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None)


def _register_attention() -> None:
    """Make :data:`ATTENTION` a name transformers knows, with the mask its ``"sdpa"`` uses."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, gqa_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def turned(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed as ``(weight @ xᵀ)ᵀ`` (one row padded to two).

    Both the rows and the result are made contiguous: a transposed operand sends the product
    back to a slow kernel, and a transposed result would hand one to the next layer.
    """
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    rows = torch.cat([rows, rows]) if n == 1 else rows.contiguous()
    out = torch.mm(weight, rows.T).T[:n].contiguous()
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _forward(self, x: torch.Tensor) -> torch.Tensor:
    if torch.is_grad_enabled():
        return F.linear(x, self.weight, self.bias)
    n = x.numel() // x.shape[-1]
    # No rows (an empty pass) or more than 64 (a long prefill): F.linear.
    kernel = self.logitlab_kernels.get(BUCKET[n], "linear") if n <= ROWS[-1] else "linear"
    return _product(kernel, self, x)


def _product(kernel: str, layer, x: torch.Tensor) -> torch.Tensor:
    if kernel == "turned":
        return turned(x, layer.weight, layer.bias)
    if kernel == "packed":
        return torch.ops.mkldnn._linear_pointwise(x, layer.logitlab_packed, layer.bias, "none", [None], "")
    return F.linear(x, layer.weight, layer.bias)


def _measure(linears, kernels, rounds: int) -> dict:
    """``{shape: {rows: kernel}}``, the fastest kernel of each shape and row count."""
    choice = {}
    for (shape, n), seconds in _product_times(linears, kernels, rounds).items():
        choice.setdefault(shape, {})[n] = min(kernels, key=lambda k: seconds[k])
    return choice


def _uses_packed(choice: dict) -> bool:
    return any("packed" in per_rows.values() for per_rows in choice.values())


def cpu_info() -> dict:
    """The first processor's fields in ``/proc/cpuinfo`` (empty where there is none: a Mac)."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return {}
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first.splitlines())}


def machine() -> str:
    """This machine, as far as the kernels' speed goes: the CPU (name, family, model and feature
    flags, since one name covers several generations), the thread count and PyTorch's version."""
    info = cpu_info()
    cpu = " | ".join(info.get(k, "") for k in ("model name", "cpu family", "model", "flags")) if info else (
        platform.processor() or platform.machine())
    return f"{cpu} | {torch.get_num_threads()} threads | torch {torch.__version__}"


def remembered_choice(folder: str | Path, linears) -> Path:
    """The file that keeps the kernel choice for this machine and these weights in ``folder``."""
    key = json.dumps([machine(), sorted({_shape(m) for m in linears}), str(linears[0].weight.dtype)])
    return Path(folder) / "fast_cpu" / f"choice-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _read_choice(file: Path, linears) -> dict | None:
    """The saved choice, or None where there is none or it does not fit these weights."""
    try:
        saved = json.loads(file.read_text())
        choice = {tuple(int(d) for d in shape.split("x")): {int(n): k for n, k in per_rows.items()}
                  for shape, per_rows in saved.items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return None
    fits = set(choice) == {_shape(m) for m in linears} and all(
        set(per_rows) == set(ROWS) and set(per_rows.values()) <= set(KERNELS) for per_rows in choice.values())
    return choice if fits else None


def _write_choice(file: Path, choice: dict) -> None:
    """Save ``choice`` atomically (two processes loading at once each write a whole file). A
    folder that cannot be written only costs the next load a new measurement."""
    text = json.dumps({f"{out}x{in_}": per_rows for (out, in_), per_rows in choice.items()}, indent=1)
    with contextlib.suppress(OSError):
        file.parent.mkdir(parents=True, exist_ok=True)
        partial = file.with_name(f"{file.name}.{os.getpid()}.tmp")
        partial.write_text(text)
        os.replace(partial, file)


def _product_times(linears, kernels, rounds: int) -> dict:
    """``{(shape, rows): {kernel: seconds}}``: the median time of the products with each weight
    shape (all the layers that have it), timed while running every product of the model in order.

    Running all of them, as a forward pass does, streams the weights from memory; timing one
    layer again and again would find its weights in the cache and favour the wrong kernel.
    """
    times = {}
    for n in ROWS:
        inputs = {k: torch.randn(n, k, dtype=linears[0].weight.dtype) for k in {m.in_features for m in linears}}
        for r in range(rounds + 1):
            for kernel in kernels:  # in turn, so that a machine that slows down slows every kernel alike
                spent = dict.fromkeys({_shape(m) for m in linears}, 0.0)
                for layer in linears:
                    start = time.perf_counter()
                    _product(kernel, layer, inputs[layer.in_features])
                    spent[_shape(layer)] += time.perf_counter() - start
                if r:  # the first round warms up
                    for shape, seconds in spent.items():
                        times.setdefault((shape, n), {}).setdefault(kernel, []).append(seconds)
    return {key: {kernel: statistics.median(ts) for kernel, ts in row.items()} for key, row in times.items()}


def _shape(layer) -> tuple:
    return (layer.out_features, layer.in_features)


def _pack(linears) -> bool:
    """Lay every weight out for oneDNN; False where this build of PyTorch cannot."""
    try:
        for layer in linears:
            layer.logitlab_packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), ROWS[-1])
    except (RuntimeError, AttributeError):
        for layer in linears:
            vars(layer).pop("logitlab_packed", None)
        return False
    return True
