"""The book's website, built from chapters executed beforehand: the full edition, or the student
edition a teacher can publish (the same book with every solution removed).

``make test`` builds both from the chapters it has just executed (tests/test_book.py), and
``make student`` builds the student edition::

    python -m logitlab.course.website EXECUTED_CHAPTERS OUT [--student]

The site is assembled in ``OUT`` from the repository's ``book/``, ``_toc.yml`` and
``_config.yml`` and the executed notebooks, then built there by Jupyter Book with execution off
(``OUT/_build/html``), so that no chapter runs twice. In the student edition:

* every chapter is its student version (``logitlab.course.assignments``) with the outputs of every cell
  the conversion left unchanged, so the figures and tables stay and the exercises' outputs go;
* each chapter's Colab button opens the committed student notebook (``student/chapters/``) of the
  repository that ``_config.yml`` names, not the chapter with its answers, at the course's release
  (``repository.branch``), the same ref its setup cell installs the library from;
* the teaching page is replaced by a short note, so links to it still resolve, and the teacher's
  guide (its rubrics are answers) is left out.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import yaml

from .assignments import make_student_notebook
from .run import ROOT, release

TEACHER_PAGE = "book/teaching"  # replaced by a note in the student edition
ANSWER_PAGES = ["book/teachers_guide"]  # left out of the student edition (its rubrics are answers)
STUDENT_NOTE = """# For teachers

This is the **student edition** of the book: the exercises are here, their solutions are not.
The teacher's pages (how to hand out the exercises, grade them and run a course) are in the full
edition of the book.
"""


def assemble(executed: Path, out: Path, *, student: bool = False, execute: bool = False) -> Path:
    """Lay out the site's sources in ``out`` (emptied first) from the notebooks in ``executed``;
    ``execute`` lets the build run them instead (when no executed copies exist)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copytree(ROOT / "book", out / "book", ignore=shutil.ignore_patterns("vendor"))
    vendor = ROOT / "book" / "vendor"
    if vendor.exists():
        (out / "book" / "vendor").symlink_to(vendor, target_is_directory=True)
    shutil.copy(ROOT / "_toc.yml", out / "_toc.yml")
    (out / "chapters").mkdir()
    for path in sorted(executed.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        nbformat.write(make_student_notebook(nb, keep_outputs=True) if student else nb, out / "chapters" / path.name)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "force" if execute else "off"
    if student:
        if execute:
            raise ValueError("the student edition is built from executed chapters (its exercises cannot run)")
        config["title"] = f"{config['title']} (student edition)"
        config["repository"]["path_to_book"] = "student"  # the Colab button opens student/chapters/
        config["repository"]["branch"] = release()  # at the release its setup cell installs (checked: a git ref)
        (out / f"{TEACHER_PAGE}.md").write_text(STUDENT_NOTE)
        toc = (out / "_toc.yml").read_text()
        for page in ANSWER_PAGES:
            (out / f"{page}.md").unlink()
            toc = toc.replace(f"      - file: {page}\n", "")
        (out / "_toc.yml").write_text(toc)
    (out / "_config.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    return out


def build(out: Path) -> subprocess.CompletedProcess:
    """Jupyter Book's build of the sources in ``out``, with warnings as errors."""
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    return subprocess.run([str(jupyter_book), "build", str(out), "-W", "-n", "--keep-going"],
                          capture_output=True, text=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m logitlab.course.website", description=__doc__.split("\n\n")[0])
    parser.add_argument("executed", type=Path, help="folder of executed chapter notebooks")
    parser.add_argument("out", type=Path, help="folder to build the site in (emptied first)")
    parser.add_argument("--student", action="store_true", help="the student edition: solutions removed")
    args = parser.parse_args(argv)
    if not sorted(args.executed.glob("*.ipynb")):
        parser.error(f"no executed chapters in {args.executed}: run `make test` or `make student` first")
    result = build(assemble(args.executed, args.out, student=args.student))
    sys.stdout.write(result.stdout[-3000:])
    sys.stderr.write(result.stderr[-3000:])
    if result.returncode:
        raise SystemExit(result.returncode)
    print(f"site: {args.out / '_build' / 'html' / 'index.html'}")


if __name__ == "__main__":
    main(sys.argv[1:])
