"""A course run from the book: two settings, the repository URL and its release in
``_config.yml`` (``repository.url``, a fork's for a course of one's own, and
``repository.branch``, the tag, branch or commit the course uses), and one command that makes
everything else follow the sources::

    python -m logitlab.course

(``make student`` runs it first). It writes both into the setup cell of every chapter (the lines
``REPO = "..."`` and ``RELEASE = "..."``, from which Colab installs the library as
``logitlab @ git+{REPO}@{RELEASE}``: the release the course was tested with, not whatever the
repository's default branch holds later), writes the student notebooks (``student/chapters/``)
from the chapters, and writes the teacher's guide (``book/teachers_guide.md``) from
``logitlab/data/exercises.yml``: each chapter's objectives and prerequisites, each exercise's
time, difficulty and points, and a rubric for every written answer. The Colab buttons of both
editions of the website read the URL and the same ``repository.branch`` from ``_config.yml`` when
the site is built, so a notebook opened from a button installs the library of the release it was
opened at. No other file names the repository, and a test checks that.

``python -m logitlab.course --publish FOLDER --site HTML`` (``make publish``) then writes the
*publishable tree*: what a repository that students can see needs, with no solution in it (see
:func:`publish`), so that the answer key can stay in a private one.

These functions work on a checkout of the repository (``ROOT``), not on an installed package.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import shutil
import sys
from pathlib import Path

import nbformat
import yaml

from .assignments import BEGIN, END, make_student_versions
from .gradebook import EXERCISES, exercise_data

ROOT = Path(__file__).resolve().parents[3]
REPO_LINE = re.compile(r'^REPO = "[^"]*"', re.M)
RELEASE_LINE = re.compile(r'^RELEASE = "[^"]*"', re.M)
INSTALL = 'f"logitlab @ git+{REPO}@{RELEASE}"'  # the setup cell's pip requirement, pinned to the release
# A plausible git ref (tag, branch or commit) that fits in a pip URL: letters, digits, ".", "_",
# "-" and "/" between names; no "..", "//", "/." or "@" (git refuses those, or pip would misread
# them), no leading "-", "." or "/", no trailing "/", "." or ".lock".
REF = re.compile(r"(?!.*(\.\.|//|/\.|\.lock$|[./]$))[A-Za-z0-9_][A-Za-z0-9._/-]{0,99}")


def repository(root: Path = ROOT) -> str:
    """The repository URL that ``_config.yml`` sets (``repository.url``)."""
    return yaml.safe_load((root / "_config.yml").read_text())["repository"]["url"]


def release(root: Path = ROOT) -> str:
    """The course's release: ``repository.branch`` in ``_config.yml``, the ref (tag, branch or
    commit) at which the Colab buttons open the notebooks and from which their setup cells install
    the library. Required: Jupyter Book's own default ("master") is rarely a repository's branch."""
    ref = (yaml.safe_load((root / "_config.yml").read_text())["repository"] or {}).get("branch")
    if ref is None:
        raise ValueError("_config.yml sets no repository.branch: set it to the release the course uses (a tag, "
                         "branch or commit)")
    if not isinstance(ref, str):  # YAML reads 1.0 as a number, and 0123 as an octal one
        raise ValueError(f"repository.branch in _config.yml must be a string: quote it (\"{ref}\")")
    return check_release(ref)


def check_release(ref: str) -> str:
    """``ref`` if it is a plausible git ref for a pip URL (``git+URL@REF``), else ``ValueError``."""
    if not isinstance(ref, str) or not REF.fullmatch(ref):
        raise ValueError(f"the release (repository.branch) must be a git tag, branch or commit such as v1.2, main or "
                         f"course-2027 (letters, digits, '.', '_', '-', '/'), got {ref!r}")
    return ref


def check_url(url: str) -> str:
    """``url`` if it looks like a repository's address (``https://github.com/OWNER/NAME``), else ``ValueError``."""
    if not isinstance(url, str) or not re.fullmatch(r"https://[\w.-]+/[\w.-]+/[\w.-]+", url):
        raise ValueError(f"the repository URL must look like https://github.com/OWNER/NAME, got {url!r}")
    return url


def point_chapters_at(url: str, chapters: Path, ref: str) -> list[Path]:
    """Write ``url`` and ``ref`` into the ``REPO = "..."`` and ``RELEASE = "..."`` lines of every
    chapter in ``chapters``; return the chapters that changed. A chapter whose first code cell lacks
    either line, or installs the library otherwise than from ``git+{REPO}@{RELEASE}``, is an error."""
    check_url(url)
    check_release(ref)
    changed = []
    for path in sorted(chapters.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        setup = next(c for c in nb.cells if c.cell_type == "code")
        for line, text in ((REPO_LINE, 'REPO = "..."'), (RELEASE_LINE, 'RELEASE = "..."')):
            if not line.search(setup.source):
                raise ValueError(f"{path}: its first code cell has no line '{text}'")
        if INSTALL not in setup.source or setup.source.count("git+") != 1:
            raise ValueError(f"{path}: its first code cell must install the library as {INSTALL}, and only so")
        source = REPO_LINE.sub(f'REPO = "{url}"', setup.source, count=1)
        source = RELEASE_LINE.sub(f'RELEASE = "{ref}"', source, count=1)
        if source != setup.source:
            setup.source = source
            nbformat.write(nb, path)
            changed.append(path)
    return changed


GUIDE_DATA = EXERCISES  # the teacher's guide data: {chapter: {title, objectives, prerequisites, exercises}}
GUIDE_PAGE = ROOT / "book" / "teachers_guide.md"
DIFFICULTY = {1: "routine", 2: "needs thought", 3: "hard"}
exercises = exercise_data


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
             "Code exercises are graded by their check (`python -m logitlab.course.grade`, see the",
             "{doc}`teaching page <teaching>`); every written exercise has a rubric: what a full, a partial",
             "and a missing answer contain. In all, the book has "
             f"{len(every)} exercises, about {round(sum(e['minutes'] for e in every) / 60)} hours of work and "
             f"{sum(e['points'] for e in every)} points.", ""]
    for number, (name, chapter) in enumerate(data.items(), start=1):
        lines += _chapter_section(number, name, chapter)
    return "\n".join(lines).rstrip() + "\n"


# The publishable tree: the student edition, in a form a public repository can hold.

PUBLIC_README = """# {title}: the student edition

The exercises of the book, without their solutions. Open a chapter in Colab (its first cell
installs the library from this repository), write your code where a cell says
`raise NotImplementedError`, and run the check cell below it:

{links}

- `student/chapters/`: the notebooks; `docs/`: the book's website for students (GitHub Pages can
  serve it from this folder);
- `lib/logitlab/`: the library the chapters use (`pip install "logitlab @ git+{url}@{ref}"`). Its checks
  (`ll.checks`) compare your answers with the library's own implementations, and refuse an answer
  that runs the library's code (the function the exercise asks you to write, or any other) where
  the exercise does not give it.
"""
SKIPPED = shutil.ignore_patterns("__pycache__", "*.pyc", "exercises.yml")  # the rubrics are answers


def publish(out: Path, *, site: Path | None = None, root: Path = ROOT) -> Path:
    """Write into ``out`` (which must not exist, or be empty) the tree a repository that students
    can see needs: ``student/chapters/`` (the student notebooks, where the student site's Colab
    buttons open them), ``lib/logitlab/`` without the teacher's guide's data (its rubrics are
    answers), ``pyproject.toml``, ``requirements.txt``, a README with each chapter's Colab link,
    and ``site`` (the student site's built HTML) as ``docs/``. Not in it: ``chapters/`` (the
    answer key), ``book/`` (its teaching page and teacher's guide), ``tests/``. Then every file
    in it is searched for every line of the chapters' solutions (:func:`leaked_solutions`): any
    found is an error. The library itself stays readable there: its functions are the reference
    answers the checks compare with."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} is not empty: the publishable tree is written into a new folder")
    if site is not None and not (Path(site) / "index.html").is_file():
        raise ValueError(f"{site} holds no built site (index.html): run `make student` first")
    config = yaml.safe_load((root / "_config.yml").read_text())
    make_student_versions([root / "chapters"], out / "student" / "chapters")
    shutil.copytree(root / "lib" / "logitlab", out / "lib" / "logitlab", ignore=SKIPPED)
    for name in ("pyproject.toml", "requirements.txt"):
        shutil.copy(root / name, out / name)
    url, ref = config["repository"]["url"], release(root)
    colab = url.replace("https://github.com/", "https://colab.research.google.com/github/")
    links = "\n".join(f"- [{path.stem}]({colab}/blob/{ref}/student/chapters/{path.name})"
                      for path in sorted((out / "student" / "chapters").glob("*.ipynb")))
    (out / "README.md").write_text(PUBLIC_README.format(title=config["title"], links=links, url=url, ref=ref))
    if site is not None:
        shutil.copytree(site, out / "docs")
        (out / "docs" / ".nojekyll").touch()  # GitHub Pages: serve _static/ and _sources/ as they are
    found = leaked_solutions(out, solution_lines(root / "chapters", root))
    if found:
        raise ValueError(f"solutions in the publishable tree {out}:\n" + "\n".join(found[:20]))
    return out


def solution_lines(chapters: Path, root: Path = ROOT, shortest: int = 12) -> list[str]:
    """Every line of the chapters' code solutions (between ``# BEGIN SOLUTION`` and ``# END
    SOLUTION``; without an inline comment; stripped) at least ``shortest`` characters long, except
    those the library's own source holds too: the library is the reference answer, published on
    purpose (a few lines such as ``scaled = logits / temperature`` are in both)."""
    library = "\n".join(path.read_text() for path in (root / "lib" / "logitlab").rglob("*.py"))
    found = set()
    for path in sorted(Path(chapters).glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            inside = False
            for line in cell.source.split("\n") if cell.cell_type == "code" else []:
                text = line.strip()
                if text in (BEGIN, END):
                    inside = text == BEGIN
                    continue
                code = text if text.startswith("#") else text.split("  #")[0].rstrip()
                if inside and len(code) >= shortest and code not in library:
                    found.add(code)
    return sorted(found)


def _text(path: Path) -> str:
    """A file's text as a reader meets it: a notebook's strings, a web page without its markup."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    if path.suffix == ".ipynb":
        try:
            strings, stack = [], [json.loads(text)]
            while stack:
                item = stack.pop()
                if isinstance(item, str):
                    strings.append(item)
                elif isinstance(item, (list, dict)):
                    stack.extend(item.values() if isinstance(item, dict) else item)
            return text + "\n" + "\n".join(strings)
        except ValueError:
            return text
    if path.suffix in (".html", ".htm"):
        return text + "\n" + html.unescape(re.sub(r"<[^>]*>", "", text))  # highlighted code is split by tags
    return text


def leaked_solutions(tree: Path, lines: list[str]) -> list[str]:
    """``"FILE: LINE"`` for every one of ``lines`` found in any file under ``tree``."""
    found = []
    for path in sorted(p for p in Path(tree).rglob("*") if p.is_file()):
        text = _text(path)
        found += [f"{path.relative_to(tree)}: {line}" for line in lines if line in text]
    return found


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m logitlab.course", description=__doc__.split("\n\n")[0])
    parser.add_argument("--publish", type=Path, metavar="FOLDER",
                        help="then write the publishable tree (no solutions) into FOLDER, which must be new or empty")
    parser.add_argument("--site", type=Path, metavar="HTML", help="with --publish: the student site's built HTML")
    args = parser.parse_args(argv)
    url = repository()
    try:
        ref = release()
    except ValueError as error:
        parser.error(str(error))
    for path in point_chapters_at(url, ROOT / "chapters", ref):
        print(f"{path.relative_to(ROOT)}: now installs from {url} at {ref}")
    make_student_versions([ROOT / "chapters"], ROOT / "student" / "chapters", verbose=True)
    GUIDE_PAGE.write_text(teachers_guide(exercises()))
    print(f"{GUIDE_PAGE.relative_to(ROOT)}: written from {GUIDE_DATA.name}")
    if args.publish:
        try:
            publish(args.publish, site=args.site)
        except ValueError as error:
            parser.error(str(error))
        print(f"{args.publish}: the publishable tree, searched for every solution line: none found")


if __name__ == "__main__":
    main(sys.argv[1:])
