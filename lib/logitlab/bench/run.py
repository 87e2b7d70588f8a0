"""The command: ``python -m logitlab.bench``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .. import models
from .constrained import bench_constrained
from .decoders import bench_decoders
from .basics import bench_generate, bench_load, bench_parallel, bench_sampling
from .drafting import bench_draft_model, bench_eagle, bench_pass, bench_speculative, bench_typical
from .table import Table, cpu_name
from ..timing import breakdown_table
from .llamacpp import bench_llama_cpp
from .prompts import cached_prefix
from .verification import bench_verification


def main(argv=None) -> Table:
    parser = argparse.ArgumentParser(prog="python -m logitlab.bench",
                                     description="The book's performance table, as ratios measured in one run.")
    parser.add_argument("--skip-load", action="store_true", help="skip the first-load row (about 30 s)")
    parser.add_argument("--skip-verification", action="store_true",
                        help="skip the decode-step and verification-pass rows (about 2 min)")
    parser.add_argument("--skip-llama-cpp", action="store_true",
                        help="skip the llama.cpp rows (they run only where llama-cpp-python is installed)")
    parser.add_argument("--skip-generate", action="store_true", help="skip the decoding-loop rows (about 2 min)")
    parser.add_argument("--skip-parallel", action="store_true",
                        help="skip the batch, tree and beam-search rows (about 1 min)")
    parser.add_argument("--skip-speculative", action="store_true",
                        help="skip the speculative-decoding rows (about 8 min)")
    parser.add_argument("--skip-typical", action="store_true",
                        help="skip the Medusa-heads and typical-acceptance rows (about 6 min)")
    parser.add_argument("--skip-eagle", action="store_true",
                        help="skip the EAGLE drafter's rows (about 6 min)")
    parser.add_argument("--skip-pass", action="store_true",
                        help="skip the PaSS look-ahead rows (about 25 min)")
    parser.add_argument("--skip-constrained", action="store_true",
                        help="skip the constrained-decoding rows (about 1 min)")
    parser.add_argument("--skip-decoders", action="store_true",
                        help="skip the closing chapter's rows: beam, truncations, best-of-n, a batch (about 8 min)")
    parser.add_argument("--quick", action="store_true",
                        help="every table, with fewer settings and repeats: 2 timed repeats instead of 3-5, "
                             "Medusa at T=0 and 1 only, PaSS k=1,2,4,8 (two-call) and k=1,2 (single-call)")
    parser.add_argument("--json", default="bench-out/bench.json", help="where to write the results as JSON")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    table = Table()
    if not args.skip_load:
        bench_load(table)
    model, tokenizer = models.load("smollm2-135m", device="cpu")
    # Every Hugging Face row runs on the model as Hugging Face gives it: no fast path.
    stock = models.load("smollm2-135m", device="cpu", fast=False)[0]
    fast_path = {f"linear {out}x{in_}": per_rows for (out, in_), per_rows in model.logitlab_fast_cpu.items()}
    print(f"CPU fast path (kernel per weight shape and number of rows): {fast_path}")
    breakdown = run_sections(args, table, model, stock, tokenizer)
    machine = f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, device cpu"
    print(f"Machine: {machine}")
    print(table.markdown())
    if breakdown:
        print("\nWhere a pass with the fast path spends its time (module hooks; medians):\n")
        print(breakdown_table(breakdown))
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine, "fast_cpu": fast_path, "rows": table.rows,
                                "breakdown": breakdown}, indent=2))
    print(f"(written to {path})")
    return table


def run_sections(args, table: Table, model, stock, tokenizer):
    """Every section that ``args`` does not skip, in the order of the book; returns the fast
    path's time breakdown (None when the verification rows are skipped)."""
    repeat = {"repeat": 2} if args.quick else {}
    breakdown = None
    if not args.skip_verification:
        breakdown = bench_verification(table, model, stock, tokenizer, **({"rounds": 4} if args.quick else {}))
    if not (args.skip_verification or args.skip_llama_cpp):
        bench_llama_cpp(table, model, cached_prefix(tokenizer))
    bench_sampling(table, model, tokenizer)
    if not args.skip_generate:
        bench_generate(table, model, tokenizer, stock=stock, **repeat)
    if not args.skip_parallel:
        bench_parallel(table, model, tokenizer, stock=stock)
    if not args.skip_speculative:
        bench_speculative(table, model, tokenizer, stock=stock, **repeat)
        bench_draft_model(table, model, tokenizer, stock=stock, **repeat)
    if not args.skip_typical:
        bench_typical(table, model, tokenizer, **(dict(repeat, temperatures=(0.0, 1.0)) if args.quick else {}))
    if not args.skip_eagle:
        bench_eagle(table, model, tokenizer, **repeat)
    if not args.skip_constrained:
        bench_constrained(table, model, tokenizer, **repeat)
    if not args.skip_pass:
        bench_pass(table, model, tokenizer, **(dict(repeat, ks=(1, 2, 4, 8), single_ks=(1, 2)) if args.quick else {}))
    if not args.skip_decoders:
        bench_decoders(table, model, tokenizer, **repeat)
    return breakdown


if __name__ == "__main__":
    main()
