"""`python -m logitlab.course.grade`: the grader's own checks decide, on the functions it takes from each
notebook and runs in a sandbox; each returned notebook also runs in its own kernel and scratch
folder, which can only take points away. Each exercise gets passed, failed (with the check's
message), not attempted, error, timeout or missing; a broken notebook gets a row saying so and
the run goes on. Notebooks that cheat in every way we could think of get no points; the
chapters' own solutions keep theirs; careless answers get, word for word, the verdict the check
gives in the student's own notebook."""

import contextlib
import csv
import io
import json
import math
from pathlib import Path

import nbformat
import pytest
import torch

import logitlab as ll
from logitlab.course.checks import CheckFailed
from logitlab.course.grade import check_notebook, exercise_code, grade, main, notebook_status
from logitlab.course.wire import Unreadable
from logitlab.course.wire import decode as _decode
from logitlab.course.wire import encode as _encode
from logitlab.course.wire import write_back as _write_back

ROOT = Path(__file__).resolve().parents[1]


def _jail_missing() -> str | None:
    from logitlab.course import jail

    try:
        jail.check()
    except jail.JailUnavailable as error:
        return str(error)
    return None


# The grader jails students' code with bubblewrap; .ci/run installs it, so CI always runs these.
needs_jail = pytest.mark.skipif(_jail_missing() is not None, reason=f"no jail here: {_jail_missing()}")
SETUP = "import logitlab as ll\nimport torch"
RIGHT = "def expected_tokens(alpha, gamma):\n    return sum(alpha ** i for i in range(gamma + 1))\n\nll.checks.check_expected_tokens(expected_tokens)"
WRONG = "def expected_tokens(alpha, gamma):\n    return 1 / (1 - alpha)\n\nll.checks.check_expected_tokens(expected_tokens)"
UNWRITTEN = ("def expected_tokens(alpha, gamma):\n    raise NotImplementedError(\"Exercise: write your solution here\")\n\n"
             "ll.checks.check_expected_tokens(expected_tokens)")
SOFTMAX = "def sm(z, t):\n    return torch.softmax(z / t, -1) if t > 0 else torch.nn.functional.one_hot(z.argmax(-1), z.shape[-1]).float()\n\nll.checks.check_softmax(sm)"
SHORT_CUT = "ll.checks.check_softmax(lambda z, t: ll.softmax(z, t))"

# Mallory cheats at the top level of her notebook: in her own run every check says it passed.
MALLORY = [
    SETUP,
    # the checks themselves, patched; torch's comparisons, patched
    "import logitlab.course.checks.common as common\nimport torch.testing\n"
    "ll.checks.check_top_k = lambda fn: print('check_top_k: all 8 cases passed.')\n"
    "ll.checks.ch06_speculative.call = lambda fn, case, *args: ll.speculative.expected_tokens(*args)\n"
    "common.call = common.call_unchanged = lambda fn, case, *args, **kwargs: fn(*args)\n"
    "torch.allclose = lambda *args, **kwargs: True\ntorch.testing.assert_close = lambda *args, **kwargs: None",
    # the pass line, printed
    "def sm(z, t):\n    return z\n\ntry:\n    ll.checks.check_softmax(sm)\nexcept Exception:\n"
    "    print('check_softmax: all 14 cases passed.')",
    "def my_top_k(logits, k):\n    return logits\n\nll.checks.check_top_k(my_top_k)",
    UNWRITTEN,
]


def notebook(folder, name, *cells):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbformat.write(nb, folder / f"{name}.ipynb")
    return nb


@pytest.mark.slow
@needs_jail
def test_a_class_is_graded_exercise_by_exercise(tmp_path):
    class_ = tmp_path / "returned"
    class_.mkdir()
    notebook(class_, "ada", SETUP, RIGHT, SOFTMAX)
    notebook(class_, "bob", SETUP, WRONG, SHORT_CUT)
    notebook(class_, "cy", SETUP, UNWRITTEN, "undefined_name + 1\nll.checks.check_softmax(None)")
    hog = "try:\n    hog = torch.ones(2 * 2**30)  # 8 GiB: over the limit\n    limited = False\nexcept RuntimeError:\n    limited = True"
    notebook(class_, "dee", SETUP, hog, "assert limited, 'no memory limit'\n" + RIGHT)  # deleted the softmax exercise
    notebook(class_, "eve", SETUP, "open('../../stolen.txt', 'w').write('x')\nimport time\ntime.sleep(60)", RIGHT, SOFTMAX)
    (class_ / "fay.ipynb").write_text("{ not json")
    notebook(class_, "mallory", *MALLORY)
    executed = tmp_path / "executed"
    rows = {r["student"]: r for r in grade(class_, tmp_path / "grades.csv", timeout=15, memory_gb=6, keep=executed, run=True)}

    assert rows["ada"]["check_expected_tokens"] == rows["ada"]["check_softmax"] == "passed"
    assert rows["bob"]["check_expected_tokens"].startswith("failed: expected_tokens(")
    assert "asks for your own implementation" in rows["bob"]["check_softmax"]
    assert rows["cy"]["check_expected_tokens"] == "not attempted"
    assert rows["cy"]["check_softmax"].startswith("error: NameError")
    assert rows["dee"]["check_softmax"] == "missing" and "deleted" in rows["dee"]["note"]
    assert rows["dee"]["check_expected_tokens"] == "passed"  # the memory limit stopped one cell, not the notebook
    assert rows["eve"]["check_expected_tokens"] == "timeout" and "timed out" in rows["eve"]["note"]
    assert rows["fay"]["check_softmax"] == "not graded" and "not a valid notebook" in rows["fay"]["note"]
    assert rows["mallory"]["check_softmax"].startswith("failed: Case 1 of 14")
    assert rows["mallory"]["check_top_k"].startswith("failed: Case 1 of")
    assert rows["mallory"]["check_expected_tokens"] == "not attempted"
    assert [rows[s]["passed"] for s in ["ada", "bob", "cy", "dee", "eve", "fay", "mallory"]] == [2, 0, 0, 1, 0, 0, 0]
    # Mallory's own run did say that every check passed, and raised nothing: her cheats work in a notebook.
    printed = "".join("".join(o.get("text", "")) for c in json.loads((executed / "mallory.ipynb").read_text())["cells"]
                      for o in c.get("outputs", []))
    assert all(f"{check}: all" in printed for check in ["check_softmax", "check_top_k", "check_expected_tokens"]), printed
    assert "error" not in {o["output_type"] for c in json.loads((executed / "mallory.ipynb").read_text())["cells"]
                           for o in c.get("outputs", [])}
    with open(tmp_path / "grades.csv") as f:
        sheet = list(csv.DictReader(f))
    assert [r["student"] for r in sheet] == ["ada", "bob", "cy", "dee", "eve", "fay", "mallory"]
    assert list(sheet[0]) == ["student", "check_expected_tokens", "check_expected_tokens points", "check_softmax",
                              "check_softmax points", "check_top_k", "check_top_k points", "total", "max", "note"]
    # points: the teacher's guide's, all or nothing (check_expected_tokens: 2 of its exercise's 5, the rest written)
    assert [(r["student"], r["total"], r["max"]) for r in sheet][:2] == [("ada", "6", "9"), ("bob", "0", "9")]
    assert not (tmp_path / "stolen.txt").exists() and not list(tmp_path.glob("*/stolen.txt"))


KEY = 'pathlib.Path(ll.__file__).resolve().parents[2] / "chapters"'  # the answer key, where the library's checkout is
SOLUTION = {  # a correct body, for cheats that first try something the sandbox must refuse
    "tree_mask": "    mask = torch.eye(len(parents), dtype=torch.bool)\n    for i, p in enumerate(parents):\n"
                 "        if p >= 0:\n            mask[i] |= mask[p]\n    return mask\n",
    "tree_positions": "    positions = []\n    for p in parents:\n        positions.append(offset if p < 0 else positions[p] + 1)\n"
                      "    return torch.tensor(positions, dtype=torch.long)\n",
    "typical": "    kept = 0\n    for i, d in enumerate(draft_tokens.tolist()):\n"
               "        entropy = -torch.xlogy(p[i], p[i]).sum().item()\n"
               "        if p[i, d].item() > min(epsilon, delta * math.exp(-entropy)):\n            kept += 1\n"
               "        else:\n            break\n    return kept\n",
    "keep_best": "    best = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)[:budget]\n    kept = sorted(best)\n"
                 "    place = {node: j for j, node in enumerate(kept)}\n"
                 "    return kept, [-1 if parents[i] == -1 else place[parents[i]] for i in kept]\n",
    "after_rejection": "    if q is None:\n        left = r.clone()\n        left[token] = 0\n    else:\n"
                       "        left = (r / r.sum() - q).clamp_min(0)\n    return left if left.sum() > 0 else r\n",
    "fewest": "    into = [[] for _ in moves]\n    for state, targets in enumerate(moves):\n        for target in targets:\n"
              "            into[target].append(state)\n    best = [0 if a else None for a in accepting]\n"
              "    queue = collections.deque(s for s, a in enumerate(accepting) if a)\n    while queue:\n"
              "        target = queue.popleft()\n        for state in into[target]:\n            if best[state] is None:\n"
              "                best[state] = best[target] + 1\n                queue.append(state)\n    return best\n",
}
READ_THE_KEY = f"""def my_top_k(logits, k):
    import json, pathlib
    cells = ["".join(c["source"]) for c in json.loads(({KEY} / "02_truncation.ipynb").read_text())["cells"]]
    answer = next(c for c in cells if "ll.checks.check_top_k(" in c and "BEGIN SOLUTION" in c)
    namespace = {{"torch": torch}}
    exec(answer.split("ll.checks.check_top_k")[0], namespace)
    return namespace[answer.split("ll.checks.check_top_k(")[1].split(")")[0]](logits, k)
"""
# One cheat per exercise, each run in the sandbox: none may earn a point.
CHEATS = {
    "check_softmax": "from logitlab.probs import softmax as my_softmax\n\nll.checks.check_softmax(my_softmax)",
    "check_gumbel_max": "def gumbel_max_sample(logits, generator):\n    return ll.gumbel_max(logits, generator=generator)\n\n"
                        "ll.checks.check_gumbel_max(gumbel_max_sample)",
    "check_top_k": READ_THE_KEY + "\nll.checks.check_top_k(my_top_k)",
    "check_top_p": "import json, pathlib\n"
                   f"_cells = [''.join(c['source']) for c in json.loads(({KEY} / '02_truncation.ipynb').read_text())['cells']]\n"
                   "exec(next(c for c in _cells if 'll.checks.check_top_p(' in c and 'BEGIN SOLUTION' in c)"
                   ".split('ll.checks.check_top_p')[0])\nll.checks.check_top_p(my_top_p)",
    "check_frequency_penalty": "def frequency_penalty(logits, prev_tokens, penalty):\n    import torch.testing\n"
                               "    torch.allclose = torch.equal = lambda *args, **kwargs: True\n"
                               "    torch.testing.assert_close = lambda *args, **kwargs: None\n"
                               "    torch.Tensor.__eq__ = torch.Tensor.le = lambda *args: torch.tensor(True)\n"
                               "    return logits.clone()\n\nll.checks.check_frequency_penalty(frequency_penalty)",
    "check_stop_position": "import logitlab.course.checks.common as common\n\n"
                           "def stop_position(pieces, stops, _=[setattr(common, 'CheckFailed', type('Quiet', (BaseException,), {})),\n"
                           "                                    setattr(ll.checks, 'check_stop_position', lambda fn: None)]):\n"
                           "    return -1\n\nll.checks.check_stop_position(stop_position)",
    # answers the library computed at the top level of an earlier cell (see below), looked up
    "check_expected_tokens": "def expected_tokens(alpha, gamma):\n    return ANSWERS[alpha, gamma]\n\n"
                             "ll.checks.check_expected_tokens(expected_tokens)",
    "check_match_probability": "class Agreeable(torch.Tensor):\n    @classmethod\n"
                               "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
                               "        if func in (torch.allclose, torch.equal, torch.isclose, torch.Tensor.__eq__,\n"
                               "                    torch.Tensor.allclose):\n"
                               "            return True\n        return super().__torch_function__(func, types, args, kwargs or {})\n\n"
                               "def match_probability(p):\n    return torch.zeros(p.shape[:-1]).as_subclass(Agreeable)\n\n"
                               "ll.checks.check_match_probability(match_probability)",
    # each of these first tries what the sandbox refuses; had it worked, the answer would be right
    "check_tree_mask": "def tree_mask(parents):\n    import os\n    os.kill(os.getppid(), 0)  # signal 0: is the grader there?\n"
                       + SOLUTION["tree_mask"] + "\nll.checks.check_tree_mask(tree_mask)",
    "check_tree_positions": "def tree_positions(parents, offset):\n    import subprocess\n    subprocess.run(['true'], check=True)\n"
                            + SOLUTION["tree_positions"] + "\nll.checks.check_tree_positions(tree_positions)",
    "check_typical_accept": "def typical_accept_one(draft_tokens, p, epsilon, delta):\n    import os\n    if os.fork() == 0:\n"
                            "        os._exit(0)\n" + SOLUTION["typical"] + "\nll.checks.check_typical_accept(typical_accept_one)",
    "check_keep_best": "def keep_best(scores, parents, budget):\n    import ctypes\n    ctypes.CDLL(None).getpid()\n"
                       + SOLUTION["keep_best"] + "\nll.checks.check_keep_best(keep_best)",
    "check_after_rejection": "def after_rejection(r, token, q=None):\n    import pathlib\n"
                             f"    torch.from_file(str({KEY} / '09_feature_drafting.ipynb'), size=16, dtype=torch.uint8)\n"
                             + SOLUTION["after_rejection"] + "\nll.checks.check_after_rejection(after_rejection)",
    # a file descriptor freed by closing the grader's pipe: the key is read, and the sandbox can no longer answer
    "check_fewest_tokens": "import collections\n\ndef fewest_tokens(moves, accepting):\n    import os, pathlib\n"
                           "    with contextlib.suppress(OSError):\n        os.close(0)\n"
                           f"    ({KEY} / '11_constrained_decoding.ipynb').read_text()\n"
                           + SOLUTION["fewest"] + "\nll.checks.check_fewest_tokens(fewest_tokens)",
}


def chapter_cell(check: str) -> str:
    """The cell of the chapters that holds ``check``'s exercise, with its solution."""
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if f"ll.checks.{check}(" in cell.source and "# BEGIN SOLUTION" in cell.source:
                return cell.source
    raise LookupError(check)


def setup_cell() -> str:
    """Chapter 1's setup cell, as every chapter (and so every returned notebook) starts."""
    return next(c.source for c in nbformat.read(sorted((ROOT / "chapters").glob("*.ipynb"))[0], as_version=4).cells
                if c.cell_type == "code")


def in_process(check: str, cell: str) -> str:
    """The verdict of ``check`` run in this process on the function ``cell`` defines."""
    head, argument = cell.rsplit(f"ll.checks.{check}(", 1)
    namespace = {"torch": torch, "ll": ll, "math": math, "contextlib": contextlib}
    exec(head, namespace)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            getattr(ll.checks, check)(namespace[argument.split(")")[0]])
        return "passed"
    except NotImplementedError:
        return "not attempted"
    except CheckFailed as failure:
        return f"failed: {str(failure).strip()}"


# Mistakes the sandbox could hide if it were careless: an argument changed in place, the input
# returned as the answer, an error, a type the checks do not expect, an unwritten exercise.
CARELESS = {
    "check_gumbel_max": "def gumbel_max_sample(logits, generator):\n"
                        "    u = torch.rand(logits.shape, generator=generator).clamp_min(1e-12)\n"
                        "    logits += -torch.log(-torch.log(u))\n    return logits.argmax(dim=-1)\n\n"
                        "ll.checks.check_gumbel_max(gumbel_max_sample)",
    "check_top_k": "def my_top_k(logits, k):\n    if k >= logits.shape[-1]:\n        return logits\n"
                   "    kth = torch.topk(logits, k, dim=-1).values[..., -1:]\n"
                   "    return logits.masked_fill(logits < kth, float('-inf'))\n\nll.checks.check_top_k(my_top_k)",
    "check_frequency_penalty": "def frequency_penalty(logits, prev_tokens, penalty):\n"
                               "    counts = torch.zeros_like(logits).scatter_add_(-1, prev_tokens.clamp_min(0), "
                               "torch.ones_like(prev_tokens, dtype=logits.dtype))\n"
                               "    return logits.sub_(penalty * counts)\n\nll.checks.check_frequency_penalty(frequency_penalty)",
    "check_stop_position": "def stop_position(pieces, stops):\n    return min(''.join(pieces).index(s) for s in stops)\n\n"
                           "ll.checks.check_stop_position(stop_position)",
    "check_tree_positions": "def tree_positions(parents, offset):\n    return [offset + i for i in range(len(parents))]\n\n"
                            "ll.checks.check_tree_positions(tree_positions)",
    "check_expected_tokens": UNWRITTEN,
}


@pytest.mark.slow
@needs_jail
def test_cheats_get_no_points_honest_answers_keep_theirs_and_mistakes_their_verdicts(tmp_path):
    # Every check but check_verify (20,000 calls: 25 s here), on the chapters' own solutions.
    every = [name for name in ll.checks.__all__ if name.startswith("check_") and name != "check_verify"]
    honest = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in [setup_cell(), *map(chapter_cell, every)]])
    verdicts = check_notebook(json.loads(nbformat.writes(honest)), every, tmp_path / "honest", timeout=300, memory_gb=6)
    assert verdicts == dict.fromkeys(every, "passed")

    checks = list(CHEATS)

    # The cheat that reads the answer key does work where the check runs in the student's process.
    assert in_process("check_top_k", READ_THE_KEY + "\nll.checks.check_top_k(my_top_k)") == "passed"
    earlier = "ANSWERS = {(a / 10, g): ll.speculative.expected_tokens(a / 10, g) for a in range(11) for g in range(9)}"
    cheats = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in [setup_cell(), "import contextlib", earlier,
                                                                                    *CHEATS.values()]])
    verdicts = check_notebook(json.loads(nbformat.writes(cheats)), checks, tmp_path / "cheats", timeout=300, memory_gb=6)
    assert not [check for check, verdict in verdicts.items() if verdict == "passed"], verdicts
    assert "library's own code (ll.probs.softmax)" in verdicts["check_softmax"]
    assert "library's own code (ll.sampling.draw.gumbel_max)" in verdicts["check_gumbel_max"]
    assert "Too many open files" in verdicts["check_top_k"] and verdicts["check_top_k"].startswith("failed:")
    assert verdicts["check_top_p"].startswith("error: OSError") and "Too many open files" in verdicts["check_top_p"]
    assert "NameError" in verdicts["check_expected_tokens"]
    for check, refused in [("check_tree_mask", "os.kill"), ("check_tree_positions", "subprocess.Popen"),
                           ("check_typical_accept", "os.fork"), ("check_keep_best", "ctypes.dlopen")]:
        assert f"does not allow {refused}" in verdicts[check], verdicts[check]
    assert "Too many open files" in verdicts["check_after_rejection"]
    # the pipe closed and the key opened: in the jail the key is not there, and the sandbox ends
    assert any(why in verdicts["check_fewest_tokens"] for why in ["ended or answered out of turn", "No such file"])
    for check in ["check_frequency_penalty", "check_stop_position", "check_match_probability"]:
        assert verdicts[check].startswith("failed: Case"), verdicts[check]

    careless = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in [SETUP, *CARELESS.values()]])
    verdicts = check_notebook(json.loads(nbformat.writes(careless)), list(CARELESS), tmp_path / "careless", timeout=300,
                              memory_gb=6)
    expected = {check: in_process(check, cell) for check, cell in CARELESS.items()}
    assert "passed" not in expected.values() and "changed the logits" in expected["check_gumbel_max"]
    assert "tensor it was given itself" in expected["check_top_k"] and "changed" in expected["check_frequency_penalty"]
    assert verdicts == expected


def test_only_definitions_cross_over_from_earlier_cells():
    cells = ["%pip install something\nimport math\nX = 2.5\nY = math.pi\nprint('hello')\ndef helper(a=1):\n    return a",
             "this is not python",
             "class Tool:\n    pass\nZ = [1, (2, 'three')]\nopen('key').read()",
             "import json\nlocal = json.dumps(1)\ndef f(x):\n    return helper(x)\n\nll.checks.check_softmax(f)\nprint(f(1))"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    statements, own, argument = exercise_code(nb, "check_softmax")
    assert statements[:own] == ["import math", "X = 2.5", "def helper(a=1):\n    return a", "class Tool:\n    pass",
                                "Z = [1, (2, 'three')]"]
    assert statements[own:] == ["import json", "local = json.dumps(1)", "def f(x):\n    return helper(x)"]
    assert argument == "f"
    wrapped = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "f = 1\ntry:\n    ll.checks.check_top_k(lambda z, k: z)\nexcept Exception:\n    pass")])
    assert exercise_code(wrapped, "check_top_k") == (["f = 1"], 0, "lambda z, k: z")
    assert exercise_code(wrapped, "check_softmax") is None
    with pytest.raises(ValueError, match="does not call"):
        exercise_code(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("ll.checks.check_top_k()")]), "check_top_k")
    with pytest.raises(SyntaxError):
        exercise_code(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("def (:\nll.checks.check_top_k(f)")]),
                      "check_top_k")


def test_what_comes_back_from_the_sandbox_is_plain_data():
    given = [torch.arange(6.0).reshape(2, 3)[:, 1], torch.Generator().manual_seed(3), [1, [2.5, "x"]], {1: (2, b"\x00")}]
    back = _decode(json.loads(json.dumps(_encode(given))))
    assert torch.equal(back[0], given[0]) and back[1].get_state().equal(given[1].get_state()) and back[2:] == given[2:]
    for odd in [torch.ones(2, dtype=torch.bfloat16), torch.tensor(True), torch.zeros(0, 3), torch.ones(1, 2).t()]:
        assert torch.equal(_decode(_encode(odd)), odd) and _decode(_encode(odd)).dtype == odd.dtype

    class Liar(int):
        def __eq__(self, other):
            return True

    class Anything:
        def __eq__(self, other):
            return True

    assert type(_decode(_encode(Liar(3)))) is int and _decode(_encode(Liar(3))) != 4
    assert isinstance(_decode(_encode(Anything())), Unreadable) and _decode(_encode(Anything())) != 1
    assert type(_decode(_encode(Anything()))).__name__ == "Anything"
    logits = torch.zeros(2, 3)
    assert _decode(_encode(logits, [logits]), [logits]) is logits  # an input returned is the input, for the checks
    assert _decode({"tensor": ["float32", [2], "AAAAAAAAgD8="]}).tolist() == [0.0, 1.0]
    with pytest.raises(Exception):
        _decode({"pickle": "cos\nsystem\n"})
    old, generator = [torch.zeros(2), [1, 2]], torch.Generator().manual_seed(0)
    moved = torch.Generator().manual_seed(0)
    torch.rand(3, generator=moved)
    _write_back(old, [torch.ones(2), [1, 2, 3]])
    _write_back(generator, moved)
    assert old[0].tolist() == [1.0, 1.0] and old[1] == [1, 2, 3] and generator.get_state().equal(moved.get_state())


def test_the_notebooks_own_run_only_takes_points_away():
    done = {"metadata": {"execution": {"iopub.status.idle": "2026-01-01"}}}
    printed = done | {"outputs": [{"output_type": "stream", "text": "check_softmax: all 14 cases passed."}]}
    assert notebook_status(printed, False) is None  # what it printed is not read: the grader's check decides
    failed = done | {"outputs": [{"output_type": "error", "ename": "CheckFailed", "evalue": "x"}]}
    assert notebook_status(failed, False) is None
    crashed = done | {"outputs": [{"output_type": "error", "ename": "ValueError", "evalue": "bad\nmore"}]}
    assert notebook_status(crashed, False) == "error: ValueError: bad"
    assert notebook_status({"outputs": []}, True) == "timeout" and notebook_status({}, False) == "no result"


def test_a_notebooks_run_waits_for_replies_in_slices(tmp_path, monkeypatch):
    """Each returned notebook's run listens to its kernel as the chapters' runs do
    (``listen_in_slices``): a widget cell's missed reply would otherwise hold the run until the
    cell's timeout and mark the honest exercises after it "timeout"."""
    from logitlab.course import grade as grader

    listened = []
    monkeypatch.setattr(grader, "listen_in_slices", listened.append)
    notebook(tmp_path, "ada", "x = 6 * 7\nprint(x)")
    grader.run_in_child(tmp_path / "ada.ipynb", cell_timeout=60)
    assert [type(c).__name__ for c in listened] == ["AsyncZMQSocketChannel"] * 2 and listened[0] is not listened[1]
    assert "".join(json.loads((tmp_path / "ada.ipynb").read_text())["cells"][0]["outputs"][0]["text"]) == "42\n"


def test_bad_arguments_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path / "nowhere")])
    assert "folder must be a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path)])  # empty
    assert "no .ipynb notebook" in capsys.readouterr().err


# The second round of cheats (issue 84): the library's code under other names, the tracer
# attacked, the grades rewritten by a process that outlives the run, answers looked up in a table.
LIBRARY_UNDER_OTHER_NAMES = {
    "check_softmax": "def sm(z, t):\n    return ll.log_softmax(z, t).exp()\n\nll.checks.check_softmax(sm)",
    "check_top_k": "import types\n\ndef my_top_k(logits, k, _copy=types.FunctionType(ll.sampling.truncation.top_k.__code__, {})):\n"
                   "    return _copy(logits, k)\n\nll.checks.check_top_k(my_top_k)",
    "check_top_p": "import functools\n\nll.checks.check_top_p(functools.partial(ll.sampling.truncation.top_p))",
    "check_tree_mask": "class Lazy:\n    def __init__(self, parents):\n        self.parents = parents\n"
                       "    def tolist(self):\n        return ll.tree_attention_mask(self.parents).tolist()\n    dtype = 'bool'\n\n"
                       "def tree_mask(parents):\n    return Lazy(parents)\n\nll.checks.check_tree_mask(tree_mask)",
    "check_tree_positions": "import sys\n\ndef tree_positions(parents, offset):\n    sys.settrace(None)\n"
                            "    return ll.tree_position_ids(parents, offset)\n\nll.checks.check_tree_positions(tree_positions)",
    "check_expected_tokens": "import sys\n\ndef expected_tokens(alpha, gamma):\n    tracer = sys.gettrace()\n"
                             "    if tracer is not None:\n        tracer.__closure__[0].cell_contents.clear()\n"
                             "    return ll.speculative.expected_tokens(alpha, gamma)\n\nll.checks.check_expected_tokens(expected_tokens)",
    "check_match_probability": "import threading\n\ndef match_probability(p):\n    out = []\n"
                               "    worker = threading.Thread(target=lambda: out.append(ll.speculative.typical.match_probability(p)))\n"
                               "    worker.start()\n    worker.join()\n    return out[0]\n\n"
                               "ll.checks.check_match_probability(match_probability)",
}


@pytest.mark.slow
@needs_jail
def test_the_library_runs_under_no_name_in_a_students_function(tmp_path):
    """However a student's function reaches the library's code (another function giving the same
    answer, a copy of the asked-for function's code, the library function itself handed to the
    check, a method of the value it returns, after trying to switch the tracer off, or in a
    thread), the grader sees it and the exercise earns nothing."""
    cells = [setup_cell(), *LIBRARY_UNDER_OTHER_NAMES.values()]
    nb = json.loads(nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])))
    verdicts = check_notebook(nb, list(LIBRARY_UNDER_OTHER_NAMES), tmp_path, timeout=300, memory_gb=6, seed=1)
    assert not [check for check, verdict in verdicts.items() if verdict == "passed"], verdicts
    assert "library's own code (ll.probs.log_softmax)" in verdicts["check_softmax"]
    assert "does not allow object.__getattr__" in verdicts["check_top_k"]  # reading the code object
    assert "library's own code (ll.sampling.truncation.top_p)" in verdicts["check_top_p"]
    assert "library's own code (ll.decoding.tree_shape.tree_attention_mask)" in verdicts["check_tree_mask"]
    assert "does not allow sys.settrace" in verdicts["check_tree_positions"]
    assert "library's own code (ll.speculative" in verdicts["check_expected_tokens"], verdicts["check_expected_tokens"]
    assert "does not allow new threads" in verdicts["check_match_probability"]


@pytest.mark.slow
@needs_jail
def test_a_notebook_cannot_outlive_its_run_nor_touch_the_grades(tmp_path):
    """A notebook whose run starts a process that waits for the grader to finish, then rewrites
    the grade sheet (and one that tries to write beside the submissions at once): the process
    dies with the run, the sheet is the grader's, and nothing is written outside the run's own
    scratch folder."""
    import subprocess
    import time

    class_, sheet = tmp_path / "returned", tmp_path / "grades.csv"
    class_.mkdir()
    forge = ("student,check_softmax,passed,seconds,note\\nmallory,passed,1,0,\\n")
    rewrite = (f"import subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 20; printf \"{forge}\" > {sheet}; "
               f"touch {tmp_path}/escaped'], start_new_session=True)\n"
               f"open('{class_}/ada.ipynb', 'a').write('x')")
    notebook(class_, "mallory", SETUP, rewrite, "def sm(z, t):\n    raise NotImplementedError\n\nll.checks.check_softmax(sm)")
    notebook(class_, "ada", SETUP, SOFTMAX)
    started = time.monotonic()
    rows = {r["student"]: r for r in grade(class_, sheet, timeout=120, memory_gb=6, run=True, workers=1)}
    assert rows["mallory"]["check_softmax"].startswith("error: PermissionError") or rows["mallory"]["check_softmax"] == "not attempted"
    assert rows["ada"]["check_softmax"] == "passed" and rows["mallory"]["passed"] == 0
    written = sheet.read_text()
    time.sleep(max(0.0, 25 - (time.monotonic() - started)))  # past the forger's 20 s
    assert sheet.read_text() == written and "mallory,passed" not in written
    assert not (tmp_path / "escaped").exists() and json.loads((class_ / "ada.ipynb").read_text())
    assert subprocess.run(["pgrep", "-f", "sleep 20; printf"], capture_output=True).returncode == 1  # no such process


@pytest.mark.slow
@needs_jail
def test_the_command_line_writes_the_sheet_and_the_gradebooks(tmp_path, capsys):
    """One call of the command: a chapter's exercises as columns (a deleted one included), the
    exercises that count, a roster, and the Canvas, Moodle and Gradescope files from the same
    verdicts; the points are the teacher's guide's."""
    class_ = tmp_path / "returned"
    class_.mkdir()
    notebook(class_, "ada", SETUP, SOFTMAX)  # the Gumbel-max exercise deleted
    notebook(class_, "bob", SETUP, SHORT_CUT)
    (tmp_path / "roster.csv").write_text("file,name,id,login,email\nada,Ada L,101,ada,ada@uni.edu\n"
                                         "bob,Bob K,102,bob,bob@uni.edu\ncy,Cy D,103,cy,cy@uni.edu\n")
    main([str(class_), "--chapter", "01_logits_and_temperature", "--out", str(tmp_path / "grades.csv"),
          "--count", "check_softmax", "--roster", str(tmp_path / "roster.csv"), "--assignment", "Chapter 1",
          "--canvas", str(tmp_path / "canvas.csv"), "--moodle", str(tmp_path / "moodle.csv"), "--moodle-identifier", "email"])
    printed = capsys.readouterr().out
    assert "cy" in printed and "2 notebooks graded" in printed  # a roster student with no notebook is reported
    with open(tmp_path / "grades.csv") as f:
        sheet = {r["student"]: r for r in csv.DictReader(f)}
    assert sheet["ada"]["check_softmax"] == "passed" and sheet["ada"]["total"] == "4" and sheet["ada"]["max"] == "4"
    assert sheet["bob"]["check_softmax"].startswith("failed:") and sheet["bob"]["total"] == "0"
    assert sheet["cy"]["total"] == "0"
    canvas = (tmp_path / "canvas.csv").read_text().splitlines()
    assert canvas[:4] == ["Student,ID,SIS User ID,SIS Login ID,Section,Chapter 1", "Points Possible,,,,,4",
                          "Ada L,101,,ada,,4", "Bob K,102,,bob,,0"]
    moodle = (tmp_path / "moodle.csv").read_text().splitlines()
    assert moodle[0] == "Email address,Full name,Chapter 1" and "ada@uni.edu,Ada L,4" in moodle

    one = tmp_path / "one"
    one.mkdir()
    notebook(one, "ada", SETUP, SOFTMAX)
    main([str(one), "--chapter", "01_logits_and_temperature", "--out", str(tmp_path / "one.csv"),
          "--gradescope", str(tmp_path / "results.json")])
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(t["name"], t["score"], t["max_score"]) for t in results["tests"]] == [
        ("check_softmax", 4, 4), ("check_gumbel_max", 0, 4)], results


@pytest.mark.slow
@needs_jail
def test_a_table_of_the_visible_answers_passes_in_the_notebook_and_fails_the_grade(tmp_path):
    """The answers to every case a student can see, stored as a literal table in the notebook:
    they pass the public check (the grader without its hidden seed), and fail the grade, whose
    random cases come from a seed drawn when grading."""
    seen = {}

    def recording(z, t):
        answer = ll.probs.softmax(z, t)
        seen[repr((z.tolist(), t))] = (answer.tolist(), str(answer.dtype).removeprefix("torch."))
        return answer

    with contextlib.redirect_stdout(io.StringIO()), pytest.MonkeyPatch.context() as patch:
        from logitlab.course.checks import common

        patch.setattr(common, "library_watched", contextlib.nullcontext)
        ll.checks.check_softmax(recording)
    table = (f"TABLE = {seen!r}\n\ndef sm(z, t):\n    answer, dtype = TABLE[repr((z.tolist(), t))]\n"
             "    return torch.tensor(answer, dtype=getattr(torch, dtype))\n\nll.checks.check_softmax(sm)")
    nb = json.loads(nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in [SETUP, table]])))
    assert check_notebook(nb, ["check_softmax"], tmp_path / "public", timeout=120, memory_gb=6) == {"check_softmax": "passed"}
    graded = check_notebook(nb, ["check_softmax"], tmp_path / "hidden", timeout=120, memory_gb=6, seed=2026)
    assert graded["check_softmax"].startswith("failed: Case 2 of 14 (a batch of random rows)"), graded  # drawn anew


@needs_jail
def test_an_honest_answer_may_import_library_modules_it_does_not_call(tmp_path):
    """A notebook that imports a library module nobody had loaded yet (its body runs in the
    sandbox, before the tracer starts) still has its honest answer graded."""
    nb = json.loads(nbformat.writes(nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell(c) for c in [SETUP + "\nimport logitlab.spec_bench\nfrom logitlab.figures import viz", SOFTMAX]])))
    assert check_notebook(nb, ["check_softmax"], tmp_path, timeout=120, memory_gb=6, seed=3) == {"check_softmax": "passed"}
