"""Every chapter's widget builds, draws its figure at the default settings (what the website
shows), and redraws when a control changes; a speculative answer's tokens get the right outcome."""

import matplotlib
import pytest
import torch
from test_checks_and_viz import CharTokenizer

import logitlab as ll
from logitlab.figures import widgets
from logitlab.speculative.result import SpeculativeResult

matplotlib.use("Agg")


def drawn(build):
    """Build a widget; return it and the figures it drew (their titles and bar counts)."""
    import matplotlib.pyplot as plt

    plt.close("all")
    widget = build()
    figures = [plt.figure(n) for n in plt.get_fignums()]
    return widget, [(fig.axes[0].get_title(), len(fig.axes[0].patches)) for fig in figures]


@pytest.fixture(scope="module")
def toy():
    return ll.toy_model(vocab_size=26, seed=0), CharTokenizer()


def test_truncation_widget_draws_and_redraws(toy):
    logits = torch.randn(26, generator=torch.Generator().manual_seed(0)) * 2
    widget, figures = drawn(lambda: widgets.truncation_widget(logits, CharTokenizer(), k=10))
    assert len(figures) == 1 and figures[0][1] == 10 and figures[0][0].startswith("top-p P = 0.90")
    import matplotlib.pyplot as plt

    above_floor = int((ll.softmax(logits) >= 0.0001).sum())
    for rule, value, kept in [("top-k", 5, 5), ("epsilon", 0.0001, above_floor), ("min-p", 1.0, 1), ("top-nσ", 0.05, 1)]:
        plt.close("all")
        widget.children[0].value = rule  # the slider takes the rule's units, then its value is set
        slider = widget.children[1]
        symbol, low, high = widgets.TRUNCATION_SETTINGS[rule][:3]
        assert (slider.description, slider.min, slider.max) == (symbol, low, high)
        slider.value = value
        title = plt.figure(plt.get_fignums()[-1]).axes[0].get_title()
        assert f"keeps {kept} tokens" in title and title.startswith(f"{rule} {symbol} = "), title


def test_penalty_typical_speedup_and_temperature_widgets_draw(toy):
    logits = torch.randn(26, generator=torch.Generator().manual_seed(1))
    context, output = torch.tensor([0, 1, 2, 2]), torch.tensor([2, 2])
    for build, bars in [(lambda: widgets.penalty_widget(logits, context, output, CharTokenizer(), k=6), 12),
                        (lambda: widgets.typical_widget(logits, CharTokenizer(), k=6), 6),
                        (lambda: widgets.temperature_widget(logits, CharTokenizer(), k=6), 6)]:
        _, figures = drawn(build)
        assert len(figures) == 1 and figures[0][1] == bars
    widget, figures = drawn(lambda: widgets.speedup_widget({1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3, 5: 1.5}))
    speedup = ll.speculative.speedup(0.3, 3, 0.05, 1.3)
    assert figures[0][0] == f"at α = 0.30: {speedup:.2f}x"
    assert [c.description for c in widget.children[:4]] == ["α", "γ", "c", "v"] and widget.children[1].max == 4


def test_beam_and_tree_widgets_run_the_model(toy, monkeypatch):
    import IPython.display

    model, tok = toy
    shown = []  # what the beam widget displays: one HTML table per draw
    monkeypatch.setattr(IPython.display, "display", shown.append)
    widget, _ = drawn(lambda: widgets.beam_widget(model, tok, [1, 2, 3], max_new_tokens=4))
    assert widget.children[0].value == 4 and shown[-1].data.count("<tr>") == 1 + 4  # header + every beam
    best = ll.beam_search(model, [[1, 2, 3]], num_beams=4, max_new_tokens=4, tokenizer=tok).best[0]
    assert f"<td>{best.logprob:.2f}</td>" in shown[-1].data.split("</tr>")[1]  # rank 1 is beam search's best
    widget.children[0].value = 2
    assert shown[-1].data.count("<tr>") == 1 + 2
    _, figures = drawn(lambda: widgets.tree_widget(model, tok, [1, 2, 3]))
    assert figures[0][0].startswith("branching (3, 2, 2): 21 nodes, 12 paths")


def result(new_tokens, accepted, drafted):
    return SpeculativeResult(sequences=new_tokens, new_tokens=new_tokens, logprobs=[], raw_logprobs=[],
                             finish_reasons=["length"] * len(new_tokens), prompt_index=list(range(len(new_tokens))),
                             accepted=accepted, drafted=drafted)


def test_outcome_spans_follow_the_calls():
    # Row 0: its prefill token, then a call keeping 2 of 3 drafts (and a replaced token), then one
    # keeping all 3 (and a bonus token). Row 1 keeps nothing, then 1 draft.
    rows = [torch.arange(8), torch.arange(4)]
    kinds = [k for _, k in ll.viz.outcome_spans(result(rows, [[2, 0], [3, 1]], [3, 3]), row=0)]
    assert kinds == ["target", "accepted", "accepted", "replaced", "accepted", "accepted", "accepted", "bonus"]
    second = [k for _, k in ll.viz.outcome_spans(result(rows, [[2, 0], [3, 1]], [3, 3]), row=1)]
    assert second == ["target", "replaced", "accepted", "replaced"]
    # A row that finished leaves the batch: the next call's counts are the other rows'.
    short = [torch.arange(2), torch.arange(6)]
    third = [k for _, k in ll.viz.outcome_spans(result(short, [[0, 1], [2]], [2, 2]), row=1)]
    assert third == ["target", "accepted", "replaced", "accepted", "accepted", "bonus"]
    with pytest.raises(ValueError, match="row"):
        ll.viz.outcome_spans(result(rows, [], []), row=2)


def test_outcome_html_counts_a_real_run(toy):
    model, tok = toy
    drafter = ll.speculative.draft_model.DraftModelDrafter(ll.toy_model(vocab_size=26, seed=1))
    run = ll.speculative_generate(model, drafter, [[1, 2]], gamma=3, max_new_tokens=30, eos_token_id=[],
                                  generator=torch.Generator().manual_seed(0))
    kinds = [k for _, k in ll.viz.outcome_spans(run)]
    assert len(kinds) == 30 and kinds[0] == "target"
    calls = len(run.accepted)
    assert kinds.count("accepted") + kinds.count("replaced") + kinds.count("bonus") == 29
    assert kinds.count("replaced") + kinds.count("bonus") in (calls, calls - 1)  # the last call may be cut
    html = ll.viz.outcome_html(run, tok).data
    assert f"accepted: {kinds.count('accepted')}" in html and html.count("<span") == 30 + 4
    widget, _ = drawn(lambda: widgets.outcome_widget({"toy draft": run}, tok))
    assert widget.children[0].options == ("toy draft",)


def test_html_table_renders_a_pipe_table_for_the_website():
    # The widget embedder prints Markdown as raw text: a widget's tables go out as HTML.
    out = widgets.html_table("| a | b \\| c |\n|---:|:---|\n| `x` | 1 \\| 2 |\n| <y> | 3 |").data
    assert out == ("<table><thead><tr><th>a</th><th>b | c</th></tr></thead><tbody><tr><td>x</td><td>1 | 2</td></tr>"
                   "<tr><td>&lt;y&gt;</td><td>3</td></tr></tbody></table>")
