"""A course run from a fork of the book's repository: one setting, the repository URL in
``_config.yml``, and one command that makes everything else follow it::

    python -m logitlab.course

(``make student`` runs it first). It writes the URL into the setup cell of every chapter (the
line ``REPO = "..."``, from which Colab installs the library) and writes the student notebooks
(``student/chapters/``) from the chapters. The Colab buttons of both editions of the website read
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


def main(argv=None) -> None:
    url = repository()
    for path in point_chapters_at(url, ROOT / "chapters"):
        print(f"{path.relative_to(ROOT)}: now installs from {url}")
    make_student_versions([ROOT / "chapters"], ROOT / "student" / "chapters", verbose=True)


if __name__ == "__main__":
    main(sys.argv[1:])
