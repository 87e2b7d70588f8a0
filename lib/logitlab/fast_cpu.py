"""A faster forward pass on a CPU: better kernels for few-row products (chapter 5's roofline).

A decode step, and a verification pass over a handful of drafts, is almost nothing but
products ``x @ Wᵀ`` of a few rows ``x`` ([n, k], n = 1..16) with a large weight ``W`` ([m, k]);
a batch, a beam search or a short prompt's prefill is the same with a few dozen rows.
They are memory-bound: the weights are read once whatever n, so a pass over 8 tokens should
cost about what a pass over one costs. PyTorch's ``F.linear`` falls short of that on CPUs: it
runs one row as a matrix-vector product on a single core (PyTorch issue 96643) and a few rows
through a GEMM kernel made for many, both streaming the weights far below what the memory gives.
Three other ways compute the same products:

* ``"turned"``: ``(W @ xᵀ)ᵀ``, the rows as the small side of the GEMM (one row padded to two,
  since a one-column product goes back to the single-core kernel);
* ``"packed"``: oneDNN's linear on a copy of ``W`` laid out for it once at load (the kernel
  ``torch.compile`` uses on CPUs); it costs a second copy of the weights in memory;
* ``"transposed"``: ``x @ Wᵀ`` with ``Wᵀ`` copied once at load, the weights stored the other
  way round, which the BLAS multiplies with another kernel (on an older EPYC without AVX-512 it
  streamed one row's output layer about twice as fast as ``F.linear``). That kernel runs one
  row on one core, so the copy is cut into one block of columns per thread, multiplied as a
  batch (:func:`transposed_blocks`); it too costs a copy of the weights.

Which one wins depends on the CPU, its BLAS and the number of rows, so :func:`enable` times
every product of the model with each kernel, for 1, 2, 4, 8, 16, 32 and 64 rows, and keeps
the fastest for each weight shape and row count (several seconds). A pass over n rows uses the
choice for the next count up; more than 64 rows (a long prompt's prefill) use ``F.linear``.
(On the book's CPU oneDNN's kernel computed the output layer for 17 to 64 rows two to three
times as fast as ``F.linear``, which is why the calibration goes past 16.) ``ll.load`` calls
it for models on the CPU and keeps the choice in its cache folder, one small file per machine
(CPU, thread count, PyTorch, weight shapes, kernels), so that only the first load on a machine
measures: later loads are quicker and choose the same kernels, hence the same logits to the last bit
(timings a few percent apart would otherwise choose differently from one load to the next).
Delete the file (:func:`remembered_choice` names it) to measure again; ``python -m
logitlab.bench`` starts by deleting every such file (:func:`forget_choices`), so that its
timings use kernels chosen under its own conditions. A model on a GPU or a Mac is left alone
(their kernels do this already), and so is any forward that records gradients (training). Only
the order of the additions inside each dot product changes, so the logits agree with the plain
forward to float rounding (the tests check the same greedy tokens over long generations).
Attention gets two changes (:func:`gqa_attention`). SmolLM2 has 9 query heads sharing 3
key/value heads, and for a pass over several tokens Hugging Face's attention copies every
key/value head three times before SDPA; SDPA can read them in place (``enable_gqa``). And a
pass over one token per row (a decode step) can instead compute its attention as two batched
products, each key/value head with its group of queries (:func:`grouped_attention`): in
bfloat16, SDPA's CPU kernel took several times as long as that on the book's CPU for a batch of
rows (a batched generation's steps), while for one row and a short context SDPA was faster, and
in float32 the winner changed with the batch and the context. So :func:`enable` times both for the model's heads and dtype at a few
batch sizes and context lengths (``ONE_QUERY_ROWS`` x ``ONE_QUERY_CONTEXT``, a fraction of a
second) and each decode step uses the choice made for the nearest calibrated setting; it is
remembered beside the products' choice.

Switch it off with ``ll.load(..., fast=False)``, the environment variable
``LOGITLAB_FAST_CPU=0``, or :func:`disable`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
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
KERNELS = ("linear", "turned", "packed", "transposed")
ATTENTION = "logitlab_gqa"  # the name :func:`gqa_attention` is registered under in transformers
ONE_QUERY_ROWS = (1, 8, 64)  # batch sizes at which a one-token pass's attention is timed
ONE_QUERY_CONTEXT = (128, 1024)  # the keys it attends to
ONE_QUERY_KERNELS = ("sdpa", "grouped")
_ONE_QUERY_MEASURED: dict = {}  # (shape, dtype, threads) -> choice, measured once per process


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
        kernels = ["linear", "turned", "transposed"] + (["packed"] if _pack(linears) else [])
        for layer in linears:
            _transpose(layer)
        choice = _measure(linears, kernels, rounds)
        if file:
            _write_choice(file, choice)
    for layer in linears:
        layer.logitlab_kernels = choice[_shape(layer)]
        layer.forward = types.MethodType(_forward, layer)
        _keep_copies(layer)
    if _attention(model) == "sdpa":
        _register_attention()
        model.config._attn_implementation = ATTENTION
        one_query = one_query_choice(model, linears[0].weight.dtype, rounds, file)
        for layer in model.modules():
            if hasattr(layer, "num_key_value_groups"):  # Hugging Face's attention layers
                layer.logitlab_one_query = one_query
    model.logitlab_fast_cpu = choice
    return choice


def disable(model) -> None:
    """Give every ``nn.Linear`` of ``model`` back its own forward (and drop the copies of its weights)."""
    for layer in model.modules():
        for name in ("forward", "logitlab_kernels", "logitlab_packed", "logitlab_transposed", "logitlab_one_query"):
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
    if n == 1 and one_query_kernel(module, query.shape[0], key.shape[2]) == "grouped" and (
            attention_mask is None or attention_mask.shape[1] == 1):
        return grouped_attention(query, key, value, attention_mask, scaling), None
    # SDPA's causal rule is aligned top-left: query i sees keys 0..i. Hugging Face passes no mask
    # only where that is right (a prefill; with a longer static cache the later keys are unseen).
    causal = (getattr(module, "is_causal", True) if is_causal is None else is_causal) and n > 1 and attention_mask is None
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, is_causal=causal, enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def grouped_attention(query, key, value, mask=None, scaling=None) -> torch.Tensor:
    """Attention for ``query`` ``[B, heads, n, d]`` over ``key``/``value`` ``[B, kv_heads, L, d]``
    as two batched products, each key/value head with the ``heads / kv_heads`` query heads that
    share it (Hugging Face's order: query head h reads key/value head h // group); ``mask``
    ``[B, 1, n, L]``, True (or 0) where a key is seen, False (or -inf) where not. Scores and
    softmax in float32. Returns ``[B, n, heads, d]``, as the attention functions of transformers do."""
    batch, heads, n, dim = query.shape
    kv = key.shape[1]
    q = query.reshape(batch, kv, heads // kv * n, dim)
    scale = dim ** -0.5 if scaling is None else scaling
    scores = (q @ key.transpose(-1, -2)).float().mul_(scale).view(batch, kv, heads // kv, n, -1)
    if mask is not None:
        mask = mask[:, :, None]  # [B, 1, 1, n, L]: every group of every key/value head
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    weights = torch.softmax(scores, dim=-1).to(value.dtype).view(batch, kv, heads // kv * n, -1)
    return (weights @ value).view(batch, heads, n, dim).transpose(1, 2).contiguous()


def one_query_kernel(module, rows: int, context: int) -> str:
    """The attention kernel ``enable`` chose for a one-token pass over ``rows`` rows and
    ``context`` keys: the choice at the next calibrated batch size up (the largest beyond it) and
    the calibrated context nearest by ratio; ``"sdpa"`` for a module it did not calibrate."""
    choice = getattr(module, "logitlab_one_query", None)
    if not choice:
        return "sdpa"
    near = min(ONE_QUERY_CONTEXT, key=lambda c: abs(math.log(context / c)))
    return choice[(next((r for r in ONE_QUERY_ROWS if r >= rows), ONE_QUERY_ROWS[-1]), near)]


def one_query_choice(model, dtype, rounds: int, file: Path | None) -> dict:
    """``{(rows, context): kernel}`` for the model's attention shape in ``dtype``: read from the
    file beside the products' choice (``file``) if it was saved there for this shape, else
    measured (both kernels in turn, medians) and saved there."""
    config = model.config
    heads = getattr(config, "num_attention_heads", None)
    if not heads:
        return {}  # not a transformer whose heads it can read: SDPA everywhere
    shape = [heads, getattr(config, "num_key_value_heads", None) or heads,
             getattr(config, "head_dim", None) or config.hidden_size // heads]
    saved = None if file is None else file.with_name(file.name.replace("choice-", "attention-"))
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError, KeyError):
        found = json.loads(saved.read_text())
        choice = {(int(r), int(c)): k for r, c, k in found["choice"]}
        if found["shape"] == shape and set(choice) == set(_one_query_settings()) and set(
                choice.values()) <= set(ONE_QUERY_KERNELS):
            return choice
    key = (tuple(shape), str(dtype), torch.get_num_threads())
    if key not in _ONE_QUERY_MEASURED:  # a drafter built on its target's shape reuses the target's measurement
        _ONE_QUERY_MEASURED[key] = {setting: min(ONE_QUERY_KERNELS, key=lambda k: seconds[k])
                                    for setting, seconds in _one_query_times(shape, dtype, rounds).items()}
    choice = dict(_ONE_QUERY_MEASURED[key])
    if saved is not None:
        _write_text(saved, json.dumps({"shape": shape, "choice": [[r, c, k] for (r, c), k in choice.items()]}))
    return choice


def _one_query_settings():
    return [(rows, context) for rows in ONE_QUERY_ROWS for context in ONE_QUERY_CONTEXT]


def _one_query_times(shape, dtype, rounds: int) -> dict:
    """``{(rows, context): {kernel: seconds}}``: the median time of one layer's attention for a
    one-token pass, each kernel in turn."""
    heads, kv, dim = shape
    times = {}
    for rows, context in _one_query_settings():
        q = torch.randn(rows, heads, 1, dim, dtype=dtype)
        k, v = (torch.randn(rows, kv, context, dim, dtype=dtype) for _ in range(2))
        mask = torch.ones(rows, 1, 1, context, dtype=torch.bool)
        kernels = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=kv != heads),
                   "grouped": lambda: grouped_attention(q, k, v, mask)}
        spent = {name: [] for name in kernels}
        for r in range(2 * rounds + 2):  # the first round of each warms up
            for name, run in kernels.items():
                start = time.perf_counter()
                run()
                if r > 1:
                    spent[name].append(time.perf_counter() - start)
        times[rows, context] = {name: statistics.median(ts) for name, ts in spent.items()}
    return times


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


def transposed_blocks(weight: torch.Tensor, parts: int | None = None) -> torch.Tensor:
    """``weight.T`` (``[in, out]``) copied as ``parts`` blocks of columns, ``[parts, in, out /
    parts]``: by default one per thread (the most that divide ``out`` evenly), so that a batched
    product can give each thread its own block; what :func:`transposed` multiplies with."""
    out = weight.shape[0]
    most = torch.get_num_threads() if parts is None else parts
    parts = next(p for p in range(max(1, most), 0, -1) if out % p == 0)
    return torch.stack(weight.detach().t().chunk(parts, dim=1)).contiguous()


def transposed(x: torch.Tensor, blocks: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed as ``x @ weight.T``, block by block, from
    ``blocks = transposed_blocks(weight)``: one batched product, each block's columns in turn."""
    rows = x.reshape(-1, x.shape[-1])
    parts, n = blocks.shape[0], rows.shape[0]
    out = torch.bmm(rows.expand(parts, n, rows.shape[1]), blocks)  # [parts, n, out / parts]
    out = out.transpose(0, 1).reshape(n, -1)  # a view where n or parts is 1 (one row: a decode step)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """A copy of ``weight`` laid out for oneDNN's product kernel, for up to 64 rows: what
    :func:`packed` multiplies with. Raises RuntimeError or AttributeError where this build of
    PyTorch cannot pack (a CPU without oneDNN)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), ROWS[-1])


def packed(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, ·, bias)`` by oneDNN's kernel, from ``weight = packed_weight(·)``."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [None], "")


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
        return packed(x, layer.logitlab_packed, layer.bias)
    if kernel == "transposed":
        return transposed(x, layer.logitlab_transposed, layer.bias)
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
    """The file that keeps the kernel choice for this machine and these weights in ``folder``.
    Its name also depends on the kernels there are to choose from, so that a choice made before
    a kernel was added is not read as if that kernel had lost."""
    key = json.dumps([machine(), sorted({_shape(m) for m in linears}), str(linears[0].weight.dtype), KERNELS])
    return Path(folder) / "fast_cpu" / f"choice-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def forget_choices(folder: str | Path) -> list[Path]:
    """Delete every kernel and attention choice remembered in ``folder``, so that the next load of
    each model measures again (and remembers the new choice); returns the files deleted. The
    bench starts with it: a choice measured once, under other conditions, is never checked again,
    and on the book's CPU one such choice (``F.linear`` for a decode step's products) made every
    later decode step 1.6 times as long as a fresh measurement's."""
    found = sorted((Path(folder) / "fast_cpu").glob("choice-*.json")) + sorted(
        (Path(folder) / "fast_cpu").glob("attention-*.json"))
    for file in found:
        file.unlink(missing_ok=True)
    return found


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
    _write_text(file, json.dumps({f"{out}x{in_}": per_rows for (out, in_), per_rows in choice.items()}, indent=1))


def _write_text(file: Path, text: str) -> None:
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


def _transpose(layer) -> None:
    """Give ``layer`` the copy of its weight that the ``"transposed"`` kernel reads."""
    if not hasattr(layer, "logitlab_transposed"):
        layer.logitlab_transposed = transposed_blocks(layer.weight)


def _keep_copies(layer) -> None:
    """Keep the copies of ``layer``'s weight that its chosen kernels read, and no other: each
    is as large as the weight itself."""
    used = set(layer.logitlab_kernels.values())
    if "transposed" in used:
        _transpose(layer)
    else:
        vars(layer).pop("logitlab_transposed", None)
    if "packed" not in used:
        vars(layer).pop("logitlab_packed", None)


def _shape(layer) -> tuple:
    return (layer.out_features, layer.in_features)


def _pack(linears) -> bool:
    """Lay every weight out for oneDNN; False where this build of PyTorch cannot."""
    try:
        for layer in linears:
            layer.logitlab_packed = packed_weight(layer.weight)
    except (RuntimeError, AttributeError):
        for layer in linears:
            vars(layer).pop("logitlab_packed", None)
        return False
    return True
