"""The benchmark runs and prints its table (its numbers are reported, never asserted)."""

import json
import re

import pytest
import torch

from logitlab import bench
from logitlab.measure import timing


@pytest.fixture
def small(monkeypatch, smollm):
    """The real model, with one prompt per prompt list and no warm-up round: the rows' code runs
    whole (every contender, the calibration, the checks that the greedy tokens agree) in a
    fraction of the time. This checks the rows, not the times."""
    from logitlab.bench import costmodel, drafting

    for name in ("DRAFT_PROMPTS", "CALIBRATION", "GROUNDED", "CALIBRATION_GROUNDED", "OPEN_ENDED"):
        monkeypatch.setattr(drafting, name, getattr(drafting, name)[:1])
    monkeypatch.setattr(drafting, "interleaved_median_times",
                        lambda fns, repeat=1, warmup=0: timing.interleaved_median_times(fns, repeat=1, warmup=0))
    # The cost model's v(n) from one timed pass of each size, none to warm up (5 and 2 otherwise):
    # its passes took half of the Spec-Bench rows' test.
    monkeypatch.setattr(costmodel, "pass_times", lambda model, context, sizes, rounds: timing.pass_times(model, context, sizes, 1))
    monkeypatch.setattr(timing, "WARMUP_ROUNDS", 0)
    return smollm


@pytest.fixture(autouse=True)
def forgotten(monkeypatch):
    """The folders whose remembered kernel choices the bench asked to delete; none is deleted, so
    that the other tests' loads keep their kernels."""
    from logitlab import fast_cpu

    folders = []
    monkeypatch.setattr(fast_cpu, "forget_choices", lambda folder: folders.append(folder) or [])
    return folders


@pytest.mark.slow
def test_bench_prints_a_table_and_writes_json(capsys, tmp_path, monkeypatch):
    from logitlab.bench import basics

    # One timed run per contender and no warm-up: this checks the command, not the times.
    monkeypatch.setattr(basics, "interleaved_median_times",
                        lambda fns, repeat=1, warmup=0: timing.interleaved_median_times(fns, repeat=1, warmup=0))
    monkeypatch.setattr(basics, "median_time", lambda fn, repeat=1, warmup=0: timing.median_time(fn, 1, 0))
    out_file = tmp_path / "bench.json"
    bench.main(["--skip-load", "--skip-verification", "--skip-generate", "--skip-speculative", "--skip-typical", "--skip-eagle", "--skip-pass", "--skip-spec-bench", "--skip-constrained", "--skip-watermarks", "--skip-decoders", "--json", str(out_file)])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and " ms |" in line]
    assert len(rows) == 16  # 8 sampling rows, then 8 of batch sampling, tree scoring and beam search
    saved = json.loads(out_file.read_text())
    assert len(saved["rows"]) == 16 and all(r["seconds"] > 0 for r in saved["rows"])


@pytest.mark.slow
def test_speculative_rows_run_on_a_small_setting(small):
    model, tokenizer = small
    table = bench.Table()
    bench.bench_speculative(table, model, tokenizer, new_tokens=12, gamma=3, repeat=1)
    assert len(table.rows) == 6 and all(r["seconds"] > 0 for r in table.rows)


@pytest.mark.slow
def test_draft_model_rows_run_on_a_small_setting(small):
    model, tokenizer = small
    table = bench.Table()
    bench.bench_draft_model(table, model, tokenizer, new_tokens=8, gammas=(1, 2), repeat=1)
    assert len(table.rows) == 5 and all(r["seconds"] > 0 for r in table.rows)
    for row in (table.rows[1], table.rows[4]):  # the speculative row at T = 0 and at T = 1
        # The gamma it ran is the one with the highest forecast of the two it printed.
        label = row["measurement"]
        forecasts = {int(g): float(x) for g, x in re.findall(r"(\d): (\d+\.\d+)x", label)}
        assert set(forecasts) == {1, 2} and f"gamma={max(forecasts, key=forecasts.get)}," in label
        assert f"predicted {max(forecasts.values()):.2f}x" in label and row["ratio"] > 0


def test_pass_log_records_every_pass_of_a_speculative_run():
    import logitlab as ll
    from logitlab.bench import costmodel

    target, draft = ll.toy_model(vocab_size=6, seed=0), ll.toy_model(vocab_size=6, seed=1)
    with costmodel.PassLog(target) as log:
        result = ll.speculative_generate(target, ll.speculative.draft_model.DraftModelDrafter(draft), [[1, 2]], gamma=3,
                                         max_new_tokens=10, temperature=0, eos_token_id=[])
    # The prefill over the prompt, then one pass per call over the pending token and its drafts;
    # the draft model's own passes are not the target's.
    assert log.sizes == [2] + [g + 1 for g in result.drafted]
    with costmodel.PassLog(target) as log:
        ll.generate(target, [[1, 2]], max_new_tokens=4, temperature=0, eos_token_id=[])
    assert log.sizes == [2, 1, 1, 1]
    target(torch.tensor([[1]]))
    assert log.sizes == [2, 1, 1, 1]  # closed: no longer recording


def test_cost_model_prices_passes_at_the_measured_v_and_adds_the_drafter_time(monkeypatch):
    from logitlab.bench import costmodel

    # Two runs of 12 tokens: one with four passes over 3 tokens and 0.5 s of drafting, one with
    # twelve single-token passes. A decode step takes 0.25 s and a pass over 3 tokens 0.3 s.
    calibration = {"spec": (12, [3, 3, 3, 3], 0.5), "plain": (12, [1] * 12, 0.0)}
    monkeypatch.setattr(costmodel, "pass_times", lambda model, context, sizes, rounds: (
        {1: [0.2, 0.25, 0.3], 3: [0.3, 0.3, 0.3]} if list(sizes) == [1, 3] else pytest.fail(f"sizes {sizes}")))
    predicted = costmodel.predicted_speedups(None, calibration, [1, 2, 3])
    assert predicted["spec"] == pytest.approx(12 / (4 * 1.2 + 0.5 / 0.25))
    assert predicted["plain"] == pytest.approx(1.0)


def test_timed_runs_record_the_last_rounds_passes_and_own_price_prices_them(monkeypatch):
    import logitlab as ll
    from logitlab.bench import drafting
    from logitlab.speculative.draft_model import DraftModelDrafter

    target, draft = ll.toy_model(vocab_size=5, order=2, seed=0), ll.toy_model(vocab_size=5, order=3, seed=9)
    common = dict(max_new_tokens=6, temperature=1.0, eos_token_id=[])
    runs = {"ll.generate": lambda ids, g: ll.generate(target, ids, generator=g, **common),
            "spec": lambda ids, g: ll.speculative_generate(target, DraftModelDrafter(draft), ids, gamma=2, generator=g,
                                                           **common)}
    prompts = [torch.tensor([[1, 2, 3]]), torch.tensor([[4, 0]])]
    passes = {}
    times, results = drafting.timed_runs(target, runs, prompts, repeat=2, warmup=1, passes=passes)
    # One round's passes (not the three rounds'), each prompt's prefill left out: plain decoding's
    # five one-token steps after the prefill, and the speculative loop's passes as it records them.
    assert passes["ll.generate"] == [1] * 5 * 2
    assert passes["spec"] == [n for r in results["spec"] for n in r.fed] and max(passes["spec"]) == 3
    monkeypatch.setattr(drafting, "predicted_speedups", lambda model, seen, context: seen)
    seen = drafting.own_price(target, [1, 2])(results, passes)
    assert list(seen) == ["spec"]  # the baseline is not priced
    tokens, sizes, drafting_seconds = seen["spec"]
    assert tokens == 12 and sizes == passes["spec"]
    assert drafting_seconds == pytest.approx(sum(r.draft_seconds for r in results["spec"])) and drafting_seconds > 0
    # A drafter whose drafts are passes of the target (PaSS) adds no time of its own.
    assert drafting.own_price(target, [1, 2], target_drafts=("spec",))(results, passes)["spec"][2] == 0.0


def test_forward_seconds_times_decode_and_verification_passes_on_the_toy_model():
    import logitlab as ll

    model = ll.toy_model(vocab_size=5)
    seen = []  # (cached length, new tokens) at every pass
    forward = model.forward

    def recording(*args, past_key_values=None, input_ids=None, **kwargs):
        seen.append((0 if past_key_values is None else past_key_values.get_seq_length(), input_ids.shape[1]))
        return forward(*args, past_key_values=past_key_values, input_ids=input_ids, **kwargs)

    model.forward = recording
    assert timing.forward_seconds(model, [1, 2, 3], 1, repeat=3) > 0
    assert timing.forward_seconds(model, [1, 2, 3], 4, repeat=3) > 0
    # Each call: a prefill of the context, then 2 + 3 passes (two warm up: on a GPU the second
    # records the pass), every one on exactly the context.
    assert timing.WARMUP_ROUNDS == 2
    assert seen == [(0, 3)] + [(3, 1)] * 5 + [(0, 3)] + [(3, 4)] * 5


@pytest.mark.slow
def test_typical_rows_run_on_a_small_setting(small):
    model, tokenizer = small
    table = bench.Table()
    bench.bench_typical(table, model, tokenizer, new_tokens=8, temperatures=(0.0, 1.0), repeat=1)
    assert len(table.rows) == 4 + 5 and all(r["seconds"] > 0 for r in table.rows)
    assert "tree (3, 2, 1)" in table.rows[3]["measurement"] and "typical" in table.rows[8]["measurement"]


@pytest.mark.slow
def test_eagle_rows_run_on_a_small_setting(small):
    model, tokenizer = small
    table = bench.Table()
    bench.bench_eagle(table, model, tokenizer, new_tokens=8, tree=dict(top_k=2, nodes=4), depth=2,
                      temperatures=(0.0, 1.0), repeat=1)
    assert len(table.rows) == 3 + 5 and all(r["seconds"] > 0 for r in table.rows)
    assert "tree (top_k=2, 4 nodes, depth 2)" in table.rows[2]["measurement"]
    assert "typical" in table.rows[7]["measurement"]
    by_position = re.search(r"accepted by position ([\d.]+)/([\d.]+)\)", table.rows[2]["measurement"])
    assert by_position and all(0 <= float(a) <= 1 for a in by_position.groups())


@pytest.mark.slow
def test_pass_rows_run_on_a_small_setting(small):
    model, tokenizer = small
    table = bench.Table()
    bench.bench_pass(table, model, tokenizer, new_tokens=8, ks=(1, 3), single_ks=(2,), temperatures=(0.0,), repeat=1)
    assert len(table.rows) == 1 + 2 + 2 and all(r["seconds"] > 0 for r in table.rows)
    assert "k=3" in table.rows[2]["measurement"] and "likely" in table.rows[4]["measurement"]
    assert "tokens per target pass" in table.rows[1]["measurement"]


def test_spec_bench_forecasts_price_passes_once_and_skip_the_baseline(monkeypatch):
    from logitlab.bench import spec_bench

    seen = []

    def calibrate(model, runs, prompts, drafter_seconds=lambda result: result.draft_seconds):
        class Result:
            draft_seconds = 2.0
        seen.append((sorted(runs), drafter_seconds(Result())))
        return {label: (10, [2] * 5, drafter_seconds(Result())) for label in runs}

    monkeypatch.setattr(spec_bench, "calibrate", calibrate)
    monkeypatch.setattr(spec_bench, "predicted_speedups", lambda model, seen, context: dict(seen))
    runs = {"ll.generate": None, "prompt lookup (gamma=5)": None, spec_bench.PASS: None}
    got = spec_bench.forecasts(None, runs, held_out=[[1, 2]], context=[1] * 8)
    # ll.generate is not forecast; PaSS's drafting passes are target passes, priced once (no drafter time).
    assert seen == [(["prompt lookup (gamma=5)"], 2.0), ([spec_bench.PASS], 0.0)]
    assert set(got) == {"prompt lookup (gamma=5)", spec_bench.PASS} and got[spec_bench.PASS][2] == 0.0


@pytest.mark.slow
def test_spec_bench_rows_give_every_drafter_per_task_and_temperature(small):
    from logitlab.bench.spec_bench import bench_spec_bench

    model, tokenizer = small
    table = bench.Table()
    bench_spec_bench(table, model, tokenizer, per_task=1, new_tokens=8, temperatures=(0.0, 1.0), repeat=1,
                     tasks=["question answering"], warm_prompts=1)  # at T = 0 each drafter must give the greedy tokens
    # (the task of the shortest prompts: on translation's, the prefills and the cost model's passes made it 70 s against 55)
    assert len(table.rows) == 2 * 12 and all(r["seconds"] > 0 for r in table.rows)
    labels = [r["measurement"] for r in table.rows]
    assert all("1 Spec-Bench question answering prompts, 8 tokens each" in label for label in labels)
    assert labels[0].startswith("ll.generate") and labels[12].startswith("ll.generate") and "T=1" in labels[12]
    assert labels[5].startswith("Token Recycling, table warmed on 1 other prompt (8-node tree, depth <= 6) (")
    assert labels[6].startswith("Token Recycling, table warmed on 1 other prompt (24-node tree, depth <= 6) (")
    for label in labels[1:12] + labels[13:]:
        per_call = float(re.search(r"\(([\d.]+) tokens per target pass", label).group(1))
        # PaSS's drafting passes count too: with nothing accepted it makes half a token per pass.
        assert (0.5 if label.startswith("PaSS") else 1) <= per_call <= 8, label
        # the cost model's forecast, calibrated on the task's next question, comes before the acceptance
        # and the price of the row's own passes
        assert re.search(r"tokens per target pass, predicted [\d.]+x, [\d.]+x at its own passes, "
                         r"(accepted by position [\d.]+(/[\d.]+)*|no drafts proposed)\)", label), label
    with pytest.raises(ValueError, match="per_task must be between 1 and 9, got 10"):  # the 10th forecasts
        bench_spec_bench(table, model, tokenizer, per_task=10, tasks=["question answering"])
    with pytest.raises(ValueError, match="task must be one of"):
        bench_spec_bench(table, model, tokenizer, per_task=1, tasks=["poetry"])
    with pytest.raises(ValueError, match="only must be a regular expression"):
        bench_spec_bench(table, model, tokenizer, per_task=1, tasks=["question answering"], only="(")
    with pytest.raises(ValueError, match="warm_prompts must be an int between 1 and 40, got 0"):
        bench_spec_bench(table, model, tokenizer, per_task=1, tasks=["question answering"], only="warmed", warm_prompts=0)
    table = bench.Table()  # only the drafters that need no training, beside ll.generate
    bench_spec_bench(table, model, tokenizer, per_task=1, new_tokens=8, temperatures=(0.0,), repeat=1,
                     tasks=["question answering"], only="lookup|suffix|Recycling", warm_prompts=1)
    assert [r["measurement"].split(" (")[0] for r in table.rows] == [
        "ll.generate, 1 Spec-Bench question answering prompts, 8 tokens each, T=0", "prompt lookup", "suffix automaton",
        "Token Recycling", "suffix match else Token Recycling",
        "Token Recycling, table warmed on 1 other prompt", "Token Recycling, table warmed on 1 other prompt"]


@pytest.mark.slow
def test_decoder_rows_run_on_a_small_setting(small, monkeypatch):
    from logitlab.bench import decoders

    monkeypatch.setattr(decoders, "DRAFT_PROMPTS", decoders.DRAFT_PROMPTS[:1])
    model, tokenizer = small
    table = bench.Table()
    bench.bench_decoders(table, model, tokenizer, new_tokens=6, beams=2, n=3, repeat=1)
    names = [r["measurement"] for r in table.rows]
    # greedy and beam at T=0; plain sampling, eight truncations, best-of-n and a batch at T=1
    assert len(names) == 2 + 1 + len(decoders.TRUNCATIONS) + 2 and all(r["seconds"] > 0 for r in table.rows)
    assert names[1].startswith("decoders: beam search, 2 beams, T=0")
    assert names[3].startswith("decoders: top-k 50 (removes ") and names[-1].startswith("decoders: 3 samples in one")


@pytest.mark.slow
def test_watermark_rows_run_on_a_small_setting(small, monkeypatch):
    from logitlab.bench import watermarks

    monkeypatch.setattr(watermarks, "DRAFT_PROMPTS", watermarks.DRAFT_PROMPTS[:1])
    model, tokenizer = small
    table = bench.Table()
    bench.bench_watermarks(table, model, tokenizer, new_tokens=12, repeat=1)
    names = [r["measurement"] for r in table.rows]
    assert [n.split(" (")[0] for n in names] == [
        "watermarks: ll.generate, 1 prompts, 12 tokens each, T=1", "watermarks: green list, delta 2",
        "watermarks: Gumbel-max", "watermarks: tournament, 30 rounds", "watermarks: draft model, gamma=3",
        "watermarks: keyed speculative sampling, gamma=3"]
    assert re.search(r"\(KL 0\.\d{3} nats per step, found [01] of 1 at p < 0.001\)", names[1])
    assert re.search(r"\(\d\.\d\d tokens per call, found [01] of 1 at p < 0.001\)", names[-1])
    assert all(r["seconds"] > 0 for r in table.rows) and all(r["ratio"] > 0 for r in table.rows[1:])


def test_green_price_is_the_mean_kl_over_the_answer():
    import logitlab as ll
    from logitlab.bench.watermarks import green_price
    from logitlab.watermark import green_list

    model = ll.toy_model(vocab_size=80)
    sequence = torch.tensor([1, 5, 7, 9, 2, 3])
    with torch.no_grad():
        price = green_price(model, sequence, new_tokens=3)
        logp = torch.log_softmax(model(sequence[None]).logits[0, 2:5].float(), -1)
    expected = []
    for row, previous in zip(logp, [7, 9, 2]):
        marked = torch.log_softmax(row + 2.0 * green_list.green_mask(previous, 80), -1)
        expected.append(float((marked.exp() * (marked - row)).sum()))
    assert price == pytest.approx(sum(expected) / 3, rel=1e-5) and price > 0


def test_removed_mass_is_the_probability_outside_the_kept_set():
    import logitlab as ll
    from logitlab.bench.decoders import removed_mass

    model = ll.toy_model(vocab_size=80)
    sequences = [torch.tensor([[1, 5, 7, 9, 2, 3]]), torch.tensor([[4, 4, 8, 1]])]
    removed = removed_mass(model, sequences, new_tokens=3)
    with torch.no_grad():
        logits = torch.cat([model(s).logits[0, -4:-1] for s in sequences])
    probs = torch.softmax(logits, -1)
    top50 = probs.topk(50, dim=-1).values.sum(-1)
    assert removed["top-k 50"] == pytest.approx((1 - top50).mean().item(), abs=1e-6)
    below = probs < 0.1 * probs.max(-1, keepdim=True).values
    assert removed["min-p 0.1"] == pytest.approx((probs * below).sum(-1).mean().item(), abs=1e-6)
    assert 0 < removed["top-k 50"] < 1


def test_a_ratio_below_one_is_reported_as_slower():
    table = bench.Table()
    table.add("a", 1.0, 0.7, "faster than our AR loop")
    table.add("b", 1.0, 1.25, "faster than our AR loop")
    lines = table.markdown().splitlines()
    assert lines[2].endswith("| 0.70x (slower than our AR loop) |")
    assert lines[3].endswith("| 1.25x faster than our AR loop |")
    table.add("c", 1.0, 0.97, "slower than ours, same algorithm")
    assert table.markdown().splitlines()[-1].endswith("| 0.97x (faster than ours, same algorithm) |")
    table.add("d", 1.0, 0.997, "faster than our AR loop")
    assert table.markdown().splitlines()[-1].endswith("| 1.00x (as fast as our AR loop) |")


def test_pass_costs_are_in_decode_steps_and_cover_every_size():
    import logitlab as ll

    model = ll.toy_model(vocab_size=5)
    costs = timing.pass_costs(model, [1, 2, 3], [1, 4, 2], rounds=3)
    assert list(costs) == [1, 4, 2]
    assert costs[1] == 1.0  # the decode step is the unit
    assert all(c > 0 for c in costs.values())


@pytest.mark.slow
def test_verification_rows_run_and_break_a_pass_down():
    import logitlab as ll

    model, tokenizer = ll.load("smollm2-135m", device="cpu")
    stock = ll.load("smollm2-135m", device="cpu", fast=False)[0]
    table = bench.Table()
    parts = bench.bench_verification(table, model, stock, tokenizer, rounds=1)
    assert len(table.rows) == 4 + 2 * (len(bench.verification.SIZES) - 1)
    assert all(r["seconds"] > 0 for r in table.rows)
    assert list(parts) == [1, 8] and "linear 49152x576" in parts[1] and "LlamaAttention" in parts[8]
    markdown = timing.breakdown_table(parts)
    assert markdown.splitlines()[2].startswith("| total |")


def test_forward_breakdown_accounts_for_the_pass_on_the_toy_model():
    import logitlab as ll

    model = ll.toy_model(vocab_size=5)
    parts = timing.forward_breakdown(model, [1, 2, 3], 2, rounds=3)
    assert parts["total"] > 0
    # Each part is a module's own time without its children, so together they fit in the pass.
    assert sum(v for k, v in parts.items() if k != "total") <= parts["total"] * 1.01


def test_read_bandwidth_is_bytes_per_second():
    bandwidth = timing.read_bandwidth(megabytes=64, repeat=3)
    assert 1e8 < bandwidth < 1e13


def test_pass_times_in_turn_times_every_model_and_size_and_leaves_the_caches_at_the_context():
    import logitlab as ll

    models = {"a": ll.toy_model(vocab_size=5), "b": ll.toy_model(vocab_size=5, seed=1)}
    times = timing.pass_times_in_turn(models, [1, 2, 3], [1, 3], rounds=4)
    assert set(times) == {"a", "b"}
    assert all(set(t) == {1, 3} and all(len(v) == 4 and min(v) > 0 for v in t.values()) for t in times.values())
    single = timing.pass_times(models["a"], [1, 2, 3], [2], rounds=2)
    assert set(single) == {2} and len(single[2]) == 2


def test_quick_runs_every_table_with_fewer_settings(monkeypatch, tmp_path, forgotten):
    # No model work: record what each part of the bench is asked to do.
    from types import SimpleNamespace

    from logitlab.bench import run

    calls = {}
    fake = SimpleNamespace(logitlab_fast_cpu={})
    monkeypatch.setattr(run.models, "load", lambda *a, **k: (fake, None))
    monkeypatch.setattr(run, "cached_prefix", lambda tokenizer: [1, 2, 3])
    for name in ["bench_verification", "bench_llama_cpp", "bench_sampling", "bench_generate", "bench_parallel",
                 "bench_speculative", "bench_draft_model", "bench_typical", "bench_eagle", "bench_pass",
                 "bench_spec_bench", "bench_constrained", "bench_watermarks", "bench_decoders"]:
        monkeypatch.setattr(run, name, lambda *a, name=name, **k: calls.setdefault(name, k) and None)
    run.main(["--skip-load", "--quick", "--json", str(tmp_path / "quick.json")])
    assert forgotten == [run.models.cache_dir()]  # the kernels are measured afresh for the bench
    assert set(calls) == {"bench_verification", "bench_llama_cpp", "bench_sampling", "bench_generate", "bench_parallel",
                          "bench_speculative", "bench_draft_model", "bench_typical", "bench_eagle", "bench_pass",
                          "bench_spec_bench", "bench_constrained", "bench_watermarks", "bench_decoders"}
    assert calls["bench_verification"] == {"rounds": 4}
    for name in ["bench_generate", "bench_speculative", "bench_draft_model", "bench_typical", "bench_eagle", "bench_pass",
                 "bench_spec_bench", "bench_constrained", "bench_watermarks", "bench_decoders"]:
        assert calls[name]["repeat"] == 2, name
    assert calls["bench_spec_bench"]["per_task"] == 1
    assert calls["bench_typical"]["temperatures"] == (0.0, 1.0)
    assert calls["bench_pass"]["ks"] == (1, 2, 4, 8) and calls["bench_pass"]["single_ks"] == (1, 2)
    calls.clear()
    run.main(["--skip-load", "--json", str(tmp_path / "full.json")])  # the full run: each part's defaults
    assert calls["bench_typical"] == {} and calls["bench_pass"] == {} and calls["bench_verification"] == {}
    assert calls["bench_eagle"] == {} and calls["bench_constrained"] == {} and calls["bench_decoders"] == {}
    assert calls["bench_spec_bench"] == {} and calls["bench_watermarks"] == {}
    calls.clear()
    run.main(["--skip-load", "--repeat", "1", "--json", str(tmp_path / "once.json")])  # the full run, one repeat
    for name in ["bench_generate", "bench_speculative", "bench_draft_model", "bench_typical", "bench_eagle",
                 "bench_pass", "bench_spec_bench", "bench_constrained", "bench_watermarks", "bench_decoders"]:
        assert calls[name]["repeat"] == 1 and "per_task" not in calls[name], name
    with pytest.raises(SystemExit):
        run.main(["--skip-load", "--repeat", "0"])
    calls.clear()
    run.main(["--skip-load", "--skip-sampling", "--skip-verification", "--json", str(tmp_path / "some.json")])
    assert "bench_sampling" not in calls and "bench_verification" not in calls and "bench_spec_bench" in calls
    calls.clear()
    run.main(["--skip-load", "--spec-bench-drafters", "suffix", "--json", str(tmp_path / "suffix.json")])
    assert calls["bench_spec_bench"] == {"only": "suffix"}
    forgotten.clear()
    run.main(["--skip-load", "--keep-kernel-choice", "--json", str(tmp_path / "kept.json")])
    assert forgotten == []


def test_runs_combine_into_medians_with_every_run_kept():
    from logitlab.measure.table import combine_runs

    def run(alpha, ratio, seconds):
        return [{"measurement": f"draft model (gamma={alpha}, alpha=0.{alpha}), 2 prompts", "seconds": seconds,
                 "ratio": ratio, "against": "faster than our AR loop", "section": "s"},
                {"measurement": "ll.generate, 2 prompts", "seconds": 2 * seconds, "ratio": None, "against": "",
                 "section": "s"}]

    combined = combine_runs([run(3, 1.1, 1.0), run(2, 1.3, 3.0), run(3, 0.9, 2.0)])
    first, baseline = combined
    assert first["ratio"] == 1.1 and first["ratios"] == [1.1, 1.3, 0.9]
    assert first["seconds"] == 2.0 and first["seconds_runs"] == [1.0, 3.0, 2.0]
    assert first["measurement"].startswith("draft model (gamma=3")  # the first run's label
    assert baseline["ratio"] is None and baseline["ratios"] is None and baseline["seconds"] == 4.0
    assert "1.10x faster than our AR loop [0.90-1.30 over 3 runs]" in bench.Table(combined).markdown()
    other = run(3, 1.0, 1.0)
    other[1]["measurement"] = "Hugging Face generate, 2 prompts"
    with pytest.raises(ValueError, match="same rows in the same order"):
        combine_runs([run(3, 1.1, 1.0), other])
    with pytest.raises(ValueError, match="same rows"):
        combine_runs([run(3, 1.1, 1.0), run(3, 1.1, 1.0)[:1]])


def test_runs_repeat_every_section_and_write_the_spread(monkeypatch, tmp_path, capsys):
    from types import SimpleNamespace

    from logitlab.bench import run

    fake = SimpleNamespace(logitlab_fast_cpu={})
    monkeypatch.setattr(run.models, "load", lambda *a, **k: (fake, None))
    ratios = iter([1.0, 1.2, 1.1])
    monkeypatch.setattr(run, "bench_sampling", lambda table, *a, **k: table.add("ll.sample", 0.1, next(ratios),
                                                                                 "faster than Hugging Face"))
    skips = [f"--skip-{part}" for part in ("load", "verification", "generate", "parallel", "speculative", "typical",
                                           "eagle", "pass", "spec-bench", "constrained", "watermarks", "decoders")]
    run.main(skips + ["--runs", "3", "--json", str(tmp_path / "runs.json")])
    saved = json.loads((tmp_path / "runs.json").read_text())
    assert saved["runs"] == 3 and len(saved["rows"]) == 1
    assert saved["rows"][0]["ratios"] == [1.0, 1.2, 1.1] and saved["rows"][0]["ratio"] == 1.1
    assert "[1.00-1.20 over 3 runs]" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        run.main(skips + ["--runs", "0"])


def test_llama_cpp_rows_are_skipped_with_a_message_without_llama_cpp_python(monkeypatch, capsys):
    import sys

    from logitlab.bench import llamacpp

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed: importing it fails
    table = bench.Table()
    llamacpp.bench_llama_cpp(table, None, [1, 2, 3])
    assert table.rows == [] and "pip install llama-cpp-python" in capsys.readouterr().out


@pytest.mark.slow
def test_constrained_rows():
    """The index build beside outlines-core's, and a step with and without the mask."""
    pytest.importorskip("outlines_core")
    import logitlab as ll
    from logitlab.bench.constrained import bench_constrained

    model, tokenizer = ll.load("smollm2-135m", device="cpu")
    table = bench.Table()
    bench_constrained(table, model, tokenizer, repeat=1)
    names = [r["measurement"] for r in table.rows]
    assert len(names) == 7 and "outlines-core" in names[1] and "outlines-core" in names[3] and "constraint" in names[5]
    assert "of a decode step" in names[6]
    assert all(r["seconds"] > 0 for r in table.rows)
    assert all(table.rows[i]["ratio"] > 0 for i in (0, 2, 5))


@pytest.mark.slow  # 10-15 s: three loads and eleven short runs; transformers 4.56 adds nothing here
def test_the_gpu_bench_runs_its_sections_on_a_small_setting():
    """``python -m logitlab.bench.gpu`` is made to run once on a lent GPU: its sections are
    checked here on the CPU, small, so that the device time is not spent finding a typo."""
    import logitlab as ll
    from logitlab.bench import gpu

    model, tokenizer = ll.load("smollm2-135m", device="cpu")
    stock = ll.load("smollm2-135m", device="cpu", fast=False)[0]
    static = ll.fast_gpu.enable(ll.load("smollm2-135m", device="cpu")[0], graphs=False)
    passes = gpu.bench_passes({"stock": stock, "static": static}, tokenizer, (1, 2), rounds=1)
    assert set(passes) == {"stock", "static"} and all(set(p["v_n"]) == {2} and p["step_ms"] > 0
                                                      for p in passes.values())
    table = bench.Table()
    gpu.bench_generate(table, model, stock, tokenizer, new_tokens=3, repeat=1)
    gpu.bench_drafters(table, model, tokenizer, new_tokens=3, repeat=1, quick=True)
    labels = [r["measurement"] for r in table.rows]
    assert len(labels) == 4 + 7 and all(r["seconds"] > 0 for r in table.rows)
    assert labels[3].startswith("Hugging Face generate, static cache, 2 prompts")  # not compiled on a CPU
    assert "tokens per target pass" in labels[4 + 3]  # PaSS's drafting passes are the target's
    assert gpu.machine(torch.device("cpu"), model)["ll.load"] == "CPU fast path"
    assert gpu.machine(torch.device("cpu"), static)["ll.load"] == "static cache"


def test_first_guess_stats_count_the_tokens_a_call_can_draft_and_the_misses_after_misses():
    from logitlab.bench.acceptance import first_guess_stats

    # Each run's first token is the prefill's: never drafted, so never counted.
    runs = [[False, True, False, False, True], [True, False, False]]
    # Drafted tokens: T F F T, F F -> 2 of 6 guessed. Misses followed by a token: run 1 tokens 2, 3
    # (followed by F, T), run 2 token 1 (followed by F) -> 2 of 3 misses followed by a miss.
    assert first_guess_stats(runs) == (pytest.approx(2 / 6), pytest.approx(2 / 3))
    assert first_guess_stats([[False, True, True]]) == (1.0, 0.0)  # no miss to follow
    with pytest.raises(ValueError, match="hits must hold at least one run with two or more tokens"):
        first_guess_stats([[True]])


@pytest.mark.slow
def test_acceptance_counts_the_trained_drafters_on_the_questions_the_bench_does_not_time(smollm):
    import logitlab as ll
    from logitlab import spec_bench
    from logitlab.bench import acceptance
    from logitlab.bench.prompts import chat
    from logitlab.bench.spec_bench import shipped_drafters

    model, tokenizer = smollm
    prompts = acceptance.dev_prompts(tokenizer, tasks=["translation"], per_task=1)
    fourth = spec_bench.questions("translation")[3]  # the bench times the first two and calibrates on the third
    assert torch.equal(prompts["translation"][0], chat(tokenizer, fourth.turns[0]))
    drafters = shipped_drafters(model)
    found = acceptance.acceptance(model, prompts, drafters, new_tokens=8)
    assert list(found) == ["draft model (gamma=3)", "Medusa heads, tree (3, 2, 1)", "PaSS two-call, k=2",
                           "EAGLE chain (gamma=3)", "EAGLE tree (top_k=3, 10 nodes, depth 4)"]
    greedy = ll.generate(model, prompts["translation"][0], max_new_tokens=8, temperature=0, eos_token_id=[])
    for label, tasks in found.items():
        tokens, passes, results = tasks["translation"]
        assert results[0].new_tokens[0].tolist() == greedy.new_tokens[0].tolist(), label  # exact at T = 0
        assert tokens == 8 and 1 <= passes <= (16 if label.startswith("PaSS") else 8), label
    lines = acceptance.report(found).splitlines()
    assert len(lines) == 5 * 3 and lines[0] == "draft model (gamma=3)"
    assert re.fullmatch(r"  all tasks +[\d.]+ tokens per target pass, (accepted by position [\d.]+(/[\d.]+)*|no "
                        r"drafts proposed)", lines[2]), lines[2]
    draft = drafters["draft"]
    results = found["draft model (gamma=3)"]["translation"][2]
    hits = acceptance.first_guesses(draft, results)
    sequence, new = results[0].sequences[0], results[0].new_tokens[0].tolist()
    with torch.inference_mode():  # the draft's guess of new token t, from the prefix before it alone
        one_by_one = torch.stack([draft(sequence[None, :len(sequence) - 8 + t]).logits[0, -1] for t in range(8)])
    top = one_by_one.topk(2)
    clear = (top.values[:, 0] - top.values[:, 1] > 1e-3).tolist()  # a near-tie may round either way
    assert len(hits) == 1 and len(hits[0]) == 8 and sum(clear) >= 6
    assert all(h == (i == n) for h, i, n, c in zip(hits[0], top.indices[:, 0].tolist(), new, clear) if c)
    guess_lines = acceptance.first_guess_report(draft, found["draft model (gamma=3)"]).splitlines()
    assert len(guess_lines) == 4 and guess_lines[-1] == "  1 of 1 runs made exactly the calls their hits give"
    assert guess_lines[2].startswith(f"  all tasks   first guess {acceptance.first_guess_stats(hits)[0]:.3f} per token")
    assert guess_lines[1][2:].startswith("translation")
    with pytest.raises(ValueError, match="per_task must be an int between 1 and 7, got 8"):
        acceptance.dev_prompts(tokenizer, per_task=8)
    with pytest.raises(ValueError, match="only must be a regular expression"):
        acceptance.acceptance(model, prompts, {}, only="(")
    with pytest.raises(ValueError, match="matches none of the drafters"):
        acceptance.acceptance(model, prompts, drafters, only="no such drafter")
