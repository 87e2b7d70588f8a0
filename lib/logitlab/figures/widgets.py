"""The chapters' knobs: one interactive figure per chapter, live in Jupyter and Colab.

Each function returns an ``ipywidgets`` widget whose controls redraw a figure or a table. The
rendered website has no kernel, so a widget cannot react there: what the site shows is the
widget as it was drawn when the chapter ran, its figure at the default settings (the static
fallback), with the controls beside it.

* chapter 1: ``temperature_widget``, the top tokens as the temperature changes;
* chapter 2: ``truncation_widget``, what each truncation rule keeps of a real distribution;
* chapter 3: ``penalty_widget``, the penalties applied to one step of a repeating text;
* chapter 4: ``beam_widget``, the hypotheses beam search returns for a width and length penalty;
* chapter 5: ``tree_widget``, a token tree sampled with a chosen branching;
* chapter 6: ``speedup_widget``, the cost model's speedup against alpha for gamma, c and v;
* chapter 7: ``typical_widget``, which drafts typical acceptance keeps for epsilon and delta;
* chapters 8 and 9: ``outcome_widget``, one answer per drafter, coloured by outcome;
* chapter 11: ``constraint_widget``, a pattern and the tokens it allows at each step.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch

from ..probs import softmax
from .viz import check_row, constraint_steps, outcome_html, plot_kept, plot_tree, token_label


def html_table(markdown):
    """A Markdown pipe table (``IPython.display.Markdown`` or its text) as ``IPython.display.HTML``.

    A widget's output is shown on the website by the widget embedder, which renders HTML and
    images but prints Markdown as raw text; a table a widget draws goes out as HTML instead."""
    import html
    import re

    from IPython.display import HTML

    text = getattr(markdown, "data", markdown)
    lines = [line for line in text.strip().splitlines() if line.startswith("|")]

    def cells(line):  # split on the pipes that are not escaped (a cell may hold a "\|")
        return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]

    head = "".join(f"<th>{html.escape(c)}</th>" for c in cells(lines[0]))
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c.strip('`'))}</td>" for c in cells(line)) + "</tr>"
                   for line in lines[2:])
    return HTML(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def _controls():
    import ipywidgets as widgets

    return widgets, {"continuous_update": False, "style": {"description_width": "initial"}}


def temperature_widget(logits: torch.Tensor, tokenizer, k: int = 15):
    """A slider for the temperature and the top ``k`` tokens' bars, live in Jupyter and Colab."""
    import ipywidgets as widgets

    check_row(logits)
    ids = torch.topk(logits, k).indices
    labels = [token_label(tokenizer, i) for i in ids.tolist()]

    def draw(temperature):
        fig, ax = plt.subplots(figsize=(6, 0.28 * k + 0.9))
        p = softmax(logits.float(), temperature)
        ax.barh(range(k), p[ids].tolist())
        ax.set_yticks(range(k), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, 1.05)
        h = -(p * p.clamp_min(1e-45).log()).sum().item()
        ax.set_title(f"T = {temperature:.2f}: top-{k} mass {p[ids].sum():.3f}, entropy {h:.2f} nats", fontsize=10)
        ax.set_xlabel("probability")
        plt.show()

    slider = widgets.FloatSlider(value=1.0, min=0.0, max=3.0, step=0.05, description="temperature",
                                 continuous_update=False, style={"description_width": "initial"})
    return widgets.interactive(draw, temperature=slider)


def constraint_widget(tokenizer, pattern: str = r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text: str = "2024-0"):
    """Type a pattern and an output: the table of ``constraint_steps``, live in Jupyter and Colab."""
    import ipywidgets as widgets
    from IPython.display import display

    from ..constrained.constraint import Constraint

    compiled = {}

    def draw(pattern, text):
        try:
            if pattern not in compiled:
                compiled[pattern] = Constraint(pattern, tokenizer)
            display(html_table(constraint_steps(compiled[pattern], tokenizer, text)))
        except ValueError as error:
            print(error)

    style = {"description_width": "initial"}
    return widgets.interactive(draw, pattern=widgets.Text(pattern, description="pattern", style=style,
                                                          continuous_update=False),
                               text=widgets.Text(text, description="output so far", style=style,
                                                 continuous_update=False))


# Each rule's setting in its own units: symbol, slider range and step, default, readout format.
TRUNCATION_SETTINGS = {
    "top-k": ("k", 1, 200, 1, 50, ".0f"),
    "top-p": ("P", 0.01, 1.0, 0.01, 0.9, ".2f"),
    "min-p": ("p_min", 0.01, 1.0, 0.01, 0.1, ".2f"),
    "typical": ("P", 0.01, 1.0, 0.01, 0.9, ".2f"),
    "epsilon": ("ε", 0.0001, 0.01, 0.0001, 0.0009, ".4f"),
    "top-H": ("h", 0.01, 1.0, 0.01, 0.4, ".2f"),
    "top-nσ": ("n", 0.05, 3.0, 0.05, 1.0, ".2f"),
}


def truncation_widget(logits: torch.Tensor, tokenizer, k: int = 30):
    """Pick a truncation rule and its setting, and the temperature: which of the ``k`` most
    likely tokens of ``logits [vocab]`` it keeps, and how much probability they hold. The
    setting slider takes the chosen rule's own units and range (``TRUNCATION_SETTINGS``)."""
    from ..sampling import cutoffs
    from ..sampling import truncation as processors

    check_row(logits)
    widgets, options = _controls()
    rules = {"top-k": lambda z, v: processors.top_k(z, round(v)), "top-p": processors.top_p,
             "min-p": processors.min_p, "typical": processors.typical, "epsilon": cutoffs.epsilon_cut,
             "top-H": cutoffs.top_h, "top-nσ": cutoffs.top_n_sigma}
    rule = widgets.Dropdown(options=list(rules), value="top-p", description="rule")
    symbol, low, high, step, default, fmt = TRUNCATION_SETTINGS["top-p"]
    setting = widgets.FloatSlider(value=default, min=low, max=high, step=step, readout_format=fmt,
                                  description=symbol, **options)

    def retune(change):  # the slider takes the new rule's units before it is read again
        symbol, low, high, step, default, fmt = TRUNCATION_SETTINGS[change["new"]]
        setting.min, setting.max = min(low, setting.min), max(high, setting.max)
        setting.step, setting.readout_format, setting.description = step, fmt, symbol
        setting.value = default
        setting.min, setting.max = low, high

    rule.observe(retune, names="value")

    def draw(rule, setting, temperature):
        symbol, low, high, _, _, fmt = TRUNCATION_SETTINGS[rule]
        if not low <= setting <= high:
            return  # the rule changed and the slider has not taken its units yet: retune redraws
        scaled = logits.float() / temperature
        kept = ~rules[rule](scaled, setting).isneginf()
        p = softmax(scaled)
        plot_kept(p, kept, tokenizer, k=k, title=f"{rule} {symbol} = {setting:{fmt}}, T = {temperature:.2f}: keeps "
                                                 f"{int(kept.sum())} tokens holding {p[kept].sum():.2f} of the probability")
        plt.show()

    return widgets.interactive(
        draw, rule=rule, setting=setting,
        temperature=widgets.FloatSlider(value=1.0, min=0.1, max=2.0, step=0.05, description="temperature", **options))


def penalty_widget(logits: torch.Tensor, context: torch.Tensor, output: torch.Tensor, tokenizer, k: int = 15):
    """The three penalties of chapter 3 on one step: the ``k`` most likely tokens of ``logits
    [vocab]`` before and after them. ``context`` holds every earlier token (the repetition
    penalty's count), ``output`` the generated ones (presence and frequency)."""
    from ..sampling.penalties import apply_penalties

    check_row(logits)
    widgets, options = _controls()

    def draw(repetition, presence, frequency):
        after = apply_penalties(logits[None].float(), context[None], output[None], repetition_penalty=repetition,
                                presence_penalty=presence, frequency_penalty=frequency)[0]
        before, now = softmax(logits.float()), softmax(after)
        ids = torch.topk(before, k).indices
        fig, ax = plt.subplots(figsize=(6, 0.28 * k + 1))
        ax.barh([i - 0.2 for i in range(k)], before[ids].tolist(), height=0.4, color="lightgray", label="no penalty")
        ax.barh([i + 0.2 for i in range(k)], now[ids].tolist(), height=0.4, color="C0", label="with the penalties")
        seen = set(context.tolist())
        ax.set_yticks(range(k), [token_label(tokenizer, t) + (" •" if t in seen else "") for t in ids.tolist()],
                      fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("probability (• : the token occurred before)")
        ax.set_title(f"most likely next token: {token_label(tokenizer, int(now.argmax()))!r}", fontsize=10)
        ax.legend(fontsize=8)
        plt.show()

    return widgets.interactive(
        draw, repetition=widgets.FloatSlider(value=1.3, min=1.0, max=2.0, step=0.05, description="repetition", **options),
        presence=widgets.FloatSlider(value=0.0, min=0.0, max=3.0, step=0.1, description="presence", **options),
        frequency=widgets.FloatSlider(value=0.0, min=0.0, max=2.0, step=0.05, description="frequency", **options))


def beam_widget(model, tokenizer, prompt_ids, max_new_tokens: int = 24):
    """Beam search on one prompt (``prompt_ids``, a list of token ids) with a chosen width and
    length penalty: every hypothesis it returns, with its length, log-probability and score."""
    from IPython.display import display

    from ..search.beam import beam_search

    widgets, options = _controls()

    def draw(num_beams, length_penalty):
        result = beam_search(model, [prompt_ids], num_beams=num_beams, max_new_tokens=max_new_tokens,
                             length_penalty=length_penalty, num_return_sequences=num_beams, tokenizer=tokenizer)
        lines = ["| rank | answer | tokens | log-probability | score |", "|---:|:---|---:|---:|---:|"]
        for rank, h in enumerate(result.hypotheses[0], 1):
            text = (h.text or "").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {rank} | {text} | {len(h.tokens)} | {h.logprob:.2f} | {h.score:.3f} |")
        display(html_table("\n".join(lines)))

    return widgets.interactive(
        draw, num_beams=widgets.IntSlider(value=4, min=1, max=8, description="beams", **options),
        length_penalty=widgets.FloatSlider(value=1.0, min=-1.0, max=2.0, step=0.25, description="length penalty",
                                           **options))


def tree_widget(model, tokenizer, prompt_ids, seed: int = 0):
    """A token tree sampled after ``prompt_ids`` (a list of token ids) with a chosen branching at
    each of three levels, drawn level by level with each node's probability."""
    from ..devices import generator, model_device
    from ..search.trees import sample_tree

    widgets, options = _controls()

    def draw(first, second, third):
        ids = torch.tensor([prompt_ids], device=model_device(model))
        tree = sample_tree(model, ids, branching=(first, second, third), generator=generator(model, seed))
        leaves = len(tree.leaves())
        ax = plt.subplots(figsize=(9, 0.35 * leaves + 1.5))[1]
        plot_tree(tree, tokenizer, ax=ax, title=f"branching ({first}, {second}, {third}): {len(tree)} nodes, "
                                                 f"{leaves} paths; each node: token and its probability given its path")
        plt.show()

    level = dict(min=1, max=4, **options)
    return widgets.interactive(draw, first=widgets.IntSlider(value=3, description="level 1", **level),
                               second=widgets.IntSlider(value=2, description="level 2", **level),
                               third=widgets.IntSlider(value=2, description="level 3", **level))


def speedup_widget(costs: dict, alpha: float = 0.3, gamma: int = 3, c: float = 0.05):
    """The cost model of chapter 6: the speedup against alpha for the chosen gamma, drafter cost
    ``c`` and verification cost ``v`` (a pass over gamma + 1 tokens, in decode steps; its slider
    starts at ``costs[gamma + 1]``, a measured cost), with the break-even line and the point at
    the chosen alpha."""
    from ..speculative.theory import speedup

    widgets, options = _controls()
    largest = max(costs) - 1

    def draw(alpha, gamma, c, v):
        alphas = [a / 100 for a in range(100)]
        fig, ax = plt.subplots(figsize=(6.5, 3.6))
        ax.plot(alphas, [speedup(a, gamma, c, v) for a in alphas], label=f"γ = {gamma}, c = {c:.2f}, v = {v:.2f}")
        measured = costs.get(gamma + 1)
        if measured is not None and abs(measured - v) > 1e-9:
            ax.plot(alphas, [speedup(a, gamma, c, measured) for a in alphas], color="0.6", linestyle=":",
                    label=f"the same with the measured v({gamma + 1}) = {measured:.2f}")
        ax.axhline(1, color="C3", linestyle="--", linewidth=1, label="break-even")
        point = speedup(alpha, gamma, c, v)
        ax.plot([alpha], [point], "o", color="C0")
        ax.set_xlabel("acceptance rate α")
        ax.set_ylabel("predicted speedup")
        ax.set_title(f"at α = {alpha:.2f}: {point:.2f}x", fontsize=10)
        ax.legend(fontsize=8)
        plt.show()

    return widgets.interactive(
        draw, alpha=widgets.FloatSlider(value=alpha, min=0.0, max=0.99, step=0.01, description="α", **options),
        gamma=widgets.IntSlider(value=min(gamma, largest), min=1, max=largest, description="γ", **options),
        c=widgets.FloatSlider(value=c, min=0.0, max=0.5, step=0.005, description="c", **options),
        v=widgets.FloatSlider(value=costs[min(gamma, largest) + 1], min=1.0, max=3.0, step=0.01, description="v",
                              **options))


def typical_widget(logits: torch.Tensor, tokenizer, k: int = 15):
    """Typical acceptance on one real distribution (``logits [vocab]``): the bar
    ``min(epsilon, delta * exp(-H))`` against the ``k`` most likely tokens' probabilities, so the
    drafts it would keep show for any epsilon and delta."""
    check_row(logits)
    widgets, options = _controls()
    p = softmax(logits.float())
    entropy = -(p * p.clamp_min(1e-45).log()).sum().item()
    ids = torch.topk(p, k).indices

    def draw(epsilon, delta):
        bar = min(epsilon, delta * math.exp(-entropy))
        kept = p[ids] > bar
        fig, ax = plt.subplots(figsize=(6, 0.28 * k + 1))
        ax.barh(range(k), p[ids].tolist(), color=["C2" if x else "lightgray" for x in kept.tolist()])
        ax.axvline(bar, color="C3", linestyle="--", label=f"bar min(ε, δ·e^(−H)) = {bar:.4f}")
        ax.set_yticks(range(k), [token_label(tokenizer, t) for t in ids.tolist()], fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("target probability of the draft")
        ax.set_title(f"entropy H = {entropy:.2f} nats: a draft among these is kept if green "
                     f"({int((p > bar).sum())} tokens in all)", fontsize=9)
        ax.legend(fontsize=8)
        plt.show()

    return widgets.interactive(
        draw, epsilon=widgets.FloatSlider(value=0.09, min=0.0, max=0.5, step=0.01, description="ε", **options),
        delta=widgets.FloatSlider(value=0.3, min=0.0, max=1.0, step=0.01, description="δ", **options))


def outcome_widget(results: dict, tokenizer):
    """Choose a drafter: its answer (``results``: name -> a speculative result of one prompt),
    each token coloured by what became of it (``viz.outcome_html``)."""
    from IPython.display import display

    widgets, _ = _controls()

    def draw(drafter):
        result = results[drafter]
        print(f"{drafter}: {len(result.new_tokens[0])} tokens in {len(result.accepted) + 1} target calls")
        display(outcome_html(result, tokenizer))

    return widgets.interactive(draw, drafter=widgets.Dropdown(options=list(results), description="drafter"))
