"""A course run from the book: one setting, the repository URL in ``_config.yml`` (a fork's, for
a course of one's own), and one command that makes everything else follow the sources::

    python -m logitlab.course

(``make student`` runs it first). It writes the URL into the setup cell of every chapter (the
line ``REPO = "..."``, from which Colab installs the library), writes the student notebooks
(``student/chapters/``) from the chapters, and writes the teacher's guide
(``book/teachers_guide.md``) from ``logitlab/data/exercises.yml``: each chapter's objectives and
prerequisites, each exercise's time, difficulty and points, and a rubric for every written answer. The Colab buttons of both editions of the website read
the URL from ``_config.yml`` when the site is built. No other file names the repository, and a
test checks that.

These functions work on a checkout of the repository (``ROOT``), not on an installed package.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import yaml

from .assignments import make_student_versions

ROOT = Path(__file__).resolve().parents[2]
REPO_LINE = re.compile(r'^REPO = "[^"]*"', re.M)


def repository(root: Path = ROOT) -> str:
    """The repository URL that ``_config.yml`` sets (``repository.url``)."""
    return yaml.safe_load((root / "_config.yml").read_text())["repository"]["url"]


def point_chapters_at(url: str, chapters: Path) -> list[Path]:
    """Write ``url`` into the ``REPO = "..."`` line of every chapter in ``chapters``; return the
    chapters that changed. A chapter without that line in its first code cell is an error."""
    if not re.fullmatch(r"https://[\w.-]+/[\w.-]+/[\w.-]+", url):
        raise ValueError(f"the repository URL must look like https://github.com/OWNER/NAME, got {url!r}")
    changed = []
    for path in sorted(chapters.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        setup = next(c for c in nb.cells if c.cell_type == "code")
        if not REPO_LINE.search(setup.source):
            raise ValueError(f"{path}: its first code cell has no line 'REPO = \"...\"'")
        source = REPO_LINE.sub(f'REPO = "{url}"', setup.source, count=1)
        if source != setup.source:
            setup.source = source
            nbformat.write(nb, path)
            changed.append(path)
    return changed


GUIDE_DATA = Path(__file__).parent / "data" / "exercises.yml"
GUIDE_PAGE = ROOT / "book" / "teachers_guide.md"
DIFFICULTY = {1: "routine", 2: "needs thought", 3: "hard"}


def exercises() -> dict:
    """The teacher's guide data: ``{chapter: {title, objectives, prerequisites, exercises}}``."""
    return yaml.safe_load(GUIDE_DATA.read_text())


def _chapter_section(number: int, name: str, chapter: dict) -> list[str]:
    lines = [f"## {number}. {chapter['title']}", "", f"{{doc}}`The chapter <../chapters/{name}>`. After it a student can:", ""]
    lines += [f"- {item}" for item in chapter["objectives"]]
    lines += ["", "Before it: " + "; ".join(chapter["prerequisites"]) + ".", ""]
    lines += ["| exercise | kind | minutes | difficulty | points |", "|:---|:---|---:|:---|---:|"]
    for e in chapter["exercises"]:
        kind = f"code (`ll.checks.{e['check']}`)" if e["kind"] == "code" else "written"
        lines.append(f"| {{ref}}`{e['title']} <{e['label']}>` | {kind} | {e['minutes']} | {DIFFICULTY[e['difficulty']]} "
                     f"| {e['points']} |")
    total = chapter["exercises"]
    lines += [f"| all {len(total)} | | {sum(e['minutes'] for e in total)} | | {sum(e['points'] for e in total)} |", ""]
    for e in (e for e in total if "rubric" in e):
        lines += [f"**{{ref}}`{e['title']} <{e['label']}>`** ({e['points']} points)", ""]
        lines += [f"- *{grade}:* {' '.join(e['rubric'][grade].split())}" for grade in ("full", "partial", "missing")]
        lines.append("")
    return lines


def teachers_guide(data: dict) -> str:
    """The teacher's guide page (MyST Markdown) for ``data`` (see :func:`exercises`)."""
    every = [e for chapter in data.values() for e in chapter["exercises"]]
    lines = ["# Teacher's guide", "",
             "% Written by `python -m logitlab.course` from lib/logitlab/data/exercises.yml: edit that file.", "",
             "For each chapter: what a student can do after it, what they need before it, and each exercise's",
             "time (minutes, for a good student of a graduate course, reading included), difficulty and points.",
             "Code exercises are graded by their check (`python -m logitlab.grade`, see the",
             "{doc}`teaching page <teaching>`); every written exercise has a rubric: what a full, a partial",
             "and a missing answer contain. In all, the book has "
             f"{len(every)} exercises, about {round(sum(e['minutes'] for e in every) / 60)} hours of work and "
             f"{sum(e['points'] for e in every)} points.", ""]
    for number, (name, chapter) in enumerate(data.items(), start=1):
        lines += _chapter_section(number, name, chapter)
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> None:
    url = repository()
    for path in point_chapters_at(url, ROOT / "chapters"):
        print(f"{path.relative_to(ROOT)}: now installs from {url}")
    make_student_versions([ROOT / "chapters"], ROOT / "student" / "chapters", verbose=True)
    GUIDE_PAGE.write_text(teachers_guide(exercises()))
    print(f"{GUIDE_PAGE.relative_to(ROOT)}: written from {GUIDE_DATA.name}")


if __name__ == "__main__":
    main(sys.argv[1:])
