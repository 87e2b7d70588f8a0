"""The command: ``python -m logitlab.bench``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .. import fast_cpu, models
from ..measure.table import Table, combine_runs, cpu_name
from ..measure.timing import breakdown_table
from .basics import bench_generate, bench_load, bench_parallel, bench_sampling
from .constrained import bench_constrained
from .decoders import bench_decoders
from .drafting import bench_draft_model, bench_eagle, bench_pass, bench_speculative, bench_typical
from .llamacpp import bench_llama_cpp
from .prompts import cached_prefix
from .spec_bench import bench_spec_bench
from .verification import bench_verification
from .watermarks import bench_watermarks


def main(argv=None) -> Table:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    if args.repeat is not None and args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    torch.manual_seed(0)
    if not args.keep_kernel_choice:
        forgotten = fast_cpu.forget_choices(models.cache_dir())
        print(f"measuring the CPU's kernels afresh (forgot {len(forgotten)} remembered choices)")
    model, tokenizer = models.load("smollm2-135m", device="cpu")
    # Every Hugging Face row runs on the model as Hugging Face gives it: no fast path.
    stock = models.load("smollm2-135m", device="cpu", fast=False)[0]
    fast_path = {f"linear {out}x{in_}": per_rows for (out, in_), per_rows in model.logitlab_fast_cpu.items()}
    print(f"CPU fast path (kernel per weight shape and number of rows): {fast_path}")
    table, breakdown = run_repeatedly(args, model, stock, tokenizer)
    machine = f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}, device cpu"
    print(f"Machine: {machine}")
    print(table.markdown())
    if breakdown:
        print("\nWhere a pass with the fast path spends its time (module hooks; medians):\n")
        print(breakdown_table(breakdown))
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": machine, "fast_cpu": fast_path, "runs": args.runs, "rows": table.rows,
                                "breakdown": breakdown}, indent=2))
    print(f"(written to {path})")
    return table


def build_parser() -> argparse.ArgumentParser:
    """The command's options: which sections to skip, how many repeats and runs, where the JSON goes."""
    parser = argparse.ArgumentParser(prog="python -m logitlab.bench",
                                     description="The book's performance table, as ratios measured in one run.")
    parser.add_argument("--skip-load", action="store_true", help="skip the first-load row (about 30 s)")
    parser.add_argument("--skip-verification", action="store_true",
                        help="skip the decode-step and verification-pass rows (about 2 min)")
    parser.add_argument("--skip-llama-cpp", action="store_true",
                        help="skip the llama.cpp rows (they run only where llama-cpp-python is installed)")
    parser.add_argument("--skip-sampling", action="store_true",
                        help="skip the sampling and truncation rows on a batch of logits (about 1 min)")
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
    parser.add_argument("--skip-spec-bench", action="store_true",
                        help="skip every drafter on Spec-Bench's six tasks (over an hour; with --quick over 25 min)")
    parser.add_argument("--spec-bench-drafters", default=None, metavar="REGEX",
                        help="in the Spec-Bench section, only the drafters whose label matches REGEX (with ll.generate), "
                             "e.g. 'lookup|suffix|Recycling' for those that need no training")
    parser.add_argument("--skip-constrained", action="store_true",
                        help="skip the constrained-decoding rows (about 1 min)")
    parser.add_argument("--skip-watermarks", action="store_true",
                        help="skip the watermark rows: three marks and keyed speculative sampling (about 3 min)")
    parser.add_argument("--skip-decoders", action="store_true",
                        help="skip the closing chapter's rows: beam, truncations, best-of-n, a batch (about 8 min)")
    parser.add_argument("--quick", action="store_true",
                        help="every table, with fewer settings and repeats: 2 timed repeats instead of 3-5, "
                             "Medusa at T=0 and 1 only, PaSS k=1,2,4,8 (two-call) and k=1,2 (single-call), "
                             "one Spec-Bench question per task")
    parser.add_argument("--repeat", type=int, default=None,
                        help="timed repeats of each measurement within a run (default: each table's own, 3-5; "
                             "2 with --quick); with --runs 3, one repeat per run still gives three timings")
    parser.add_argument("--runs", type=int, default=1,
                        help="run the whole selection this many times, one run after the other, and report each row's "
                             "median with the range of its ratio over the runs (the spread a ranking must exceed)")
    parser.add_argument("--keep-kernel-choice", action="store_true",
                        help="use the CPU kernels remembered from an earlier load instead of measuring them afresh "
                             "(a choice measured under other conditions can slow every decode step)")
    parser.add_argument("--json", default="bench-out/bench.json", help="where to write the results as JSON")
    return parser


# The sections of the table, in the order of the book; each row records the one it belongs to.
SECTIONS = {"load": "Loading the model (chapter 1)",
            "verification": "The cost of a forward pass (chapters 5 and 6)",
            "sampling": "Sampling and truncation on a batch of logits (chapters 1 and 2)",
            "generate": "The decoding loop (chapter 3)",
            "parallel": "Batches, trees and beams (chapters 4 and 5)",
            "speculative": "Prompt lookup and the draft model (chapter 6)",
            "typical": "Medusa heads and typical acceptance (chapter 7)",
            "eagle": "The EAGLE drafter (chapter 9)",
            "constrained": "Constrained decoding (chapter 11)",
            "pass": "PaSS look-ahead embeddings (chapter 8)",
            "spec_bench": "Every drafter on Spec-Bench's six tasks (chapters 6 to 10)",
            "watermarks": "Watermarks (chapter 12)",
            "decoders": "Every decoder that drafts nothing (chapter 13)"}


def run_repeatedly(args, model, stock, tokenizer) -> tuple[Table, dict | None]:
    """Every selected section ``args.runs`` times, one whole run after the other (so that each
    run sees the machine as it is then); the rows combined into medians with their spread, and
    the first run's breakdown."""
    runs, breakdown = [], None
    for run in range(args.runs):
        if args.runs > 1:
            print(f"\n== run {run + 1} of {args.runs} ==")
        table = Table()
        if not args.skip_load:
            table.section = SECTIONS["load"]
            bench_load(table)
        broken_down = run_sections(args, table, model, stock, tokenizer)
        breakdown = breakdown or broken_down
        runs.append(table.rows)
    return Table(combine_runs(runs) if args.runs > 1 else runs[0]), breakdown


def run_sections(args, table: Table, model, stock, tokenizer):
    """Every section that ``args`` does not skip, in the order of the book; returns the fast
    path's time breakdown (None when the verification rows are skipped)."""
    repeat = {"repeat": args.repeat} if args.repeat else {"repeat": 2} if args.quick else {}
    breakdown = None
    if not args.skip_verification:
        table.section = SECTIONS["verification"]
        breakdown = bench_verification(table, model, stock, tokenizer, **({"rounds": 4} if args.quick else {}))
        if not args.skip_llama_cpp:
            bench_llama_cpp(table, model, cached_prefix(tokenizer))
    parts = [("sampling", lambda: bench_sampling(table, model, tokenizer)),
             ("generate", lambda: bench_generate(table, model, tokenizer, stock=stock, **repeat)),
             ("parallel", lambda: bench_parallel(table, model, tokenizer, stock=stock)),
             ("speculative", lambda: (bench_speculative(table, model, tokenizer, stock=stock, **repeat),
                                      bench_draft_model(table, model, tokenizer, stock=stock, **repeat))),
             ("typical", lambda: bench_typical(table, model, tokenizer,
                                               **(dict(repeat, temperatures=(0.0, 1.0)) if args.quick else repeat))),
             ("eagle", lambda: bench_eagle(table, model, tokenizer, **repeat)),
             ("constrained", lambda: bench_constrained(table, model, tokenizer, **repeat)),
             ("pass", lambda: bench_pass(table, model, tokenizer,
                                         **(dict(repeat, ks=(1, 2, 4, 8), single_ks=(1, 2)) if args.quick else repeat))),
             ("spec_bench", lambda: bench_spec_bench(table, model, tokenizer,
                                                     **(dict(repeat, per_task=1) if args.quick else repeat),
                                                     **({"only": args.spec_bench_drafters}
                                                        if args.spec_bench_drafters else {}))),
             ("watermarks", lambda: bench_watermarks(table, model, tokenizer, **repeat)),
             ("decoders", lambda: bench_decoders(table, model, tokenizer, **repeat))]
    for name, run in parts:
        if not getattr(args, f"skip_{name}"):
            table.section = SECTIONS[name]
            run()
    return breakdown


if __name__ == "__main__":
    main()
