"""The shipped Spec-Bench sample: what it holds, how it was drawn, and that no drafter trains on it."""

import json

import pytest

from logitlab import spec_bench
from logitlab.training.corpus import shingles
from logitlab.training.data import CHAT_PROMPTS, TEMPLATES, TEXT_PROMPTS, TOPICS


def test_the_sample_holds_ten_questions_of_each_task_with_their_ids_and_turns():
    found = spec_bench.questions()
    assert len(found) == 6 * spec_bench.SAMPLE_PER_TASK
    for task in spec_bench.TASKS:
        mine = spec_bench.questions(task)
        assert len(mine) == spec_bench.SAMPLE_PER_TASK and all(q.task == task for q in mine)
    assert len({q.question_id for q in found}) == len(found)
    assert all(q.turns and all(isinstance(t, str) and t.strip() for t in q.turns) for q in found)
    # Spec-Bench numbers its questions 81-560: MT-Bench's 80 (ids 81-160) first, then 80 per
    # task in TASKS' order.
    for n, task in enumerate(spec_bench.TASKS, start=1):
        assert all(80 * n < q.question_id <= 80 * (n + 1) for q in spec_bench.questions(task))
    assert all(len(q.turns) == 2 for q in spec_bench.questions("multi-turn conversation"))


def test_sample_draws_per_task_at_random_reproducibly_and_keeps_the_file_order():
    rows = [{"question_id": i, "category": c, "turns": [f"q{i}"]}
            for i, c in enumerate(["writing", "math"] * 3 + ["translation", "qa", "summarization",
                                                              "math_reasoning", "rag"] * 2)]
    chosen = spec_bench.sample(rows, per_task=2, seed=0)
    assert chosen == spec_bench.sample(rows, per_task=2, seed=0)
    ids = [r["question_id"] for r in chosen]
    assert ids == sorted(ids) and len(ids) == 12
    assert [spec_bench.task_of(r["category"]) for r in chosen].count("multi-turn conversation") == 2
    assert spec_bench.sample(rows, per_task=2, seed=1) != chosen  # seed 1 picks other conversations
    with pytest.raises(ValueError, match="per_task=3 but Spec-Bench has 2 questions of 'translation'"):
        spec_bench.sample(rows, per_task=3)


def test_the_sample_is_what_the_cli_writes_from_spec_bench(tmp_path):
    # Four fake questions per task in Spec-Bench's layout; the CLI writes two of each.
    rows = [{"question_id": i + 1, "category": c, "turns": [f"question {i}"]}
            for i, c in enumerate(["coding"] * 4 + ["translation", "summarization", "qa", "math_reasoning", "rag"] * 4)]
    source, out = tmp_path / "question.jsonl", tmp_path / "sample.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec_bench.main([str(source), "--per-task", "2", "--out", str(out)])
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert written == spec_bench.sample(rows, per_task=2)
    assert [q.question_id for q in spec_bench.questions(path=out)] == [r["question_id"] for r in written]


def test_bad_task_and_category_name_what_is_allowed():
    with pytest.raises(ValueError, match="task must be one of"):
        spec_bench.questions("poetry")
    with pytest.raises(ValueError, match="category must be one of Spec-Bench's"):
        spec_bench.task_of("poetry")


def test_no_training_prompt_of_the_shipped_drafters_shares_twelve_words_with_the_sample():
    banned = set().union(*(shingles(turn) for q in spec_bench.questions() for turn in q.turns))
    training = CHAT_PROMPTS + TEXT_PROMPTS + [t.format(topic) for t in TEMPLATES for topic in TOPICS]
    assert not [t for t in training if shingles(t) & banned]
    # and the check can fail: a Spec-Bench turn itself shares its words
    assert shingles(spec_bench.questions("summarisation")[0].turns[0]) & banned


def test_the_licence_and_source_ship_beside_the_sample():
    text = (spec_bench.SAMPLE.parent / "SPEC_BENCH_LICENSE.txt").read_text()
    assert spec_bench.SOURCE_COMMIT in text and "Apache License" in text and "Version 2.0" in text
