"""A bridge to otter-grader, for courses that already grade with it.

::

    python -m logitlab.course.otter_bridge chapters/02_truncation.ipynb --out otter/02_truncation
    otter assign otter/02_truncation/master.ipynb otter/02_truncation/dist
    otter run -a otter/02_truncation/dist/autograder/*.zip -o RESULTS_FOLDER SUBMISSION.ipynb

The first command writes an otter "master notebook" from a chapter: the chapter itself, with each
code exercise turned into an otter question (named by the exercise's label, worth the points of
the teacher's guide, ``logitlab/data/exercises.yml``) whose test is the exercise's own check.
``otter assign`` (offline, no Docker) turns it into an autograder zip, and ``otter run`` grades a
student's notebook with it, again offline and without Docker (``otter grade``, which does the same
for a whole class, needs Docker). The notebooks students hand in are the book's own student
versions (``student/chapters/``): otter's test functions look up the student's function by name
in the executed notebook, so no otter cell has to be added to them. Written exercises stay out of
otter; grade them with the teacher's guide's rubrics.

What this does not protect: otter runs each test in the student's own kernel, after the
student's code, so the check runs in a process the notebook controls. A notebook that replaces
``ll.checks.check_softmax`` (or anything the check uses, torch's comparisons included) with
something that always passes gets the points. Use it for feedback; for grades that count, use
``python -m logitlab.course.grade``, which runs the checks in its own process on the functions it takes
from the notebook (``book/teaching.md``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat
import yaml

from .assignments import BEGIN

CHECK_LINE = re.compile(r"^ll\.checks\.(check_\w+)\((\w+)\)\s*$", re.M)
CONFIG = {"init_cell": False, "check_all_cell": False, "export_cell": False, "solutions_pdf": False,
          "generate": True, "tests": {"ok_format": False, "files": False}}


def _raw(text: str):
    return nbformat.v4.new_raw_cell(text)


def _question(cell, label: str, points: int) -> list:
    """The otter question for one exercise cell: its code as the solution, its check as the test."""
    check = CHECK_LINE.search(cell.source)
    if check is None:
        raise ValueError(f"exercise {label}: its cell has no line 'll.checks.check_NAME(function)'")
    name, function = check.groups()
    solution = cell.source[:check.start()].rstrip()
    after = cell.source[check.end():].strip()  # code that uses the answer after its check
    test = (f"def test_{label.replace('-', '_')}({function}):\n    import logitlab as ll\n\n"
            f"    ll.checks.{name}({function})\n\n\ntest_{label.replace('-', '_')}({function})")
    cells = [_raw(yaml.safe_dump({"name": label, "points": points}, sort_keys=False).join(["# BEGIN QUESTION\n", ""])),
             _raw("# BEGIN SOLUTION"), nbformat.v4.new_code_cell(solution), _raw("# END SOLUTION"),
             _raw("# BEGIN TESTS"), nbformat.v4.new_code_cell(test), _raw("# END TESTS"), _raw("# END QUESTION")]
    return cells + ([nbformat.v4.new_code_cell(after)] if after else [])


def otter_master(chapter: nbformat.NotebookNode, points: dict[str, int]) -> nbformat.NotebookNode:
    """The otter master notebook of ``chapter``; ``points`` maps each code exercise's check name
    (``check_softmax``) to ``(label, points)``."""
    master = nbformat.v4.new_notebook(metadata=chapter.metadata)
    master.cells = [_raw("# ASSIGNMENT CONFIG\n" + yaml.safe_dump(CONFIG, sort_keys=False))]
    for cell in chapter.cells:
        check = CHECK_LINE.search(cell.source) if cell.cell_type == "code" and BEGIN in cell.source else None
        if check is None:
            master.cells.append(cell)
        elif check.group(1) not in points:
            raise ValueError(f"the teacher's guide has no exercise checked by {check.group(1)}")
        else:
            master.cells += _question(cell, *points[check.group(1)])
    return master


def guide_points(chapter_name: str) -> dict[str, tuple[str, int]]:
    """``{check name: (exercise label, points its check earns)}`` of a chapter's code exercises,
    from the guide (:func:`logitlab.course.gradebook.chapter_points`: where a rubric gives part
    of an exercise to a written answer, the check earns only its share)."""
    from .gradebook import chapter_points, exercise_data

    points = chapter_points(chapter_name)
    return {e["check"]: (e["label"], points[e["check"]]) for e in exercise_data()[chapter_name]["exercises"]
            if e["kind"] == "code"}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m logitlab.course.otter_bridge", description=__doc__.split("\n\n")[0])
    parser.add_argument("chapter", type=Path, help="a chapter notebook (chapters/NN_name.ipynb)")
    parser.add_argument("--out", type=Path, required=True, help="folder for master.ipynb")
    args = parser.parse_args(argv)
    try:
        master = otter_master(nbformat.read(args.chapter, as_version=4), guide_points(args.chapter.stem))
    except (ValueError, FileNotFoundError) as error:
        parser.error(str(error))
    args.out.mkdir(parents=True, exist_ok=True)
    nbformat.write(master, args.out / "master.ipynb")
    print(f"{args.out / 'master.ipynb'}: {sum(c.source.startswith('# BEGIN QUESTION') for c in master.cells)} questions")


if __name__ == "__main__":
    main(sys.argv[1:])
