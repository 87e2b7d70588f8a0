"""The grades where a course keeps them: points for the grader's verdicts, and the files that a
learning platform's gradebook imports.

``python -m logitlab.course.grade`` gives each exercise a verdict; here the verdicts become points
(a code exercise's check is all or nothing: :func:`exercise_points`), a grade sheet with totals
(:func:`write_sheet`), a Canvas gradebook CSV (:func:`write_canvas`) and a Moodle grade import CSV
(:func:`write_moodle`). Gradescope's results.json and autograder are in :mod:`.gradescope`.

The grader knows a student only by the name of their notebook's file. A *roster* (a CSV, read by
:func:`read_roster`) maps that name to who the student is on the platform. Its header row names
its columns, in any order; ``file`` is required, the others are optional:

=========== ============================================================================
``file``    the notebook's file name without ``.ipynb`` (the grade sheet's ``student``)
``name``    the student's name (Canvas's ``Student``; matched last, after the ids)
``id``      Canvas's user id (the ``ID`` column of a Canvas gradebook export)
``sis_id``  the SIS user id (Canvas's ``SIS User ID``; Moodle's ``ID number``)
``login``   the login (Canvas's ``SIS Login ID``; Moodle's ``Username``)
``section`` Canvas's ``Section``
``email``   the e-mail address (Moodle's ``Email address``)
=========== ============================================================================

Without a roster the file's name is the student's login. With one, a notebook the roster does not
name stays on the grade sheet, marked, and is left out of the platform's file; a roster student
with no notebook gets 0 points. Each writer returns a :class:`Written` that says so in ``notes``.
"""

from __future__ import annotations

import csv
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

EXERCISES = Path(__file__).resolve().parents[1] / "data" / "exercises.yml"
ROSTER_COLUMNS = ("file", "name", "id", "sis_id", "login", "section", "email")
NOT_EXERCISES = {"student", "passed", "seconds", "note"}  # the grader's other columns
NO_NOTEBOOK = "no notebook"


# Points.

def exercise_data() -> dict:
    """The teacher's guide data, ``{chapter: {..., exercises: [...]}}``. ``$LOGITLAB_EXERCISES``
    names another file of the same form: the student edition of the library has no
    exercises.yml (its rubrics are answers), so a Gradescope autograder brings its own."""
    return yaml.safe_load(Path(os.environ.get("LOGITLAB_EXERCISES") or EXERCISES).read_text())


def _check_points(exercise: dict) -> int:
    """What passing the check earns. A code exercise that also asks for a derivation or words has
    a rubric splitting its points; ``check_points`` says the check's share."""
    if "check_points" in exercise:
        return exercise["check_points"]
    if "rubric" in exercise:
        raise ValueError(f"exercises.yml: {exercise['check']} shares its points with a written part "
                         "but has no check_points (the points its check alone decides)")
    return exercise["points"]


def _code_exercises(data: dict) -> dict[str, dict]:
    return {e["check"]: e for chapter in data.values() for e in chapter["exercises"] if e["kind"] == "code"}


def known_checks() -> list[str]:
    """Every check that grades an exercise of exercises.yml, in book order."""
    return list(_code_exercises(exercise_data()))


def exercise_points(checks) -> dict[str, int]:
    """``{check: points}`` for the checks named in ``checks`` (``check_softmax``, ...), in that
    order: what passing each check earns, all or nothing."""
    known = _code_exercises(exercise_data())
    unknown = [c for c in checks if c not in known]
    if unknown:
        raise ValueError(f"checks: no exercise in exercises.yml is graded by {', '.join(unknown)}")
    return {c: _check_points(known[c]) for c in checks}


def chapter_points(chapter: str) -> dict[str, int]:
    """``{check: points}`` of a chapter's code exercises (``01_logits_and_temperature``), in
    the notebook's order."""
    data = exercise_data()
    if chapter not in data:
        raise ValueError(f"chapter must be one of {', '.join(data)}; got {chapter!r}")
    return {e["check"]: _check_points(e) for e in data[chapter]["exercises"] if e["kind"] == "code"}


def checks_of(rows: list[dict]) -> list[str]:
    """The exercise columns of the grader's rows (every key but student, passed, seconds, note)."""
    return list(dict.fromkeys(k for row in rows for k in row if k not in NOT_EXERCISES))


def counted_checks(columns: list[str], points: dict, counted=None) -> list[str]:
    """The exercises that count: ``counted`` (a list, or one string ``"check_a,check_b"`` as on a
    command line), else all ``columns``. Each must be a column and have points."""
    if isinstance(counted, str):
        counted = [c.strip() for c in counted.split(",") if c.strip()]
    chosen = list(columns) if counted is None else list(counted)
    unknown = [c for c in chosen if c not in columns]
    if unknown or not chosen:
        raise ValueError(f"counted must name some of the graded exercises ({', '.join(columns)}); "
                         f"got {', '.join(unknown) or 'none'}")
    unpriced = [c for c in chosen if c not in points]
    if unpriced:
        raise ValueError(f"points has no entry for {', '.join(unpriced)}")
    return chosen


def earned(verdict: str, points: int) -> int:
    """All or nothing: a check's points if its verdict is ``passed``, else 0."""
    return points if verdict == "passed" else 0


# Who is who: the roster.

def read_roster(path) -> dict[str, dict]:
    """``{file: {column: value}}`` from a roster CSV (see the module's docstring)."""
    with open(path, newline="", encoding="utf-8-sig") as f:  # utf-8-sig: a spreadsheet's BOM
        reader = csv.DictReader(f)
        header = [h.strip() for h in reader.fieldnames or []]
        extra = [h for h in header if h not in ROSTER_COLUMNS]
        if "file" not in header or extra:
            raise ValueError(f"roster {path}: the header must have a 'file' column and only columns from "
                             f"{', '.join(ROSTER_COLUMNS)}; got {', '.join(header) or 'nothing'}")
        students = {}
        for line in reader:
            entry = {k.strip(): (v or "").strip() for k, v in line.items() if k}
            file = entry["file"].removesuffix(".ipynb")
            if not file:
                continue  # a blank line a spreadsheet left
            if file in students:
                raise ValueError(f"roster {path}: the file {file!r} appears twice")
            students[file] = entry | {"file": file}
    return students


def _roster(roster) -> dict | None:
    """A roster given as a file is read once; a dict is one already read."""
    return read_roster(roster) if isinstance(roster, (str, Path)) else roster


def _class_list(rows: list[dict], roster: dict | None) -> tuple[list[tuple[dict, dict | None]], list, list]:
    """``([(identity, row or None), ...], not_in_roster, no_notebook)``: each student once, the
    graded notebooks first, then the roster students with no notebook (``row`` None)."""
    stems = [r["student"] for r in rows]
    twice = sorted({s for s in stems if stems.count(s) > 1})
    if twice:  # the grader searches subfolders: a/ada.ipynb and b/ada.ipynb would be one student
        raise ValueError(f"rows: two notebooks have the same file name {', '.join(twice)}: rename one")
    if roster is None:
        return [({"file": s, "name": s, "login": s}, r) for s, r in zip(stems, rows)], [], []
    absent = [file for file in roster if file not in stems]
    pairs = [(roster.get(s, {"file": s}), r) for s, r in zip(stems, rows)] + [(roster[f], None) for f in absent]
    return pairs, [s for s in stems if s not in roster], absent


# The grade sheet.

@dataclass(frozen=True)
class Written:
    """What a writer wrote: ``students`` rows in ``path``; the notebooks ``not_in_roster``; the
    roster students with ``no_notebook`` (0 points); those the roster gives ``no_identifier`` for
    (Moodle's, left out); ``notes``, all of it in words."""
    path: Path
    students: int
    not_in_roster: tuple[str, ...] = ()
    no_notebook: tuple[str, ...] = ()
    no_identifier: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def _notes(path: Path, not_in_roster, no_notebook, left_out: bool) -> tuple[str, ...]:
    notes = []
    if not_in_roster:
        fate = "left out of it" if left_out else "kept, with no platform identity"
        notes.append(f"{path.name}: not in the roster, so {fate}: {', '.join(not_in_roster)}")
    if no_notebook:
        notes.append(f"{path.name}: in the roster but no notebook returned, so 0 points: {', '.join(no_notebook)}")
    return tuple(notes)


def _scores(row: dict | None, chosen: list[str], points: dict) -> list[int]:
    """The points each chosen exercise earned; 0 each for a student with no notebook (``None``)."""
    return [earned(row.get(c, "missing"), points[c]) if row else 0 for c in chosen]


def grade_sheet(rows: list[dict], columns: list[str], points: dict, *, counted=None, roster=None) -> list[dict]:
    """One row per student: ``student`` (the file's name), what the ``roster`` says of them (its
    columns that hold anything: name, id, ...), each counted exercise's verdict and
    ``"<check> points"``, ``total``, ``max`` and ``note``."""
    chosen, roster = counted_checks(columns, points, counted), _roster(roster)
    pairs, not_in_roster, _ = _class_list(rows, roster)
    # Who each student is, as far as the roster says: its columns beside the file's name.
    known = [c for c in ROSTER_COLUMNS if c != "file" and roster and any(who.get(c) for who in roster.values())]
    sheet = []
    for identity, row in pairs:
        line, scores = {"student": identity["file"]} | {c: identity.get(c, "") for c in known}, _scores(row, chosen, points)
        for check, score in zip(chosen, scores):
            line |= {check: row.get(check, "missing") if row else NO_NOTEBOOK, f"{check} points": score}
        note = row.get("note", "") if row else "no notebook returned: 0 points"
        if identity["file"] in not_in_roster:
            note = "; ".join(filter(None, [note, "not in the roster"]))
        sheet.append(line | {"total": sum(scores), "max": sum(points[c] for c in chosen), "note": note})
    return sheet


def write_sheet(rows, columns, points, path, *, counted=None, roster=None) -> Written:
    """:func:`grade_sheet` as a CSV file at ``path``."""
    path, roster = Path(path), _roster(roster)
    sheet = grade_sheet(rows, columns, points, counted=counted, roster=roster)
    _write_csv(path, list(sheet[0]) if sheet else ["student"], [list(line.values()) for line in sheet])
    _, not_in_roster, absent = _class_list(rows, roster)
    return Written(path, len(sheet), tuple(not_in_roster), tuple(absent),
                   notes=_notes(path, not_in_roster, absent, left_out=False))


def _write_csv(path: Path, header: list, lines: list[list]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(lines)


def _placed(rows: list[dict], roster) -> tuple[list[tuple[dict, dict | None]], list, list]:
    """:func:`_class_list` less the notebooks the roster does not name: a platform cannot be told
    whose they are."""
    pairs, not_in_roster, absent = _class_list(rows, _roster(roster))
    return [(who, row) for who, row in pairs if who["file"] not in not_in_roster], not_in_roster, absent


# Canvas: Grades > Import, read here from the importer itself,
# https://github.com/instructure/canvas-lms/blob/master/app/models/gradebook_importer.rb (a guide:
# https://teaching.resources.osu.edu/toolsets/carmencanvas/guides/calculating-final-grades/import-csv-file-carmen-grades).
# Header: Student, ID, SIS User ID, SIS Login ID, Section, then per assignment "Name (id)" for an
# existing one or a bare name (matched by title, else created). A row starting "Points Possible"
# sets the points (a new assignment's maximum). A student is matched by ID, else SIS User ID, else
# SIS Login ID, else name. A header holding a total's name (Final Score, ...) is dropped.

CANVAS_IDENTITY = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
CANVAS_NOT_ASSIGNMENTS = ("Current Score", "Current Points", "Current Grade", "Final Score", "Final Points",
                          "Final Grade", "Override Score", "Override Grade", "Override Status")


def canvas_header(assignment: str, assignment_id=None) -> str:
    """The assignment's column: ``"Name (id)"`` for an existing Canvas assignment (its id is the
    number in its address, .../assignments/ID), or the bare name to create one."""
    if not isinstance(assignment, str) or not assignment.strip() or "\n" in assignment:
        raise ValueError(f"assignment must be the assignment's name on one line; got {assignment!r}")
    clash = [name for name in CANVAS_NOT_ASSIGNMENTS if name in assignment]
    if clash or assignment.strip() in CANVAS_IDENTITY:
        raise ValueError(f"assignment {assignment!r}: Canvas reads a column named so as a total or a "
                         "student's details, not an assignment: choose another name")
    if assignment_id is None:
        if re.search(r"\(\d+\)$", assignment.strip()):
            raise ValueError(f"assignment {assignment!r} ends in '(number)', which Canvas reads as an id: "
                             "pass the id as assignment_id")
        return assignment.strip()
    if not re.fullmatch(r"[1-9]\d*", str(assignment_id)):
        raise ValueError(f"assignment_id must be Canvas's number for the assignment; got {assignment_id!r}")
    return f"{assignment.strip()} ({assignment_id})"


def write_canvas(rows, columns, points, path, *, assignment: str, assignment_id=None, counted=None,
                 roster=None) -> Written:
    """A Canvas gradebook CSV at ``path``: each student's total of the counted exercises as the
    score of one assignment, worth their maximum."""
    header, chosen = canvas_header(assignment, assignment_id), counted_checks(columns, points, counted)
    placed, not_in_roster, absent = _placed(rows, roster)
    lines = [["Points Possible", "", "", "", "", sum(points[c] for c in chosen)]]
    lines += [[who.get("name", ""), who.get("id", ""), who.get("sis_id", ""), who.get("login", ""),
               who.get("section", ""), sum(_scores(row, chosen, points))] for who, row in placed]
    path = Path(path)
    _write_csv(path, [*CANVAS_IDENTITY, header], lines)
    return Written(path, len(placed), tuple(not_in_roster), tuple(absent),
                   notes=_notes(path, not_in_roster, absent, left_out=True))


# Moodle: Grades > Import > CSV file. One header row, then one row per student; on the import's
# preview page the teacher maps one column to a user field ("Map from" the column, "Map to"
# useremail, username or useridnumber) and each grade column to a grade item, or to a new one
# (https://docs.moodle.org/311/en/Grade_import; the importer is
# https://github.com/moodle/moodle/blob/main/grade/import/csv/classes/load_data.php). A row whose
# identifier matches nobody stops the whole import, and one whose identifier is blank is taken as
# the row above's student: every row written here has the chosen identifier.

MOODLE_IDENTIFIERS = {"email": ("Email address", "email"), "username": ("Username", "login"),
                      "idnumber": ("ID number", "sis_id")}


def write_moodle(rows, columns, points, path, *, assignment: str, identifier: str = "username",
                 per_exercise: bool = False, counted=None, roster=None) -> Written:
    """A Moodle grade import CSV at ``path``: the ``identifier`` column (``email``, ``username``
    or ``idnumber``: map it to useremail, username or useridnumber), the student's name (for
    reading; leave it ignored), then the counted exercises' total as the grade item
    ``assignment``, or with ``per_exercise`` one grade item ``"<assignment>: <check>"`` per
    exercise instead (map either, never both: Moodle would count the points twice)."""
    if identifier not in MOODLE_IDENTIFIERS:
        raise ValueError(f"identifier must be one of {', '.join(MOODLE_IDENTIFIERS)}; got {identifier!r}")
    if roster is None and identifier != "username":
        raise ValueError(f"identifier {identifier!r} needs a roster: without one a student is known only by "
                         "the file's name, written as the username")
    if not isinstance(assignment, str) or not assignment.strip():
        raise ValueError(f"assignment must be the grade item's name; got {assignment!r}")
    title, field = MOODLE_IDENTIFIERS[identifier]
    chosen = counted_checks(columns, points, counted)
    placed, not_in_roster, absent = _placed(rows, roster)
    grades = [f"{assignment}: {c}" for c in chosen] if per_exercise else [assignment]
    lines, nameless = [], []
    for who, row in placed:
        if not who.get(field):
            nameless.append(who["file"])
            continue
        scores = _scores(row, chosen, points)
        lines.append([who[field], who.get("name", ""), *(scores if per_exercise else [sum(scores)])])
    path = Path(path)
    _write_csv(path, [title, "Full name", *grades], lines)
    notes = _notes(path, not_in_roster, absent, left_out=True)
    if nameless:
        notes += (f"{path.name}: no {field} in the roster, so left out of it: {', '.join(nameless)}",)
    return Written(path, len(lines), tuple(not_in_roster), tuple(absent), tuple(nameless), notes=notes)
