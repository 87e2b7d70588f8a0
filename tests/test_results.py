"""The measurements the library ships (logitlab.measure.results): the bench run that chapter 13 and the
benchmarks page read, and the GPU pass costs."""

import re
from pathlib import Path

import pytest

from logitlab.measure import results

ROOT = Path(__file__).resolve().parents[1]


def test_the_benchmarks_page_shows_the_shipped_run():
    # After shipping a new run: ll.results.write_into_page("book/benchmarks.md") rewrites the tables.
    text = (ROOT / "book" / "benchmarks.md").read_text()
    block = text[text.index(results.PAGE_BEGIN) + len(results.PAGE_BEGIN):text.index(results.PAGE_END)]
    assert block.strip() == results.run_markdown(results.bench_run()).strip(), \
        "book/benchmarks.md is stale: run ll.results.write_into_page('book/benchmarks.md')"


def test_the_prose_about_the_run_quotes_the_run():
    # Every ratio the page's reading of the run quotes ("1.23x") is in the run's tables (a
    # measured ratio, or a forecast in a row's label).
    # (The summary's note on run-to-run spread may also quote the earlier runs' page.)
    text = (ROOT / "book" / "benchmarks.md").read_text()
    reading = text[text.index("## Summary"):text.index(results.PAGE_BEGIN)]
    quoted = set(re.findall(r"(\d+\.\d\d)x", reading))
    earlier = (ROOT / "book" / "benchmark_history.md").read_text()
    tables = (results.run_markdown(results.bench_run()) + results.spec_bench_markdown(results.spec_bench_run())
              + results.spec_bench_markdown(results.training_free_run())
              + results.spec_bench_markdown(results.eagle_retrained_run())
              + results.spec_bench_markdown(results.costmodel_run(), forecasts_only=True))
    measured = set(re.findall(r"(\d+\.\d\d)x", tables + earlier))
    assert quoted and quoted <= measured, f"ratios quoted but not in the run: {sorted(quoted - measured)}"
    assert text.index("## Summary") < text.index(results.PAGE_BEGIN)  # the reading comes first


def test_the_shipped_run_is_one_whole_run():
    run = results.bench_run()
    sections = list(dict.fromkeys(r["section"] for r in run["rows"]))
    # Every section of the bench, in the order of the book (llama.cpp rows only where it is installed),
    # except those added since the shipped run was taken, named here until a new run is shipped.
    from logitlab.bench.run import SECTIONS

    apart = {"spec_bench", "watermarks"}  # each ships in a file of its own, run three times (tests below)
    assert sections == [title for key, title in SECTIONS.items() if key not in apart]
    assert all(r["seconds"] > 0 for r in run["rows"]) and "threads" in run["machine"]


def test_the_shipped_spec_bench_run_is_three_runs_of_every_drafter_on_every_task():
    from logitlab.bench.run import SECTIONS
    from logitlab.spec_bench import TASKS

    run = results.spec_bench_run()
    assert run["runs"] == 3 and {r["section"] for r in run["rows"]} == {SECTIONS["spec_bench"]}
    assert all(len(r["seconds_runs"]) == 3 and (r["ratio"] is None or len(r["ratios"]) == 3) for r in run["rows"])
    cells = results.spec_bench_cells(run)
    methods = {m for _, m in cells}
    assert len(methods) == 7 and {t for t, _ in cells} == {0.0, 1.0}  # ll.generate and six drafters
    assert all(set(by_task) == set(TASKS) for by_task in cells.values())
    assert all(row["per_call"] >= 1 for by_task in cells.values() for row in by_task.values() if row["per_call"])


def test_the_benchmarks_page_shows_the_shipped_spec_bench_run():
    text = (ROOT / "book" / "benchmarks.md").read_text()
    block = text[text.index(results.SPEC_BENCH_BEGIN) + len(results.SPEC_BENCH_BEGIN):text.index(results.SPEC_BENCH_END)]
    assert block.strip() == results.spec_bench_markdown(results.spec_bench_run()).strip(), \
        "book/benchmarks.md is stale: run ll.results.write_into_page('book/benchmarks.md')"


def test_the_shipped_training_free_run_is_three_runs_of_those_drafters_on_every_task():
    from logitlab.spec_bench import TASKS

    run = results.training_free_run()
    assert run["runs"] == 3 and all(len(r["seconds_runs"]) == 3 for r in run["rows"])
    cells = results.spec_bench_cells(run)
    assert {m.split(" (")[0] for _, m in cells} == {"ll.generate", "prompt lookup", "suffix automaton",
                                                     "Token Recycling", "suffix match else Token Recycling",
                                                     "Token Recycling, table warmed on 40 other prompts"}
    assert {t for t, _ in cells} == {0.0, 1.0} and all(set(by) == set(TASKS) for by in cells.values())
    text = (ROOT / "book" / "benchmarks.md").read_text()
    block = text[text.index(results.FREE_BEGIN) + len(results.FREE_BEGIN):text.index(results.FREE_END)]
    assert block.strip() == results.spec_bench_markdown(run).strip(), \
        "book/benchmarks.md is stale: run ll.results.write_into_page('book/benchmarks.md')"


def test_the_leaderboards_token_recycling_is_set_beside_a_warmed_table_where_the_run_has_one():
    # The leaderboard's Token Recycling keeps its table across queries: the warmed 8-node row, not
    # the empty table's (which comes first in the run); a run without warmed rows gets the empty one.
    board = {"Token Recycling": (2.73, 2.22)}
    run = results.training_free_run()
    line = next(l for l in results.spec_bench_markdown(run, leaderboard=board).splitlines() if l.startswith("| Token Recycling | 2.73"))
    assert "| Token Recycling, table warmed on 40 other prompts (8-node tree, depth <= 6) |" in line, line
    cold = dict(run, rows=[r for r in run["rows"] if "warmed" not in r["measurement"]])
    line = next(l for l in results.spec_bench_markdown(cold, leaderboard=board).splitlines() if l.startswith("| Token Recycling | 2.73"))
    assert "| Token Recycling (8-node tree, depth <= 6) |" in line, line


def test_the_shipped_retrained_eagle_run_is_three_runs_of_its_chain_and_tree_on_every_task():
    from logitlab.spec_bench import TASKS

    run = results.eagle_retrained_run()
    assert run["runs"] == 3 and all(len(r["seconds_runs"]) == 3 for r in run["rows"])
    cells = results.spec_bench_cells(run)
    assert {m for _, m in cells} == {"ll.generate", "EAGLE chain (gamma=3)", "EAGLE tree (top_k=3, 10 nodes, depth 4)"}
    assert {t for t, _ in cells} == {0.0, 1.0} and all(set(by) == set(TASKS) for by in cells.values())
    text = (ROOT / "book" / "benchmarks.md").read_text()
    block = text[text.index(results.EAGLE_BEGIN) + len(results.EAGLE_BEGIN):text.index(results.EAGLE_END)]
    assert block.strip() == results.spec_bench_markdown(run).strip(), \
        "book/benchmarks.md is stale: run ll.results.write_into_page('book/benchmarks.md')"


def test_the_shipped_watermark_run_is_three_runs_of_every_mark():
    from logitlab.bench.run import SECTIONS

    run = results.watermark_run()
    assert run["runs"] == 3 and {r["section"] for r in run["rows"]} == {SECTIONS["watermarks"]}
    assert [r["measurement"].split(" (")[0] for r in run["rows"]] == [
        "watermarks: ll.generate, 2 prompts, 128 tokens each, T=1", "watermarks: green list, delta 2",
        "watermarks: Gumbel-max", "watermarks: tournament, 30 rounds", "watermarks: draft model, gamma=3",
        "watermarks: keyed speculative sampling, gamma=3"]
    assert all(len(r["seconds_runs"]) == 3 and (r["ratio"] is None or len(r["ratios"]) == 3) for r in run["rows"])
    text = (ROOT / "book" / "benchmarks.md").read_text()
    block = text[text.index(results.MARKS_BEGIN) + len(results.MARKS_BEGIN):text.index(results.MARKS_END)]
    assert block.strip() == results.run_markdown(run).strip(), \
        "book/benchmarks.md is stale: run ll.results.write_into_page('book/benchmarks.md')"


def test_find_row_wants_exactly_one_match():
    rows = [{"measurement": "a b"}, {"measurement": "a c"}]
    assert results.find_row(rows, "b$") is rows[0]
    with pytest.raises(ValueError, match="matches 2 rows"):
        results.find_row(rows, "^a")
    with pytest.raises(ValueError, match="matches 0 rows"):
        results.find_row(rows, "z")


def test_run_markdown_groups_rows_by_section(tmp_path):
    run = {"machine": "m", "rows": [
        {"measurement": "x", "seconds": 0.5, "ratio": None, "against": "", "section": "One"},
        {"measurement": "y", "seconds": 0.25, "ratio": 2.0, "against": "faster than x", "section": "Two"}]}
    text = results.run_markdown(run)
    assert text.startswith("Machine: m.") and "### One" in text and "### Two" in text
    assert text.index("| x |  | 500.0 ms |") < text.index("### Two") < text.index("| y |  | 250.0 ms | 2.00x |  | x |")
    page = tmp_path / "page.md"
    page.write_text(f"head\n{results.PAGE_BEGIN}\nold\n{results.PAGE_END}\nmiddle\n"
                    f"{results.SPEC_BENCH_BEGIN}\nolder\n{results.SPEC_BENCH_END}\ntail\n")
    spec_bench = {"machine": "m", "runs": 2, "rows": spec_bench_rows()}
    results.write_into_page(page, run, spec_bench)
    written = page.read_text()
    assert "old" not in written and text in written and written.endswith("tail\n") and "middle" in written
    assert results.spec_bench_markdown(spec_bench) in written and "older" not in written


def test_gpu_pass_costs_cover_the_sizes_chapter_11_reads():
    gpu = results.gpu_pass_costs()
    for dtype in ("float32", "bfloat16"):
        assert all(str(n) in gpu["pass_seconds"][dtype] for n in (1, 2, 4, 8, 16))
    assert 0 < gpu["c_draft_model_float32"] < 1


def test_every_ratio_on_the_page_reads_one_way():
    # A speed is the row's method over the other (above 1: faster), whichever way the bench
    # wrote it; a cost is in units of something else; a baseline has neither.
    row = lambda ratio, against: {"measurement": "m", "ratio": ratio, "against": against}
    assert results.reading(row(2.0, "faster than x")) == ("2.00x", "", "x")
    assert results.reading(row(2.0, "slower than ours, same algorithm")) == ("0.50x", "", "ours, same algorithm")
    assert results.reading(row(1.5, "decode steps")) == ("", "1.50", "decode steps")
    assert results.reading(row(None, "")) == ("", "", "")
    # Several runs: the median, then the lowest and highest run, read the same way.
    runs = lambda ratio, against, ratios: dict(row(ratio, against), ratios=ratios)
    assert results.reading(runs(1.1, "faster than x", [1.0, 1.1, 1.3])) == ("1.10x [1.00-1.30]", "", "x")
    assert results.reading(runs(2.0, "slower than y", [2.0, 4.0, 1.0])) == ("0.50x [0.25-1.00]", "", "y")
    assert results.reading(runs(1.5, "decode steps", [1.4, 1.5, 1.6])) == ("", "1.50 [1.40-1.60]", "decode steps")
    assert results.reading(runs(1.5, "decode steps", [1.5])) == ("", "1.50", "decode steps")
    assert results.split_label("draft model (gamma=1, c=0.04), 2 prompts, T=0") == ("draft model", "(gamma=1, c=0.04), 2 prompts, T=0")
    assert results.split_label("pass over 2 new tokens, fast path (v(2))") == ("pass over 2 new tokens", "fast path (v(2))")
    assert results.split_label("plain") == ("plain", "")
    # Every row of the shipped run reads as a speed, a cost or a baseline, and no speed row keeps
    # the word "slower" in what it is compared with.
    for r in results.bench_run()["rows"]:
        speed, cost, relative = results.reading(r)
        assert (r["ratio"] is None) == (not speed and not cost) and not (speed and cost)
        assert not relative.startswith(("slower", "faster"))


def test_spec_bench_forecasts_are_read_and_set_against_the_first_run():
    rows = spec_bench_rows()
    for r, predicted in zip(rows[1::2], ("1.60", "1.20")):
        r["measurement"] = r["measurement"].replace("target pass, ", f"target pass, predicted {predicted}x, ")
    cells = results.spec_bench_cells({"rows": rows})
    mine, base = (list(cells[(0.0, m)].values()) for m in ("EAGLE chain (gamma=3)", "ll.generate"))
    assert [r["predicted"] for r in mine] == [1.6, 1.2]
    # First run: translation 4 s against 2 s (2.00x), QA 3 s against 3 s (1.00x), 7 s against 5 s in
    # all; forecast times 4 / 1.6 + 3 / 1.2 = 5 s, so 1.40x forecast over both tasks.
    assert results.overall_forecast(mine, base) == pytest.approx(1.4)
    per_task, whole = results.first_run_speeds(mine, base)
    assert per_task == pytest.approx([2.0, 1.0]) and whole == pytest.approx(7 / 5)
    text = results.spec_bench_markdown({"machine": "m", "runs": 2, "rows": rows}, leaderboard={})
    assert "### T = 0: the cost model's forecast / the first run's speed" in text
    assert "| EAGLE chain (gamma=3) | 1.60x / 2.00x | 1.20x / 1.00x | 1.40x / 1.40x |" in text


def test_spec_bench_prices_of_the_runs_own_passes_are_read_and_tabled_beside_the_forecast():
    rows = spec_bench_rows()
    for r, predicted, own in zip(rows[1::2], ("1.60", "1.20"), ("2.10", "0.75")):
        r["measurement"] = r["measurement"].replace(
            "target pass, ", f"target pass, predicted {predicted}x, {own}x at its own passes, ")
    cells = results.spec_bench_cells({"rows": rows})
    mine, base = (list(cells[(0.0, m)].values()) for m in ("EAGLE chain (gamma=3)", "ll.generate"))
    assert [(r["predicted"], r["own"], r["per_call"], r["first_kept"]) for r in mine] == [
        (1.6, 2.1, 2.0, 0.5), (1.2, 0.75, 1.0, 0.5)]
    # Priced times 4 / 2.1 + 3 / 0.75 against ll.generate's 4 + 3 seconds of the first run.
    assert results.overall_forecast(mine, base, "own") == pytest.approx(7 / (4 / 2.1 + 3 / 0.75))
    text = results.spec_bench_markdown({"machine": "m", "runs": 2, "rows": rows}, leaderboard={})
    assert ("### T = 0: the cost model's forecast / its price of the run's own passes / the first run's speed"
            in text)
    assert "| EAGLE chain (gamma=3) | 1.60x / 2.10x / 2.00x | 1.20x / 0.75x / 1.00x | 1.40x / 1.19x / 1.40x |" in text
    assert all(r["own"] is None for r in results.spec_bench_cells({"rows": spec_bench_rows()})[
        (0.0, "EAGLE chain (gamma=3)")].values())  # an older run's rows


def test_the_shipped_cost_model_run_prices_every_drafting_row_from_its_own_passes():
    from logitlab.spec_bench import TASKS

    run = results.costmodel_run()
    cells = results.spec_bench_cells(run)
    assert {t for t, _ in cells} == {0.0, 1.0} and all(set(by) == set(TASKS) for by in cells.values())
    drafting = [r for (t, m), by in cells.items() if m != "ll.generate" for r in by.values()]
    assert len(drafting) == 2 * 6 * 6 and all(r["own"] and r["predicted"] for r in drafting)
    text = (ROOT / "book" / "benchmarks.md").read_text()
    block = text[text.index(results.COST_BEGIN) + len(results.COST_BEGIN):text.index(results.COST_END)]
    assert block.strip() == results.spec_bench_markdown(run, forecasts_only=True).strip(), \
        "book/benchmarks.md is stale: run ll.results.write_into_page('book/benchmarks.md')"
    # The page's claims: the counts of task rows within 10%, printed under each table.
    assert "the forecast on 15 of 36 task rows (root-mean-square error 21%); the price of the row's own passes " \
           "on 33 of 36 task rows (root-mean-square error 6%)" in block
    assert "the forecast on 21 of 36 task rows (root-mean-square error 15%); the price of the row's own passes " \
           "on 29 of 36 task rows (root-mean-square error 8%)" in block
    assert "tokens per target pass (first draft kept)" not in block and "leaderboard" not in block


def spec_bench_rows(tasks=("translation", "question answering")):
    """Two tasks at T = 0, ll.generate and one drafter, two runs each."""
    rows = []
    for task, (ar, mine, per_call) in zip(tasks, [((4.0, 6.0), (2.0, 4.0), "2.00"), ((3.0, 3.0), (3.0, 2.0), "1.00")]):
        name = f"2 Spec-Bench {task} prompts, 128 tokens each, T=0"
        rows.append(dict(measurement=f"ll.generate, {name}", seconds=sum(ar) / 2, ratio=None, against="",
                         seconds_runs=list(ar), ratios=None, section="S"))
        rows.append(dict(measurement=f"EAGLE chain (gamma=3) ({per_call} tokens per target pass, accepted by "
                                     f"position 0.50/0.25/0.10), {name}", seconds=sum(mine) / 2,
                         ratio=(ar[0] / mine[0] + ar[1] / mine[1]) / 2, against="faster than our AR loop",
                         seconds_runs=list(mine), ratios=[a / m for a, m in zip(ar, mine)], section="S"))
    return rows


def test_spec_bench_tables_read_every_row_and_sum_the_tasks():
    run = {"machine": "m", "runs": 2, "rows": spec_bench_rows()}
    cells = results.spec_bench_cells(run)
    assert set(cells) == {(0.0, "ll.generate"), (0.0, "EAGLE chain (gamma=3)")}
    row = cells[(0.0, "EAGLE chain (gamma=3)")]["translation"]
    assert row["per_call"] == 2.0 and row["first_kept"] == 0.5 and row["predicted"] is None  # a run without forecasts
    # All tasks: 2 x 128 tokens at 2 and at 1 token per pass = 128 + 256 passes: 512 / 384 tokens per
    # pass; ll.generate's 5 + 3 seconds over the drafter's 3 + 2.5, and per run 7/5 and 9/6.
    per_call, ratio, runs = results.overall(list(cells[(0.0, "EAGLE chain (gamma=3)")].values()),
                                            list(cells[(0.0, "ll.generate")].values()))
    assert per_call == pytest.approx(512 / 384) and ratio == pytest.approx(1.45)  # the median of the runs
    assert runs == pytest.approx([7 / 5, 9 / 6])
    text = results.spec_bench_markdown(run, leaderboard={"EAGLE": (3.58, 2.10), "Hydra": (3.26, 2.07)})
    assert "| EAGLE chain (gamma=3) | 2.00 (0.50) | 1.00 (0.50) | 1.33 |" in text
    assert "| 1.45x [1.40-1.50] |" in text
    assert "| EAGLE | 3.58 | 2.10x | EAGLE chain (gamma=3) | 1.33 | 1.45x |" in text
    assert "| Hydra | 3.26 | 2.07x | none here | | |" in text
    assert "forecast" not in text and results.overall_forecast(list(cells[(0.0, "EAGLE chain (gamma=3)")].values()),
                                                                 list(cells[(0.0, "ll.generate")].values())) is None
    none = dict(spec_bench_rows()[1], measurement="prompt lookup (gamma=5) (1.00 tokens per target pass, no drafts "
                                                   "proposed), 2 Spec-Bench translation prompts, 128 tokens each, T=1")
    assert results.spec_bench_cells({"rows": [none]})[(1.0, "prompt lookup (gamma=5)")]["translation"]["first_kept"] is None
    forecast = dict(spec_bench_rows()[1], measurement="suffix automaton (gamma=5) (1.70 tokens per target pass, "
                                                       "predicted 1.52x, accepted by position 0.40/0.30), 2 Spec-Bench "
                                                       "translation prompts, 128 tokens each, T=0")
    row = results.spec_bench_cells({"rows": [forecast]})[(0.0, "suffix automaton (gamma=5)")]["translation"]
    assert (row["per_call"], row["predicted"], row["first_kept"]) == (1.70, 1.52, 0.40)
    quiet = forecast["measurement"].replace("accepted by position 0.40/0.30", "no drafts proposed")
    assert results.spec_bench_cells({"rows": [dict(forecast, measurement=quiet)]})[
        (0.0, "suffix automaton (gamma=5)")]["translation"]["predicted"] == 1.52
    bad = dict(spec_bench_rows()[0], measurement="ll.generate, 2 Spec-Bench prompts of a new kind")
    with pytest.raises(ValueError, match="unknown form"):
        results.spec_bench_cells({"machine": "m", "rows": [bad]})
