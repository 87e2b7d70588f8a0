"""Spec-Bench, the benchmark drafting papers report on, as a shipped sample.

Spec-Bench (Xia et al., 2024; github.com/hemingkx/Spec-Bench, Apache-2.0) holds 480 questions in
six tasks: multi-turn conversation (MT-Bench's 80 questions, in eight subcategories), translation,
summarisation, question answering, mathematical reasoning and retrieval-augmented generation
(80 each). Its leaderboard reports, for each drafting method, the mean number of tokens each
target call keeps and the speedup per task, on one GPU and a 7B or 13B target.

The library ships ``SAMPLE_PER_TASK`` questions of each task (``data/spec_bench_sample.jsonl``,
chosen at random with a fixed seed by ``python -m logitlab.spec_bench QUESTION_JSONL``; the licence
and the source commit are in ``data/SPEC_BENCH_LICENSE.txt``). They are the held-out prompts of
the drafting benchmark: no drafter of the book trains on them (the training corpus drops every
prompt that shares 12 consecutive words with any of the 480, ``logitlab.training.corpus``).
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

SAMPLE = Path(__file__).parent / "data" / "spec_bench_sample.jsonl"
SAMPLE_PER_TASK = 10
SOURCE_COMMIT = "fd2c1cd7d2201ef71db4c5f4e455008f017967bf"  # hemingkx/Spec-Bench, 2025-04-22

# Spec-Bench's six tasks and the categories of question.jsonl that make each one.
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
TASKS = {
    "multi-turn conversation": MT_BENCH,
    "translation": ("translation",),
    "summarisation": ("summarization",),
    "question answering": ("qa",),
    "mathematical reasoning": ("math_reasoning",),
    "retrieval-augmented generation": ("rag",),
}

# The leaderboard's A100 figures for Vicuna-7B-v1.3 (greedy, fp16, batch 1; Spec-Bench's
# Leaderboard.md at SOURCE_COMMIT): mean tokens kept per target call and overall speedup. A
# 7B target on a GPU, not ours on a CPU: for context only, never a like-for-like comparison.
LEADERBOARD_A100_VICUNA_7B = {
    "SAM-Decoding + EAGLE-2": (4.58, 2.73), "EAGLE-2": (4.34, 2.36), "Token Recycling": (2.73, 2.22),
    "EAGLE": (3.58, 2.10), "Hydra": (3.26, 2.07), "Medusa": (2.31, 1.71), "prompt lookup (PLD)": (1.75, 1.66),
    "draft model (SpS)": (2.28, 1.52), "REST": (1.82, 1.48), "Lookahead decoding": (1.64, 1.34),
}


@dataclass(frozen=True)
class Question:
    question_id: int
    task: str          # one of TASKS
    category: str      # Spec-Bench's own category (MT-Bench's subcategory for conversations)
    turns: tuple[str, ...]


def task_of(category: str) -> str:
    for task, categories in TASKS.items():
        if category in categories:
            return task
    raise ValueError(f"category must be one of Spec-Bench's ({', '.join(c for cs in TASKS.values() for c in cs)}), "
                     f"got {category!r}")


def read_rows(path: str | Path) -> list[dict]:
    """The questions of a file in Spec-Bench's layout (one JSON object per line), as dicts."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def questions(task: str | None = None, path: str | Path | None = None) -> list[Question]:
    """The shipped sample (or Spec-Bench's whole ``question.jsonl`` at ``path``), in file order;
    only the questions of ``task`` when it is given."""
    if task is not None and task not in TASKS:
        raise ValueError(f"task must be one of {list(TASKS)}, got {task!r}")
    rows = read_rows(path or SAMPLE)
    found = [Question(r["question_id"], task_of(r["category"]), r["category"], tuple(r["turns"])) for r in rows]
    return [q for q in found if task is None or q.task == task]


def sample(rows: list[dict], per_task: int = SAMPLE_PER_TASK, seed: int = 0) -> list[dict]:
    """``per_task`` questions of each task, at random (``seed``), in Spec-Bench's order."""
    rng = random.Random(seed)
    chosen = []
    for task in TASKS:
        ids = [r["question_id"] for r in rows if task_of(r["category"]) == task]
        if len(ids) < per_task:
            raise ValueError(f"per_task={per_task} but Spec-Bench has {len(ids)} questions of {task!r}")
        chosen += rng.sample(ids, per_task)
    keep = set(chosen)
    return [r for r in rows if r["question_id"] in keep]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Write the shipped Spec-Bench sample from Spec-Bench's question.jsonl.")
    p.add_argument("questions", type=Path, help="data/spec_bench/question.jsonl of hemingkx/Spec-Bench")
    p.add_argument("--per-task", type=int, default=SAMPLE_PER_TASK)
    p.add_argument("--out", type=Path, default=SAMPLE)
    args = p.parse_args(argv)
    rows = read_rows(args.questions)
    chosen = sample(rows, args.per_task)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in chosen), encoding="utf-8")
    print(f"{len(chosen)} of {len(rows)} questions written to {args.out}")


if __name__ == "__main__":
    main()
