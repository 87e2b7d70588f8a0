"""``python -m logitlab.bench.gpu``: the GPU fast path measured, in one run (issue 45's table).

Made for a lent GPU, where device time is short: one command, a few minutes, every figure the
closing chapter and the benchmarks page need, written as JSON (``--json``). It runs on any device
(``--device``; ``--quick`` for a check of the script itself on a CPU, in about a minute).

* **passes**: the decode step and v(n) (a pass over n new tokens, in decode steps) after a
  cached prefix of about 200 tokens, for the model as Hugging Face gives it (``stock``), as
  ``ll.load`` gives it (on CUDA: the static cache with recorded passes; on a CPU: the CPU fast
  path), and on the static cache without recording (``static``), timed in turn;
* **generate**: ``ll.generate`` on ``ll.load``'s model against ``ll.generate`` on the stock model,
  Hugging Face's eager ``generate`` and Hugging Face's ``generate`` with its static cache (which
  Hugging Face compiles with ``torch.compile`` on CUDA, not on a CPU), greedy, checked to give the
  same tokens;
* **drafters**: every shipped drafter (draft model, Medusa's tree, PaSS's look-ahead embeddings,
  EAGLE's chain and tree) and prompt lookup against ``ll.generate`` on ``ll.load``'s model, at
  T = 0 (checked to give the same tokens) and T = 1, with tokens per call.

Each time is the median of ``--repeat`` runs taken in turn after a warm-up round.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path

import torch

from .. import fast_gpu, models
from ..decoding.generate import generate
from ..devices import device as default_device
from ..measure.table import Table
from ..measure.timing import pass_times_in_turn
from ..speculative.loop import speculative_generate
from .drafting import pass_calls, time_against_ar, timed_runs
from .prompts import DRAFT_PROMPTS, cached_prefix, chat

SIZES = (1, 2, 4, 8, 16)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m logitlab.bench.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="where to run (default: ll.device(), CUDA first)")
    parser.add_argument("--new-tokens", type=int, default=128, help="new tokens per answer (default 128)")
    parser.add_argument("--repeat", type=int, default=3, help="timed repeats of each row (default 3)")
    parser.add_argument("--quick", action="store_true", help="a check of the script: 16 tokens, 1 repeat, sizes 1-4")
    parser.add_argument("--json", default="bench-out/gpu.json", help="where to write the results")
    args = parser.parse_args(argv)
    if args.new_tokens < 1 or args.repeat < 1:
        parser.error("--new-tokens and --repeat must be at least 1")
    new_tokens, repeat, sizes = (16, 1, SIZES[:3]) if args.quick else (args.new_tokens, args.repeat, SIZES)
    where = torch.device(args.device) if args.device else default_device()
    torch.manual_seed(0)
    model, tokenizer = models.load("smollm2-135m", device=where)
    stock = models.load("smollm2-135m", device=where, fast=False)[0]
    # A third copy: the path is a model's own (read when a cache is made), and the three are timed in turn.
    static = fast_gpu.enable(models.load("smollm2-135m", device=where)[0], graphs=False)
    contenders = {"stock": stock, "ll.load": model, "static": static}
    out = {"info": machine(where, model), "settings": {"new_tokens": new_tokens, "repeat": repeat, "sizes": sizes},
           "passes": bench_passes(contenders, tokenizer, sizes, rounds=3 if args.quick else 7)}
    table = Table()
    bench_generate(table, model, stock, tokenizer, new_tokens, repeat)
    bench_drafters(table, model, tokenizer, new_tokens, repeat, quick=args.quick)
    out["rows"] = table.rows
    out["recorded"] = fast_gpu.recorded(model)  # on CUDA: passes recorded, and any failure to record
    print(json.dumps(out["passes"], indent=1))
    print(table.markdown())
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"(written to {path})")
    return out


def machine(where, model) -> dict:
    """What the figures were measured on."""
    import transformers

    name = torch.cuda.get_device_name(where) if where.type == "cuda" else where.type
    return {"device": name, "device_type": where.type, "torch": torch.__version__,
            "cuda": torch.version.cuda, "transformers": transformers.__version__, "dtype": str(model.dtype),
            "threads": torch.get_num_threads(), "date": datetime.date.today().isoformat(),
            "ll.load": path(model)}


def path(model) -> str:
    """Which path ``model``'s passes take."""
    plan = getattr(model, "logitlab_static", None)
    if plan is not None:
        return "static cache, recorded passes" if plan.graphs else "static cache"
    return "CPU fast path" if getattr(model, "logitlab_fast_cpu", None) else "stock"


def bench_passes(contenders: dict, tokenizer, sizes, rounds: int) -> dict:
    """``{name: {"step_ms", "v_n"}}``: each model's decode step and v(n), timed in turn."""
    times = pass_times_in_turn(contenders, cached_prefix(tokenizer), list(sizes), rounds)
    out = {}
    for name, per_size in times.items():
        step = statistics.median(per_size[1])
        out[name] = {"step_ms": round(step * 1000, 3),
                     "v_n": {n: round(statistics.median(t) / step, 3) for n, t in per_size.items() if n != 1}}
    return out


@torch.inference_mode()
def bench_generate(table: Table, model, stock, tokenizer, new_tokens: int, repeat: int) -> None:
    """``ll.generate`` (on ``model``) against the stock model's loops, ours and Hugging Face's."""
    from transformers import GenerationConfig

    prompts = [chat(tokenizer, q).to(model.device) for q in DRAFT_PROMPTS]
    # No EOS, and the pad token named (id 2 is <|im_end|>, inside every chat prompt): the same work as ours.
    eager = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=[], pad_token_id=2)
    fixed = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=[], pad_token_id=2,
                             cache_implementation="static")
    ours = dict(max_new_tokens=new_tokens, temperature=0, eos_token_id=[])
    runs = {"ll.generate": lambda ids, gen: generate(model, ids, **ours).new_tokens[0],
            "ll.generate, stock model": lambda ids, gen: generate(stock, ids, **ours).new_tokens[0],
            "Hugging Face generate": lambda ids, gen: stock.generate(ids, attention_mask=torch.ones_like(ids),
                                                                     generation_config=eager)[0, -new_tokens:],
            "Hugging Face generate, static cache" + (" (torch.compile)" if model.device.type == "cuda" else ""):
                lambda ids, gen: stock.generate(ids, attention_mask=torch.ones_like(ids), generation_config=fixed)[
                    0, -new_tokens:]}
    for label in list(runs):  # the warm-up round; a contender that fails here is left out, with its error
        try:
            [runs[label](ids, None) for ids in prompts]
        except Exception as error:  # noqa: BLE001 (torch.compile can fail in many ways on a new machine)
            table.add(f"{label}: failed ({type(error).__name__}: {str(error)[:200]})", float("nan"))
            del runs[label]
    times, results = timed_runs(model, runs, prompts, repeat, warmup=0)
    greedy = [t.tolist() for t in results["ll.generate"]]
    for label, outs in results.items():
        if [t.tolist() for t in outs] != greedy:
            raise AssertionError(f"{label} gave other greedy tokens than ll.generate")
    name = f"{len(prompts)} prompts, {new_tokens} tokens each, T=0"
    for label, seconds in zip(runs, times):
        table.add(f"{label}, {name} ({seconds * 1000 / new_tokens / len(prompts):.2f} ms per token)", seconds,
                  None if label == "ll.generate" else seconds / times[0], "slower than ll.generate")


@torch.inference_mode()
def bench_drafters(table: Table, model, tokenizer, new_tokens: int, repeat: int, quick: bool = False) -> None:
    """Every shipped drafter against ``ll.generate``, at T = 0 and T = 1."""
    from ..speculative import draft_model, eagle, medusa_heads, pass_embeddings
    from ..speculative.eagle import EagleDrafter
    from ..speculative.medusa import MedusaDrafter
    from ..speculative.prompt_lookup import PromptLookupDrafter

    draft = draft_model.load_pretrained(model)
    feature = eagle.load_pretrained(model)
    heads = medusa_heads.load_pretrained(model)
    lookahead = pass_embeddings.load_pretrained(model)
    vocab = model.config.vocab_size
    prompts = [chat(tokenizer, q).to(model.device) for q in DRAFT_PROMPTS]
    for temperature in (0.0,) if quick else (0.0, 1.0):
        common = dict(max_new_tokens=new_tokens, temperature=temperature, eos_token_id=[])

        def spec(make, gamma):
            return lambda ids, gen: speculative_generate(model, make(), ids, gamma=gamma, generator=gen, **common)

        runs = {"ll.generate": lambda ids, gen: generate(model, ids, generator=gen, **common),
                "draft model (gamma=3)": spec(lambda: draft_model.DraftModelDrafter(draft), 3),
                "Medusa tree (3, 2, 1)": spec(lambda: MedusaDrafter(heads, tree=(3, 2, 1)), 3),
                "PaSS look-ahead (k=2)": spec(lambda: lookahead, 2),
                "EAGLE chain (gamma=3)": spec(lambda: EagleDrafter(feature), 3),
                "EAGLE tree (top_k=3, 10 nodes, depth 4)": spec(lambda: EagleDrafter(feature, tree=dict(top_k=3, nodes=10)),
                                                                4),
                "prompt lookup (gamma=5)": spec(lambda: PromptLookupDrafter(vocab), 5)}
        # PaSS drafts with the target itself: its drafting passes count too (tokens per target pass).
        time_against_ar(table, model, runs, prompts, temperature, new_tokens, repeat, unit="target pass",
                        calls={"PaSS look-ahead (k=2)": pass_calls})


if __name__ == "__main__":
    main()
