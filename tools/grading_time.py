"""How long the grader takes for a class: N returned notebooks of one chapter, graded (checks only,
as `python -m logitlab.course.grade` does by default) with one worker per core.

    .venv/bin/python tools/grading_time.py 30 [--chapter 01_logits_and_temperature]

The class: two thirds hand in the chapter with its solutions (every check passes), one third the
student version as given out (nothing attempted). Prints the wall time, the time per notebook,
and the verdicts counted, so that a wrong grading cannot pass for a fast one.
"""

import argparse
import collections
import os
import shutil
import tempfile
import time
from pathlib import Path

from logitlab.course.gradebook import chapter_points
from logitlab.course.grade import grade

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("students", type=int)
    parser.add_argument("--chapter", default="01_logits_and_temperature")
    parser.add_argument("--workers", type=int, help="default: one per core")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        returned = folder / "returned"
        returned.mkdir()
        for n in range(args.students):
            source = ROOT / ("student/chapters" if n % 3 == 2 else "chapters") / f"{args.chapter}.ipynb"
            shutil.copy(source, returned / f"student{n:03d}.ipynb")
        start = time.perf_counter()
        rows = grade(returned, folder / "grades.csv", checks=list(chapter_points(args.chapter)), workers=args.workers)
        seconds = time.perf_counter() - start
    verdicts = collections.Counter(v.split(":")[0] for row in rows for k, v in row.items() if k.startswith("check_"))
    print(f"{args.students} notebooks of {args.chapter}: {seconds:.0f} s ({seconds / args.students:.1f} s each), "
          f"{args.workers or os.cpu_count()} workers; verdicts {dict(verdicts)}")


if __name__ == "__main__":
    main()
