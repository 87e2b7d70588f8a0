"""A course from a fork: the repository URL of _config.yml is the one setting, `python -m
logitlab.course` carries it into every chapter's setup cell, and nothing else names it."""

import re
import shutil
import subprocess

import nbformat
import pytest

from logitlab.course.run import GUIDE_PAGE, ROOT, exercises, point_chapters_at, repository, teachers_guide

FORK = "https://github.com/a-teacher/decoding-course"


def test_a_fork_url_reaches_every_setup_cell_and_nothing_else(tmp_path):
    shutil.copytree(ROOT / "chapters", tmp_path / "chapters")
    changed = point_chapters_at(FORK, tmp_path / "chapters")
    assert len(changed) == len(list((ROOT / "chapters").glob("*.ipynb")))
    for path in changed:
        ours, theirs = (nbformat.read(p, as_version=4) for p in (ROOT / "chapters" / path.name, path))
        assert f'REPO = "{FORK}"' in theirs.cells[[c.cell_type for c in theirs.cells].index("code")].source
        differ = [i for i, (a, b) in enumerate(zip(ours.cells, theirs.cells)) if a.source != b.source]
        assert len(differ) == 1, f"{path.name}: cells {differ} changed, only the setup cell should"
        assert ours.cells[differ[0]].source.replace(repository(), FORK) == theirs.cells[differ[0]].source
    assert point_chapters_at(FORK, tmp_path / "chapters") == []  # a second run changes nothing


@pytest.mark.parametrize("url", ["github.com/a/b", "https://github.com/a", "https://github.com/a/b\"; import os"])
def test_a_malformed_repository_url_is_refused(url, tmp_path):
    with pytest.raises(ValueError, match="repository URL"):
        point_chapters_at(url, tmp_path)


def test_only_the_setting_and_what_follows_it_name_the_repository():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    name = repository().removeprefix("https://github.com/")
    result = subprocess.run(["git", "grep", "-l", "-F", name], cwd=ROOT, capture_output=True, text=True)
    found = result.stdout.split()
    assert result.returncode == 0 and "_config.yml" in found, f"git grep did not work: {result.stderr}"
    allowed = {"_config.yml"} | {f"chapters/{p.name}" for p in (ROOT / "chapters").glob("*.ipynb")} \
        | {f"student/chapters/{p.name}" for p in (ROOT / "chapters").glob("*.ipynb")}
    assert set(found) <= allowed, f"these files name the repository; take it from _config.yml: {sorted(set(found) - allowed)}"


def chapter_exercises(path):
    """(label, title, check or None) of every exercise of a chapter, in order, read from its cells."""
    found = []
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "markdown":
            for title, label in re.findall(r"^:::\{exercise\}[ \t]*(.*)\n:label: ([\w-]+)", cell.source, re.M):
                found.append([label, title.strip(), None])
        elif (check := re.search(r"\bll\.checks\.(check_\w+)\(", cell.source)) and found:
            found[-1][2] = check.group(1)
    return [tuple(e) for e in found]


def test_the_guide_covers_every_exercise_as_the_chapters_have_it():
    data = exercises()
    assert list(data) == [p.stem for p in sorted((ROOT / "chapters").glob("*.ipynb"))]
    for name, chapter in data.items():
        ours = [(e["label"], e["title"], e.get("check")) for e in chapter["exercises"]]
        assert ours == chapter_exercises(ROOT / "chapters" / f"{name}.ipynb"), name
        assert chapter["objectives"] and chapter["prerequisites"], name
        for e in chapter["exercises"]:
            assert e["kind"] == ("code" if e.get("check") else "written"), e["label"]
            assert e["minutes"] > 0 and e["points"] > 0 and e["difficulty"] in (1, 2, 3), e["label"]
            if e["kind"] == "written":
                assert set(e["rubric"]) == {"full", "partial", "missing"}, f"{e['label']}: a rubric needs all three"


def test_the_guide_page_is_current():
    assert GUIDE_PAGE.read_text() == teachers_guide(exercises()), "run `python -m logitlab.course` (make student)"
