"""The package face: ``import logitlab`` loads the book's algorithms and nothing of the tooling
around them (the course, the figures, the training), which load on first use under the names the
chapters use (``ll.checks``, ``ll.viz``, ``ll.widgets``, ``ll.training``)."""

import subprocess
import sys

import logitlab as ll

TOOLING = ["matplotlib", "logitlab.course", "logitlab.figures", "logitlab.training", "logitlab.bench"]


def loaded_after(code: str) -> set[str]:
    """The modules of TOOLING in sys.modules after running ``code`` in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {TOOLING!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_import_logitlab_loads_no_tooling():
    assert loaded_after("import logitlab") == set()


def test_the_lazy_names_load_on_first_use():
    assert loaded_after("import logitlab as ll\nll.checks.check_softmax") == {"logitlab.course"}
    assert loaded_after("import logitlab as ll\nll.viz.plot_temperatures") == {"matplotlib", "logitlab.figures"}
    assert loaded_after("from logitlab import widgets") == {"matplotlib", "logitlab.figures"}
    assert loaded_after("import logitlab as ll\nll.training.data") == {"logitlab.training"}


def test_lazy_names_are_the_modules_and_typos_still_fail():
    import importlib

    for name, module in ll.LAZY.items():
        assert getattr(ll, name) is importlib.import_module(module, "logitlab")
        assert name in dir(ll)
    try:
        ll.chekcs
    except AttributeError as error:
        assert "chekcs" in str(error)
    else:
        raise AssertionError("ll.chekcs did not raise AttributeError")
