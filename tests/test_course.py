"""A course from a fork: the repository URL and its release in _config.yml are the settings,
`python -m logitlab.course` carries them into every chapter's setup cell, and nothing else names
the repository."""

import re
import shutil
import subprocess

import nbformat
import pytest
import yaml

from logitlab.course.run import (GUIDE_PAGE, ROOT, exercises, point_chapters_at, release, repository,
                                 teachers_guide)

FORK = "https://github.com/a-teacher/decoding-course"
TAG = "course-2027/v1.2"


def setup_source(nb) -> str:
    return next(c.source for c in nb.cells if c.cell_type == "code")


def test_a_fork_url_and_release_reach_every_setup_cell_and_nothing_else(tmp_path):
    shutil.copytree(ROOT / "chapters", tmp_path / "chapters")
    changed = point_chapters_at(FORK, tmp_path / "chapters", TAG)
    assert len(changed) == len(list((ROOT / "chapters").glob("*.ipynb")))
    for path in changed:
        ours, theirs = (nbformat.read(p, as_version=4) for p in (ROOT / "chapters" / path.name, path))
        assert f'REPO = "{FORK}"' in setup_source(theirs) and f'RELEASE = "{TAG}"' in setup_source(theirs)
        assert 'f"logitlab @ git+{REPO}@{RELEASE}"' in setup_source(theirs)
        differ = [i for i, (a, b) in enumerate(zip(ours.cells, theirs.cells)) if a.source != b.source]
        assert len(differ) == 1, f"{path.name}: cells {differ} changed, only the setup cell should"
        expected = ours.cells[differ[0]].source.replace(repository(), FORK)
        expected = expected.replace(f'RELEASE = "{release()}"', f'RELEASE = "{TAG}"')
        assert expected == theirs.cells[differ[0]].source
    assert point_chapters_at(FORK, tmp_path / "chapters", TAG) == []  # a second run changes nothing


@pytest.mark.parametrize("url", ["github.com/a/b", "https://github.com/a", "https://github.com/a/b\"; import os"])
def test_a_malformed_repository_url_is_refused(url, tmp_path):
    with pytest.raises(ValueError, match="repository URL"):
        point_chapters_at(url, tmp_path, "main")


@pytest.mark.parametrize("ref", ["", "-main", ".hidden", "/main", "v1..2", "a//b", "main/", "v1.", "main.lock",
                                 "main@{1}", "a b", 'main"; import os', "ma:in", "a" * 101])
def test_a_release_that_is_no_git_ref_is_refused(ref, tmp_path):
    shutil.copytree(ROOT / "chapters", tmp_path / "chapters")
    with pytest.raises(ValueError, match="release"):
        point_chapters_at(FORK, tmp_path / "chapters", ref)
    assert point_chapters_at(FORK, tmp_path / "chapters", "main")  # the same chapters with a real ref: accepted


@pytest.mark.parametrize("ref", ["main", "v1.2", "course-2027/week_3", "3f2c1e9", "0" * 40])
def test_tags_branches_and_commits_are_releases(ref, tmp_path):
    shutil.copytree(ROOT / "chapters", tmp_path / "chapters")
    point_chapters_at(FORK, tmp_path / "chapters", ref)
    assert f'RELEASE = "{ref}"' in setup_source(nbformat.read(sorted((tmp_path / "chapters").glob("*.ipynb"))[0], 4))


def test_the_release_is_read_from_the_config_and_must_be_a_quoted_ref(tmp_path):
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert release() == config["repository"]["branch"]
    for branch, error in [(None, "sets no repository.branch"), (1.0, "quote it"), ("v1..0", "release")]:
        config["repository"].pop("branch", None)
        if branch is not None:
            config["repository"]["branch"] = branch
        (tmp_path / "_config.yml").write_text(yaml.safe_dump(config))
        with pytest.raises(ValueError, match=error):
            release(tmp_path)


def test_a_setup_cell_that_installs_unpinned_is_refused(tmp_path):
    (tmp_path / "chapters").mkdir()
    for name, source in [("01_no_release", 'REPO = "x"\nPIP + [f"logitlab @ git+{REPO}"]'),
                         ("02_unpinned", 'REPO = "x"\nRELEASE = "main"\nPIP + [f"logitlab @ git+{REPO}"]'),
                         ("03_twice", 'REPO = "x"\nRELEASE = "main"\nPIP + [f"logitlab @ git+{REPO}@{RELEASE}"]\n'
                                      'PIP + [f"logitlab @ git+{REPO}"]')]:
        folder = tmp_path / "chapters" / name
        folder.mkdir()
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)]), folder / f"{name}.ipynb")
        with pytest.raises(ValueError, match="RELEASE" if name == "01_no_release" else "git\\+"):
            point_chapters_at(FORK, folder, "main")


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


def test_only_the_setup_cells_install_the_library_from_git():
    """Every install from git names the release: the setup cells' line, the publishable tree's
    README (run.py's template, from the same settings) and the pages that show them (this file's
    own unpinned examples aside)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    result = subprocess.run(["git", "grep", "-n", "-F", "logitlab @ git+", "--", ":!tests/test_course.py"], cwd=ROOT,
                            capture_output=True, text=True)
    lines = result.stdout.splitlines()
    assert result.returncode == 0 and lines, f"git grep did not work: {result.stderr}"
    unpinned = [line for line in lines if not re.search(r"git\+\{?(REPO|url)\}?@\{?(RELEASE|ref)\}?", line)]
    assert not unpinned, "installs of the library that name no release:\n" + "\n".join(unpinned)


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
