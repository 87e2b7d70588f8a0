"""The llama.cpp row: the same weights in float32 under llama.cpp, decode step and v(n) timed in
turn with the fast path's. Optional: it runs only where ``llama-cpp-python`` is installed (it
builds llama.cpp from source, about 15 minutes on two cores), and says so otherwise."""

from __future__ import annotations

import statistics

import torch

from ..devices import now
from ..measure.table import Table
from ..measure.timing import pass_times
from ..models import cache_dir, gguf_path

INSTALL = "pip install llama-cpp-python (it compiles llama.cpp: about 15 minutes on two cores)"


def float32_gguf():
    """The shipped GGUF file turned into float32 by llama.cpp's own quantiser (once, then cached):
    the same weights the book's loader dequantises."""
    import llama_cpp

    target = cache_dir() / "smollm2-135m-f32.gguf"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.nthread = llama_cpp.LLAMA_FTYPE_ALL_F32, True, 0
        params.quantize_output_tensor = True
        partial = target.with_suffix(".part")
        if llama_cpp.llama_model_quantize(str(gguf_path()).encode(), str(partial).encode(), params) != 0:
            raise RuntimeError("llama.cpp could not convert the GGUF file to float32")
        partial.rename(target)
    return target


@torch.inference_mode()
def bench_llama_cpp(table: Table, model, context, sizes=(1, 2, 4, 8, 16), rounds: int = 7) -> None:
    """A decode step and v(n) of llama.cpp (float32, as many threads as torch uses, logits for
    every token of a pass, as a verification needs) against the fast path, round by round."""
    try:
        from llama_cpp import Llama
    except ImportError:
        print(f"llama.cpp rows skipped: llama-cpp-python is not installed ({INSTALL})")
        return
    llm = Llama(model_path=str(float32_gguf()), n_ctx=1024, n_batch=64, n_threads=torch.get_num_threads(),
                logits_all=True, verbose=False)
    llm.eval(list(context))
    theirs = {n: [] for n in sizes}
    ours = {n: [] for n in sizes}
    for r in range(rounds + 1):
        for n in sizes:
            llm.n_tokens = len(context)  # eval() drops the cache beyond n_tokens first
            start = now()
            llm.eval([context[-1]] * n)
            if r:
                theirs[n].append(now() - start)
        for n, times in pass_times(model, context, sizes, 1).items():
            ours[n] += times if r else []
    steps = {name: statistics.median(t[1]) for name, t in (("llama.cpp", theirs), ("fast path", ours))}
    table.add(f"decode step, llama.cpp float32, {len(context)}-token cached prefix", steps["llama.cpp"],
              steps["llama.cpp"] / steps["fast path"], "slower than the fast path's step")
    for n in sizes[1:]:
        t = statistics.median(theirs[n])
        table.add(f"pass over {n} new tokens, llama.cpp (v({n}) in its decode steps; the fast path's "
                  f"{statistics.median(ours[n]) / steps['fast path']:.2f})", t, t / steps["llama.cpp"], "decode steps")
