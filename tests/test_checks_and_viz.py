"""The exercise checkers accept the library's own answers and reject typical wrong ones."""

import inspect
import types

import matplotlib

matplotlib.use("Agg")

import pytest
import torch

import logitlab as ll
from logitlab.course.checks import CheckFailed, check_gumbel_max, check_softmax


# These tests hand the checks the library's own code as the right answer (student_copy), to test
# the checks' cases: the tracer that refuses it (tests/test_checks_own_work.py) is off for them.
pytestmark = pytest.mark.usefixtures("untraced")


def student_copy(function):
    """A library function as a student could hand it in: the same code in a new function object.
    The checks refuse any library code a student's function runs, this copy included (its
    globals are the library's): the tests that use it turn the tracer off (``untraced``)."""
    f = inspect.unwrap(function)
    copy = types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    copy.__kwdefaults__ = f.__kwdefaults__
    return copy


softmax_answer = student_copy(ll.softmax)


def gumbel_answer(logits, generator=None):
    u = torch.rand(logits.shape, generator=generator, device=logits.device).clamp(1e-20, 1 - 1e-7)
    return (logits - torch.log(-torch.log(u))).argmax(dim=-1)


def test_check_softmax_accepts_the_reference(capsys):
    check_softmax(softmax_answer)
    assert "all 14 cases passed" in capsys.readouterr().out


def naive_softmax(logits, temperature=1.0):
    e = torch.exp(logits / temperature)  # no max subtraction, no T = 0 branch
    return e / e.sum(dim=-1, keepdim=True)


def no_temperature(logits, temperature=1.0):
    return torch.softmax(logits, dim=-1)


def wrong_dim(logits, temperature=1.0):
    return softmax_answer(logits.transpose(0, -1), temperature).transpose(0, -1) if logits.dim() > 1 else softmax_answer(logits, temperature)


def in_place(logits, temperature=1.0):
    logits -= logits.max(dim=-1, keepdim=True).values
    return softmax_answer(logits, temperature)


def global_maximum(logits, temperature=1.0):
    if temperature == 0:
        return softmax_answer(logits, 0.0)
    scaled = logits / temperature
    e = torch.exp(scaled - scaled.max())  # the maximum of the whole tensor, not of each row
    return e / e.sum(dim=-1, keepdim=True)


def greedy_along_dim_1(logits, temperature=1.0):
    if temperature == 0:  # the one-hot placed along dim 1: fails on a single row
        return torch.zeros_like(logits).scatter(1, logits.argmax(dim=1, keepdim=True), 1.0)
    return softmax_answer(logits, temperature)


@pytest.mark.parametrize(
    "fn, message",
    [
        (global_maximum, "Case 13 of 14 \\(rows of very different sizes\\).*each row's own maximum"),
        (greedy_along_dim_1, "Case 14 of 14 \\(temperature 0 on one row without a batch dimension\\).*raised"),
        (naive_softmax, "Case 5 of 14 \\(very large logits\\).*subtract the row maximum"),
        (no_temperature, "Case 3 of 14 \\(temperature 0.5\\)"),
        (wrong_dim, "Case 1 of 14 \\(a small row\\).*returned \\[\\[1.0, 1.0, 1.0\\]\\]"),
        (in_place, "changed the logits"),
        (lambda logits, temperature: logits.tolist(), "returned a list"),
        (lambda logits, temperature: 1 / 0, "raised ZeroDivisionError"),
    ],
)
def test_check_softmax_explains_the_first_wrong_case(fn, message):
    with pytest.raises(CheckFailed, match=message):
        check_softmax(fn)


def test_unwritten_exercise_raises_not_implemented_unchanged():
    def unwritten(logits, temperature=1.0):
        raise NotImplementedError("Exercise: write your solution here")

    with pytest.raises(NotImplementedError):
        check_softmax(unwritten)
    with pytest.raises(NotImplementedError):
        check_gumbel_max(lambda logits, generator: unwritten(logits))


def test_check_gumbel_max_accepts_the_reference(capsys):
    check_gumbel_max(gumbel_answer)
    assert "all 5 cases passed" in capsys.readouterr().out


def exponential_noise(logits, generator):
    u = torch.rand(logits.shape, generator=generator).clamp_min(1e-30)
    return (logits - torch.log(u)).argmax(dim=-1)  # -log(U) is exponential noise, not Gumbel


def ignores_generator(logits, generator):
    return gumbel_answer(logits)


def picks_impossible(logits, generator):
    return gumbel_answer(torch.nan_to_num(logits, neginf=-2.0), generator=generator)


def adds_noise_in_place(logits, generator):
    u = torch.rand(logits.shape, generator=generator).clamp_min(1e-20)
    logits -= torch.log(-torch.log(u))  # logits += gumbel: changes the caller's logits
    return logits.argmax(dim=-1)


@pytest.mark.parametrize(
    "fn, message",
    [
        (adds_noise_in_place, "Case 5 of 5 \\(the logits left as they were\\).*changed the logits"),
        (exponential_noise, "Case 4 of 5 \\(the distribution\\)"),
        (ignores_generator, "same seed gave different tokens"),
        (picks_impossible, "-inf was drawn"),
        (lambda logits, generator: ll.greedy(logits), "Case 4 of 5"),
        (lambda logits, generator: gumbel_answer(logits, generator=generator).int(), "dtype long"),
    ],
)
def test_check_gumbel_max_rejects_wrong_samplers(fn, message):
    with pytest.raises(CheckFailed, match=message):
        check_gumbel_max(fn)


class CharTokenizer:
    """Enough of a tokenizer for the plots: token i is the character chr(97 + i)."""

    def decode(self, ids, skip_special_tokens=False):  # no special tokens to skip
        return "".join(" " + chr(97 + i) if i % 2 else chr(97 + i) for i in ids)


def test_viz_functions_draw_and_label_tokens():
    tok = CharTokenizer()
    logits = torch.randn(20, generator=torch.Generator().manual_seed(0))
    assert ll.viz.token_label(tok, 1) == "␣b"
    ax = ll.viz.plot_top_tokens(ll.softmax(logits), tok, k=5)
    assert len(ax.patches) == 5
    heights = [bar.get_width() for bar in ax.patches]
    assert heights == sorted(heights, reverse=True)
    fig = ll.viz.plot_temperatures(logits, tok, temperatures=(0.0, 1.0), k=4)
    top_bar = fig.axes[0].patches[0]
    assert top_bar.get_x() + top_bar.get_width() == pytest.approx(1.0)  # T = 0: all the mass on one token
    assert [bar.get_width() for bar in fig.axes[0].patches[1:]] == [0.0] * 3  # a 0 has no bar on a log axis
    assert fig.axes[0].get_xlim() == fig.axes[1].get_xlim()  # one scale for every panel
    assert fig.axes[1].get_xscale() == "log"
    t1 = ll.softmax(logits)[torch.topk(logits, 4).indices]
    assert [t.get_text() for t in fig.axes[1].texts] == [f"{q:.2g}" for q in t1.tolist()]
    table = ll.viz.top_tokens_table(logits, tok, k=3).data
    assert table.count("\n") == 4 and f"{logits.max().item():.3f}" in table
    widget = ll.widgets.temperature_widget(logits, tok, k=4)
    assert widget.children[0].value == 1.0
    with pytest.raises(ValueError, match="1-D"):
        ll.viz.plot_top_tokens(logits[None], tok)


def test_panels_sharing_their_y_axis_all_put_the_most_likely_token_on_top():
    # Four panels with sharey=True, as chapter 2 draws its rules: each inversion of one panel flips
    # them all, so four inversions would leave the favourite at the bottom.
    import matplotlib.pyplot as plt

    tok, probs = CharTokenizer(), ll.softmax(torch.randn(20, generator=torch.Generator().manual_seed(1)))
    fig, axes = plt.subplots(1, 4, sharey=True)
    for ax in axes:
        ll.viz.plot_kept(probs, probs > 0.05, tok, k=6, ax=ax)
    assert all(ax.yaxis_inverted() for ax in axes)  # bar 0, the most likely, at the top
    plt.close(fig)


def test_inverse_transform_picture_marks_the_token_sample_returns():
    tok = CharTokenizer()
    probs = torch.tensor([0.12, 0.05, 0.4, 0.05, 0.3, 0.08])
    ax = ll.viz.plot_inverse_transform(probs, tok, uniforms=[0.05, 0.14, 0.5, 0.97], k=3)
    # cumulative: 0.12 0.17 0.57 0.62 0.92 1.0: U = 0.05 in a, 0.14 in b, 0.5 in c, 0.97 in f
    marks = [t.get_text().split("→ ")[1] for t in ax.texts if "U =" in t.get_text()]
    assert marks == ["a", "␣b", "c", "␣f"]
    labelled = [t.get_text() for t in ax.texts if "U =" not in t.get_text()]
    assert labelled == ["a", "c", "e"]  # the top 3, in order of id
    widths = sorted(round(p.get_width(), 6) for p in ax.patches)
    assert widths == [0.05, 0.05, 0.08, 0.12, 0.3, 0.4]  # a, c, e and the grey b, d, f
    with pytest.raises(ValueError, match="1-D"):
        ll.viz.plot_inverse_transform(probs[None], tok, uniforms=[0.5])


def test_surprisal_picture_splits_the_mass_and_shades_the_typical_window():
    import math

    import matplotlib.pyplot as plt

    from logitlab.sampling import truncation

    # A favourite of 0.4 and six tokens of 0.1: H = 1.75 nats; the six lie 0.55 from H, the
    # favourite 0.83, so typical sampling at mass 0.5 keeps the six (tied) and drops the favourite.
    probs = torch.tensor([0.4] + [0.1] * 6)
    kept = ~truncation.typical(probs.log(), 0.5).isneginf()
    assert kept.tolist() == [False] + [True] * 6
    ax = ll.viz.plot_surprisal(probs, kept, CharTokenizer(), bin_width=0.1)
    kept_bars, removed_bars = ax.containers  # stacked: kept first, removed on top
    assert sum(bar.get_height() for bar in kept_bars) == pytest.approx(0.6)
    assert sum(bar.get_height() for bar in removed_bars) == pytest.approx(0.4)
    entropy = -(0.4 * math.log(0.4) + 0.6 * math.log(0.1))
    assert ax.lines[0].get_xdata()[0] == pytest.approx(entropy)  # the dashed line at H
    d = math.log(10) - entropy
    band = next(p for p in ax.patches if p.get_label().startswith("H ±"))  # the shaded window
    # Its corners in data coordinates (a Rectangle in newer matplotlib, a Polygon in older ones).
    xs = band.get_patch_transform().transform(band.get_path().vertices)[:, 0]
    assert [xs.min(), xs.max()] == pytest.approx([entropy - d, entropy + d])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[0] == "kept: 6 tokens, mass 0.60" and legend[1] == "removed: 1 tokens, mass 0.40"
    assert any("favourite a, p = 0.40" in t.get_text() for t in ax.texts)
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="kept"):
        ll.viz.plot_surprisal(probs, kept[:3], CharTokenizer())
    with pytest.raises(ValueError, match="kept"):
        ll.viz.plot_surprisal(probs, torch.zeros(7, dtype=torch.bool), CharTokenizer())


def test_next_token_logits_validates_prompt():
    with pytest.raises(ValueError, match="prompt"):
        ll.next_token_logits(None, None, "")
