"""The course tooling: what turns the book into assignments, grades them and publishes them.

``checks`` (one module per chapter: the exercises' checks, as ``ll.checks``), ``assignments``
(student versions of the chapters), ``grade`` (``python -m logitlab.course.grade``: the grader),
``gradebook`` (points, grade sheets, Canvas and Moodle import files), ``gradescope`` (its
results.json and autograder zip), ``otter_bridge`` (the same exercises for otter-grader),
``website`` (the student edition of the site) and ``run`` (``python -m logitlab.course``: one
course setting carried into every file).

None of it is imported by ``import logitlab``; ``ll.checks`` loads on first use.
"""
