"""The bridge to otter-grader, with the real tool: a chapter becomes an otter master notebook,
`otter assign` makes its autograder offline, and `otter run` (no Docker) grades the book's own
student version with one exercise answered: that exercise earns its points, the other none."""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from logitlab.course.otter_bridge import CONFIG, guide_points, main, otter_master

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "chapters" / "01_logits_and_temperature.ipynb"
OTTER = str(Path(sys.executable).with_name("otter"))


def test_the_master_has_one_question_per_code_exercise_with_its_check_as_test():
    master = otter_master(nbformat.read(CHAPTER, as_version=4), guide_points(CHAPTER.stem))
    assert master.cells[0].source.startswith("# ASSIGNMENT CONFIG")
    questions = [yaml.safe_load(c.source.split("\n", 1)[1]) for c in master.cells if c.source.startswith("# BEGIN QUESTION")]
    assert questions == [{"name": "ex-softmax", "points": 4}, {"name": "ex-gumbel", "points": 4}]
    tests = [c.source for c in master.cells if c.cell_type == "code" and c.source.startswith("def test_")]
    assert "ll.checks.check_softmax(softmax_with_temperature)" in tests[0]
    with pytest.raises(ValueError, match="no exercise checked by"):
        otter_master(nbformat.read(CHAPTER, as_version=4), {})
    with pytest.raises(SystemExit):
        main([str(ROOT / "chapters" / "nope.ipynb"), "--out", "x"])


@pytest.mark.slow
def test_otter_grades_a_student_version(tmp_path):
    master = otter_master(nbformat.read(CHAPTER, as_version=4), guide_points(CHAPTER.stem))
    master.cells[0].source = "# ASSIGNMENT CONFIG\n" + yaml.safe_dump(CONFIG | {"run_tests": False})  # no chapter run here
    nbformat.write(master, tmp_path / "master.ipynb")
    subprocess.run([OTTER, "assign", "master.ipynb", "dist"], cwd=tmp_path, check=True, capture_output=True)
    autograder = next((tmp_path / "dist" / "autograder").glob("*.zip"))
    # The student version with the softmax exercise answered (its cell copied back from the chapter).
    chapter = nbformat.read(CHAPTER, as_version=4)
    student = nbformat.read(ROOT / "student" / "chapters" / CHAPTER.name, as_version=4)
    answer = next(c.source for c in chapter.cells if "ll.checks.check_softmax(" in c.source)
    next(c for c in student.cells if "ll.checks.check_softmax(" in c.source).source = answer
    # Its set-up and exercise cells only: the chapter's experiments, which tests/test_chapters.py
    # runs, would only add half a minute to otter's run.
    setup = next(i for i, c in enumerate(student.cells) if c.cell_type == "code")
    student.cells = [c for i, c in enumerate(student.cells) if i <= setup or "ll.checks." in c.source]
    nbformat.write(student, tmp_path / "submission.ipynb")
    (tmp_path / "results").mkdir()
    command = [OTTER, "run", "-a", str(autograder), "-o", "results", "submission.ipynb"]
    # 43-67 s in `make test` with the whole chapter; but otter's run has stalled (its kernel idle for 10 minutes once, on
    # 2026-11-27; past 300 s, this test's limit then, in a full run on 2026-12-01), so a stall is cut
    # short and retried once, and a second one fails the test. The limit is over twice the slowest
    # normal run.
    try:
        subprocess.run(command, cwd=tmp_path, check=True, capture_output=True, timeout=150)
    except subprocess.TimeoutExpired:
        subprocess.run(command, cwd=tmp_path, check=True, capture_output=True, timeout=150)
    tests = json.loads((tmp_path / "results" / "results.json").read_text())["tests"]
    scores = {t["name"]: (t.get("score"), t.get("max_score")) for t in tests if t["name"].startswith("ex-")}
    assert scores == {"ex-softmax": (4.0, 4.0), "ex-gumbel": (0, 4.0)}
    assert "NotImplementedError" in next(t["output"] for t in tests if t["name"] == "ex-gumbel")
