"""The measurements the book ships, for the closing chapter ("Choosing a decoder") and chapter 10.

Eight files in ``logitlab/data``:

* ``bench_cpu.json``: one whole run of ``python -m logitlab.bench`` on the book's 2-core CPU,
  every row (measurement, median seconds, ratio, what the ratio is against) and the machine;
* ``bench_spec_bench_cpu.json``: the bench's Spec-Bench section alone (every drafter on the
  six tasks of the shipped sample, ``logitlab.spec_bench``), run three times on the same CPU
  (``--runs 3``): each row's median and every run's ratio, the spread a ranking must exceed;
* ``bench_training_free_cpu.json``: the same section with only the drafters that need no
  training (``--spec-bench-drafters 'lookup|suffix|Recycling'``, chapter 10), three runs;
* ``bench_spec_bench_eagle_cpu.json``: the same section with only the EAGLE drafter
  (``--spec-bench-drafters EAGLE``), three runs, measured again after the drafter was retrained;
* ``bench_costmodel_cpu.json``: the same section with the trained drafters and prompt lookup,
  one run, whose rows also carry the cost model's price of their own passes (its check);
* ``bench_watermarks_cpu.json``: the bench's watermark section alone (chapter 12: three marks
  and keyed speculative sampling against ``ll.generate``), run three times on the same CPU;
* ``gpu_pass_costs_h100.json``: the cost of a forward pass of SmolLM2-135M over n new tokens on
  an NVIDIA H100, in float32 and bfloat16, and the one-layer draft model's step over the
  target's (c), measured once with the book's own timing code;
* ``gpu_speed_h200.json``: ``ll.generate`` against the draft model and EAGLE's tree (exact, and
  with typical acceptance) on an NVIDIA H200, measured once with the bench's own pieces (the
  file's ``how`` says which); its ``measurements`` hold that machine's decode step, c and v(n).

A chapter reads them instead of re-running a bench of over an hour; each row says what it
measured, so the chapter can print where every number of its tables comes from.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"


def bench_run(path: str | Path | None = None) -> dict:
    """The shipped bench run (or the JSON that ``python -m logitlab.bench --json`` wrote at
    ``path``): ``{"machine": ..., "rows": [{"measurement", "seconds", "ratio", "against"}, ...]}``."""
    return json.loads(Path(path or DATA / "bench_cpu.json").read_text())


def find_row(rows: list[dict], pattern: str) -> dict:
    """The one row whose measurement matches the regular expression ``pattern``; a
    ``ValueError`` when none or several do (a table must not pick a row by accident)."""
    hits = [r for r in rows if re.search(pattern, r["measurement"])]
    if len(hits) != 1:
        raise ValueError(f"pattern {pattern!r} matches {len(hits)} rows of the bench run, not one: "
                         + "; ".join(r["measurement"] for r in hits[:5]))
    return hits[0]


def split_label(measurement: str) -> tuple[str, str]:
    """A row's label as ``(method, settings)``: the text before its first " (" or ", ", and the rest."""
    cuts = [i for i in (measurement.find(" ("), measurement.find(", ")) if i > 0]
    cut = min(cuts, default=len(measurement))
    return measurement[:cut], measurement[cut:].lstrip(",").strip()


def reading(row: dict) -> tuple[str, str, str]:
    """``(speed, cost, relative to)`` of a row, every ratio read one way: a speed is the row's
    method over what it is compared with (above 1: faster); a cost is the row's time in units of
    something else (a decode step, one sample). A row with no ratio is a baseline.

    A row of several runs (``python -m logitlab.bench --runs N``) gives its median and, in
    brackets, the lowest and highest of its runs, read the same way.
    """
    against, ratio = row["against"], row["ratio"]
    if ratio is None:
        return "", "", ""
    runs = row.get("ratios") or []
    if against.startswith("slower than "):  # the row's time over the other's: its speed is the inverse
        ratio, runs = 1 / ratio, [1 / r for r in runs]
    spread = f" [{min(runs):.2f}-{max(runs):.2f}]" if len(runs) > 1 else ""
    for prefix in ("faster than ", "slower than "):
        if against.startswith(prefix):
            return f"{ratio:.2f}x{spread}", "", against[len(prefix):]
    if against == "Hugging Face's tokens/s":
        return f"{ratio:.2f}x{spread}", "", "Hugging Face"
    return "", f"{ratio:.2f}{spread}", against


def run_markdown(run: dict) -> str:
    """A bench run as the benchmarks page shows it: the machine, then one table per section of
    the run, in its order, each row's settings in a column of their own and every ratio read
    one way (:func:`reading`)."""
    sections = list(dict.fromkeys(r.get("section", "") for r in run["rows"]))
    parts = [f"Machine: {run['machine']}."]
    for section in sections:
        lines = ["| method | settings | median time | speed (above 1: faster) | cost | relative to |",
                 "|:---|:---|---:|---:|---:|:---|"]
        for r in run["rows"]:
            if r.get("section", "") == section:
                method, settings = split_label(r["measurement"])
                speed, cost, relative = reading(r)
                lines.append(f"| {method} | {settings} | {r['seconds'] * 1000:.1f} ms | {speed} | {cost} | {relative} |")
        parts.append((f"### {section}\n\n" if section else "") + "\n".join(lines))
    return "\n\n".join(parts) + "\n"


# The shipped runs' tables sit between these pairs of lines of the benchmarks page (MyST comments).
PAGE_BEGIN, PAGE_END = "% BEGIN the shipped bench run", "% END the shipped bench run"
SPEC_BENCH_BEGIN, SPEC_BENCH_END = "% BEGIN the shipped Spec-Bench run", "% END the shipped Spec-Bench run"
FREE_BEGIN, FREE_END = "% BEGIN the shipped training-free run", "% END the shipped training-free run"
EAGLE_BEGIN, EAGLE_END = "% BEGIN the shipped retrained-EAGLE run", "% END the shipped retrained-EAGLE run"
MARKS_BEGIN, MARKS_END = "% BEGIN the shipped watermark run", "% END the shipped watermark run"
COST_BEGIN, COST_END = "% BEGIN the shipped cost-model run", "% END the shipped cost-model run"


def write_into_page(page: str | Path, run: dict | None = None, spec_bench: dict | None = None,
                    training_free: dict | None = None, watermarks: dict | None = None,
                    eagle: dict | None = None, costmodel: dict | None = None) -> None:
    """Replace the tables between ``PAGE_BEGIN`` and ``PAGE_END`` in ``page`` (the benchmarks
    page) with ``run_markdown(run)`` (default: the shipped run), and those between
    ``SPEC_BENCH_BEGIN`` and ``SPEC_BENCH_END`` (``FREE_BEGIN`` and ``FREE_END``, ``EAGLE_BEGIN``
    and ``EAGLE_END``, ``COST_BEGIN`` and ``COST_END``: its forecasts only) with
    ``spec_bench_markdown`` of the shipped Spec-Bench run (training-free run, retrained-EAGLE run,
    cost-model run) or of the one given,
    after a new run is shipped; a pair of lines the page does not have is left out."""
    page = Path(page)
    text = page.read_text()
    for begin, end, markdown in [(PAGE_BEGIN, PAGE_END, lambda: run_markdown(run or bench_run())),
                                 (SPEC_BENCH_BEGIN, SPEC_BENCH_END,
                                  lambda: spec_bench_markdown(spec_bench or spec_bench_run())),
                                 (FREE_BEGIN, FREE_END,
                                  lambda: spec_bench_markdown(training_free or training_free_run())),
                                 (EAGLE_BEGIN, EAGLE_END, lambda: spec_bench_markdown(eagle or eagle_retrained_run())),
                                 (MARKS_BEGIN, MARKS_END, lambda: run_markdown(watermarks or watermark_run())),
                                 (COST_BEGIN, COST_END,
                                  lambda: spec_bench_markdown(costmodel or costmodel_run(), forecasts_only=True))]:
        if begin not in text:
            continue
        start, stop = text.index(begin) + len(begin), text.index(end)
        text = text[:start] + "\n\n" + markdown() + "\n" + text[stop:]
    page.write_text(text)


def training_free_run(path: str | Path | None = None) -> dict:
    """The shipped Spec-Bench run of the drafters that need no training (chapter 10): prompt
    lookup, the suffix automaton, Token Recycling (from an empty table, and from one warmed on
    other prompts) and the combination, beside ``ll.generate``, three runs."""
    return bench_run(path or DATA / "bench_training_free_cpu.json")


def eagle_retrained_run(path: str | Path | None = None) -> dict:
    """The shipped Spec-Bench run of the EAGLE drafter alone (chain and dynamic tree, beside
    ``ll.generate``), three runs, taken after its retraining; the full Spec-Bench run's EAGLE rows
    are those of the drafter shipped before."""
    return bench_run(path or DATA / "bench_spec_bench_eagle_cpu.json")


def costmodel_run(path: str | Path | None = None) -> dict:
    """The shipped run that checks the cost model: the Spec-Bench section with the trained drafters
    and prompt lookup, one run, each row with the forecast from another question and the price of
    its own passes."""
    return bench_run(path or DATA / "bench_costmodel_cpu.json")


def watermark_run(path: str | Path | None = None) -> dict:
    """The shipped run of the bench's watermark section (chapter 12), three runs: plain sampling,
    the green list, the Gumbel-max watermark, tournament sampling and the draft model's
    speculative sampling unmarked and keyed, in :func:`bench_run`'s layout."""
    return bench_run(path or DATA / "bench_watermarks_cpu.json")


def spec_bench_run(path: str | Path | None = None) -> dict:
    """The shipped Spec-Bench run (three runs of the bench's Spec-Bench section), in
    :func:`bench_run`'s layout."""
    return bench_run(path or DATA / "bench_spec_bench_cpu.json")


# A drafter's row of the Spec-Bench section, e.g. "EAGLE chain (gamma=3) (1.52 tokens per target
# pass, predicted 1.21x, accepted by position 0.40/0.31/0.25), 2 Spec-Bench translation prompts, 128
# tokens each, T=0"; runs before the bench forecast its rows have no "predicted", and runs before it
# priced each row's own passes no "... at its own passes".
SPEC_BENCH_ROW = re.compile(r"^(?P<method>.+?)(?: \((?P<per_call>[\d.]+) tokens per target pass, "
                            r"(?:predicted (?P<predicted>[\d.]+)x, )?(?:(?P<own>[\d.]+)x at its own passes, )?"
                            r"(?:accepted by position (?P<kept>[\d./]+)|no drafts proposed)\))?, "
                            r"\d+ Spec-Bench (?P<task>.+) prompts, \d+ tokens each, "
                            r"T=(?P<temperature>[\d.]+)$")


def spec_bench_cells(run: dict) -> dict:
    """``{(temperature, method): {task: row}}`` for every row of the run's Spec-Bench section,
    each row with its ``per_call`` (tokens per target pass), ``first_kept`` (the first draft
    position's acceptance), ``predicted`` (the cost model's forecast of its speedup, in the
    first run; None in runs that did not forecast) and ``own`` (the cost model's price of the first
    run's own passes; None in runs that did not price them) read from its label; ``ll.generate``'s rows
    have none of them. A row
    whose label does not parse is a ``ValueError`` (the tables must not drop one silently)."""
    cells = {}
    for r in run["rows"]:
        if "Spec-Bench" not in r["measurement"]:
            continue
        match = SPEC_BENCH_ROW.match(r["measurement"])
        if match is None:
            raise ValueError(f"a Spec-Bench row of an unknown form: {r['measurement']!r}")
        kept = match["kept"]
        row = dict(r, per_call=float(match["per_call"]) if match["per_call"] else None,
                   first_kept=float(kept.split("/")[0]) if kept else None,
                   predicted=float(match["predicted"]) if match["predicted"] else None,
                   own=float(match["own"]) if match["own"] else None)
        cells.setdefault((float(match["temperature"]), match["method"]), {})[match["task"]] = row
    return cells


def first_kept(row: dict) -> str:
    """A row's first-draft acceptance as the tables print it; "-" where no draft was proposed."""
    return "-" if row["first_kept"] is None else f"{row['first_kept']:.2f}"


def overall(rows: list[dict], baseline: list[dict]) -> tuple[float | None, float, list[float]]:
    """Over several tasks with the same number of new tokens each: tokens per target pass (all
    tokens over all passes: the harmonic mean of the tasks'), and the speedup as the baseline's
    total time over the drafter's: in each run, and their median (so that it lies within the runs'
    range, as the median of per-task medians need not); with one run, of the rows' times."""
    per_call = len(rows) / sum(1 / r["per_call"] for r in rows) if all(r.get("per_call") for r in rows) else None
    runs = [sum(b["seconds_runs"][i] for b in baseline) / sum(r["seconds_runs"][i] for r in rows)
            for i in range(len(rows[0].get("seconds_runs") or []))]
    total = sum(r["seconds"] for r in baseline) / sum(r["seconds"] for r in rows)
    return per_call, statistics.median(runs) if runs else total, runs


def first_run(row: dict) -> float:
    """A row's time in the first run (the run its label's counts and forecast come from)."""
    return (row.get("seconds_runs") or [row["seconds"]])[0]


def overall_forecast(rows: list[dict], baseline: list[dict], key: str = "predicted") -> float | None:
    """The cost model's forecast over several tasks (None where a row has none): each task's
    forecast speedup turned into a time, the baseline's first run over it, and the baseline's
    total over those times, as ``overall`` adds up measured times. ``key="own"``: the same for
    the model's price of each row's own passes."""
    if not all(r.get(key) for r in rows):
        return None
    return sum(map(first_run, baseline)) / sum(first_run(b) / r[key] for r, b in zip(rows, baseline))


def first_run_speeds(rows: list[dict], baseline: list[dict]) -> tuple[list[float], float]:
    """A drafter's speed over the baseline in the first run (the run its forecasts were made in):
    per task, and over all of them (total times)."""
    per_task = [first_run(b) / first_run(r) for r, b in zip(rows, baseline)]
    return per_task, sum(map(first_run, baseline)) / sum(map(first_run, rows))


def forecast_line(method: str, rows: list[dict], baseline: list[dict]) -> str:
    """A table line of one drafter's forecasts against its first run, "forecast / measured", per
    task and over all of them; "forecast / own passes / measured" where the rows also carry the
    price of their own passes."""
    per_task, measured = first_run_speeds(rows, baseline)
    keys = ["predicted", "own"] if overall_forecast(rows, baseline, "own") else ["predicted"]
    cells = [" / ".join(f"{r[k]:.2f}x" for k in keys) + f" / {x:.2f}x" for r, x in zip(rows, per_task)]
    whole = " / ".join(f"{overall_forecast(rows, baseline, k):.2f}x" for k in keys)
    return f"| {method} | " + " | ".join(cells) + f" | {whole} / {measured:.2f}x |"


def forecast_errors(cells: dict, temperature: float, tasks: list[str]) -> str:
    """A line under a forecast table: of the task rows of every drafter at ``temperature`` whose
    rows carry both numbers, how many the forecast and the price of the row's own passes each
    come within 10% of (of the first run's speed), and the root-mean-square of their relative errors."""
    errors = {"predicted": [], "own": []}
    for (t, method), by_task in cells.items():
        rows = [by_task[task] for task in tasks]
        if t != temperature or method == "ll.generate" or not all(r.get("own") for r in rows):
            continue
        speeds, _ = first_run_speeds(rows, [cells[(t, "ll.generate")][task] for task in tasks])
        for key, found in errors.items():
            found += [r[key] / x - 1 for r, x in zip(rows, speeds)]
    said = [f"{sum(abs(e) <= 0.1 for e in found)} of {len(found)} task rows (root-mean-square error "
            f"{100 * statistics.fmean(e * e for e in found) ** 0.5:.0f}%)" for found in errors.values()]
    return (f"\n\nWithin 10% of the first run's speed: the forecast on {said[0]}; the price of the row's own "
            f"passes on {said[1]}.")


# The leaderboard's method -> the starts of our rows that run the same kind of drafter, the first
# found set beside it.
SPEC_BENCH_NEAREST = {
    "prompt lookup (PLD)": ("prompt lookup",), "draft model (SpS)": ("draft model",), "Medusa": ("Medusa heads",),
    "EAGLE": ("EAGLE chain",), "EAGLE-2": ("EAGLE tree",),
    # The leaderboard's Token Recycling keeps its table from one query to the next: a warmed
    # table's row where the run has one, else the empty table's.
    "Token Recycling": ("Token Recycling, table warmed", "Token Recycling")}


def spec_bench_markdown(run: dict, leaderboard: dict | None = None, forecasts_only: bool = False) -> str:
    """The Spec-Bench run as the benchmarks page shows it: per temperature, one table of tokens
    per target pass (and the first draft's acceptance) and one of speedups over ``ll.generate``
    with their spread over the runs, a column per task and one for all six; where the rows carry
    the cost model's forecasts, one table of forecast against the first run's speedup; then the
    leaderboard's figures (``spec_bench.LEADERBOARD_A100_VICUNA_7B``) beside our T = 0 overall
    for the methods both have. ``forecasts_only``: the forecast tables alone. Under a forecast
    table whose rows also carry the price of their own passes, a line counts the task rows each
    comes within 10% of (``forecast_errors``)."""
    from ..spec_bench import LEADERBOARD_A100_VICUNA_7B, TASKS

    leaderboard = LEADERBOARD_A100_VICUNA_7B if leaderboard is None else leaderboard
    cells = spec_bench_cells(run)
    tasks = [t for t in TASKS if any(t in by_task for by_task in cells.values())]
    head = "| drafter | " + " | ".join(tasks) + " | all tasks |\n|:---|" + "---:|" * (len(tasks) + 1)
    runs = run.get("runs", 1)
    parts, ours = [f"Machine: {run['machine']}; {runs} run{'s' if runs != 1 else ''}."], {}
    for temperature in sorted({t for t, _ in cells}):
        baseline = [cells[(temperature, "ll.generate")][t] for t in tasks]
        per_call, speed, forecast, priced = [head], [head], [head], False
        for (t, method), by_task in cells.items():
            if t != temperature or method == "ll.generate":
                continue
            rows = [by_task[task] for task in tasks]
            calls, ratio, runs = overall(rows, baseline)
            ours[(temperature, method)] = (calls, ratio)
            per_call.append(f"| {method} | " + " | ".join(f"{r['per_call']:.2f} ({first_kept(r)})" for r in rows)
                            + f" | {calls:.2f} |")
            speed.append(f"| {method} | " + " | ".join(reading(r)[0] for r in rows) + f" | {ratio:.2f}x"
                         + (f" [{min(runs):.2f}-{max(runs):.2f}]" if len(runs) > 1 else "") + " |")
            if overall_forecast(rows, baseline):
                forecast.append(forecast_line(method, rows, baseline))
                priced = priced or overall_forecast(rows, baseline, "own") is not None
        if not forecasts_only:
            parts.append(f"### T = {temperature:g}: tokens per target pass (first draft kept)\n\n" + "\n".join(per_call))
            parts.append(f"### T = {temperature:g}: speed over ll.generate (median [lowest-highest run])\n\n"
                         + "\n".join(speed))
        if len(forecast) > 1:
            middle = " / its price of the run's own passes" if priced else ""
            parts.append(f"### T = {temperature:g}: the cost model's forecast{middle} / the first run's speed\n\n"
                         + "\n".join(forecast) + (forecast_errors(cells, temperature, tasks) if priced else ""))
    if forecasts_only:
        return "\n\n".join(parts) + "\n"
    board = ["| the leaderboard's method | its tokens per call | its speedup | our nearest row | "
             "our tokens per pass, T = 0 | our speedup, T = 0 |", "|:---|---:|---:|:---|---:|---:|"]
    for name, (calls, ratio) in leaderboard.items():
        mine = next(((m, v) for prefix in SPEC_BENCH_NEAREST.get(name, ())
                     for (t, m), v in ours.items() if t == 0 and m.startswith(prefix)), None)
        board.append(f"| {name} | {calls:.2f} | {ratio:.2f}x | " + (f"{mine[0]} | {mine[1][0]:.2f} | {mine[1][1]:.2f}x |"
                                                                   if mine else "none here | | |"))
    parts.append("### The leaderboard beside ours (Vicuna-7B on an A100; ours SmolLM2-135M, the run above)\n\n"
                 + "\n".join(board))
    return "\n\n".join(parts) + "\n"


def gpu_pass_costs() -> dict:
    """The H100 measurements: ``pass_seconds[dtype][n]`` (n as a string) and ``c_draft_model_float32``."""
    return json.loads((DATA / "gpu_pass_costs_h100.json").read_text())


def gpu_speed() -> dict:
    """The H200 run: ``info`` (device, versions), ``settings``, ``measurements`` (``decode_step_ms``,
    ``c_draft_model``, ``v_n``) and ``rows`` (one per contender and temperature, with
    ``ratio_over_ll_generate``, and for a drafter ``tokens_per_target_call``, ``alpha``,
    ``verify_call_ms``: recorded by a script that is not in the repository, apart from the timed runs,
    and longer than a whole call of the draft model with one draft at T = 0; chapter 13 does not use it)."""
    return json.loads((DATA / "gpu_speed_h200.json").read_text())
