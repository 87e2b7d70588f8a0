"""The benchmark runs and prints its table (its numbers are reported, never asserted)."""

import json

from logitlab import bench


def test_bench_prints_a_table_and_writes_json(capsys, tmp_path):
    out_file = tmp_path / "bench.json"
    bench.main(["--skip-load", "--skip-generate", "--skip-speculative", "--json", str(out_file)])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and " ms |" in line]
    assert len(rows) == 16  # 8 sampling rows, then 8 of batch sampling, tree scoring and beam search
    saved = json.loads(out_file.read_text())
    assert len(saved["rows"]) == 16 and all(r["seconds"] > 0 for r in saved["rows"])


def test_speculative_rows_run_on_a_small_setting():
    import logitlab as ll

    model, tokenizer = ll.load("smollm2-135m", device="cpu")
    table = bench.Table()
    bench.bench_speculative(table, model, tokenizer, new_tokens=12, gamma=3, repeat=1)
    assert len(table.rows) == 6 and all(r["seconds"] > 0 for r in table.rows)
