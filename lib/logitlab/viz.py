"""The book's plots, tables and widgets.

Chapter 1 uses ``token_label``, ``top_tokens_table``, ``plot_top_tokens``,
``plot_temperatures`` and ``temperature_widget``; chapter 2 adds ``plot_kept``; chapter 10
``constraint_steps`` and ``constraint_widget``. Plots draw on a matplotlib ``Axes`` (made
for you when none is given) and return it, so a chapter can add to them.

Widgets need a running kernel to react. The rendered website has none, so every widget here
comes with a static figure that shows the same thing at a few fixed settings.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from .probs import log_softmax, softmax


def token_label(tokenizer, token_id: int) -> str:
    """A token's text made visible: a leading space as '␣', a newline as '\\n'."""
    text = tokenizer.decode([int(token_id)])
    return repr(text)[1:-1].replace(" ", "␣") or "∅"


def top_tokens_table(logits: torch.Tensor, tokenizer, k: int = 10, temperature: float = 1.0):
    """A Markdown table of the ``k`` most likely tokens: rank, token, logit, probability, log-prob.

    ``logits`` is one row ``[vocab]``. Returns an ``IPython.display.Markdown`` object, which a
    notebook shows as a table (also on the rendered website).
    """
    from IPython.display import Markdown

    _check_row(logits)
    probs = softmax(logits.float(), temperature)
    logps = log_softmax(logits.float(), temperature)
    top = torch.topk(probs, k)
    lines = ["| rank | token | id | logit | probability | log-probability |", "|---:|:---|---:|---:|---:|---:|"]
    for rank, (p, i) in enumerate(zip(top.values.tolist(), top.indices.tolist()), start=1):
        label = token_label(tokenizer, i).replace("|", "\\|")
        lines.append(f"| {rank} | `{label}` | {i} | {logits[i].item():.3f} | {p:.4f} | {logps[i].item():.3f} |")
    return Markdown("\n".join(lines))


def plot_top_tokens(probs: torch.Tensor, tokenizer, k: int = 15, ax=None, title: str | None = None, color="C0"):
    """Horizontal bars of the ``k`` most likely tokens of one distribution ``probs [vocab]``."""
    _check_row(probs)
    ax = ax or plt.subplots(figsize=(5, 0.28 * k + 0.8))[1]
    top = torch.topk(probs.float(), k)
    labels = [token_label(tokenizer, i) for i in top.indices.tolist()]
    ax.barh(range(k), top.values.tolist(), color=color)
    ax.set_yticks(range(k), labels, fontsize=8)
    ax.invert_yaxis()  # the most likely token on top
    ax.set_xlabel("probability")
    ax.set_xlim(0, max(1e-9, float(top.values[0])) * 1.1)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_temperatures(logits: torch.Tensor, tokenizer, temperatures=(0.0, 0.5, 1.0, 2.0), k: int = 12):
    """Small multiples: the top ``k`` tokens (ranked at T = 1) at several temperatures.

    The tokens are the same in every panel, so the panels show how the same probabilities
    move. Each panel has its own x-axis (at high T all bars are small) and its title gives the
    total probability of the ``k`` tokens shown. The static companion of
    :func:`temperature_widget`.
    """
    _check_row(logits)
    ids = torch.topk(logits, k).indices
    labels = [token_label(tokenizer, i) for i in ids.tolist()]
    fig, axes = plt.subplots(1, len(temperatures), figsize=(2.6 * len(temperatures), 0.26 * k + 1.2), sharey=True)
    for ax, t in zip(axes, temperatures):
        p = softmax(logits.float(), t)[ids]
        ax.barh(range(k), p.tolist(), color="C1" if t == 1.0 else "C0")
        name = f"T = {t:g}" + (" (greedy)" if t == 0 else "")
        ax.set_title(f"{name}\nthese {k} tokens: {p.sum():.2f}", fontsize=9)
        ax.set_xlim(0, float(p.max()) * 1.15)
        ax.set_xlabel("probability")
        ax.tick_params(axis="x", labelsize=7)
    axes[0].set_yticks(range(k), labels, fontsize=8)
    axes[0].invert_yaxis()
    fig.tight_layout()
    return fig


def plot_kept(probs: torch.Tensor, kept: torch.Tensor, tokenizer, k: int = 30, ax=None, title: str | None = None):
    """The ``k`` most likely tokens of ``probs [vocab]``, coloured by whether a rule keeps them.

    ``kept`` is a boolean mask ``[vocab]`` (for example ``~truncated_logits.isneginf()``).
    """
    _check_row(probs)
    ax = ax or plt.subplots(figsize=(4, 0.22 * k + 0.8))[1]
    top = torch.topk(probs.float(), k)
    keep = kept[top.indices].tolist()
    colors = ["C0" if x else "lightgray" for x in keep]
    ax.barh(range(k), top.values.tolist(), color=colors)
    ax.set_yticks(range(k), [token_label(tokenizer, i) for i in top.indices.tolist()], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("probability")
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def temperature_widget(logits: torch.Tensor, tokenizer, k: int = 15):
    """A slider for the temperature and the top ``k`` tokens' bars, live in Jupyter and Colab."""
    import ipywidgets as widgets

    _check_row(logits)
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


def constraint_steps(constraint, tokenizer, text: str, examples: int = 6):
    """Walk the tokens of ``text`` through ``constraint``: at every step, the text so far, how
    many tokens are allowed next, a few of them (the shortest), and whether the text so far is
    a complete match. Stops at the first token the constraint forbids. Returns a Markdown table
    (an ``IPython.display.Markdown``)."""
    from IPython.display import Markdown

    state, rows, ids = 0, [], tokenizer(text, add_special_tokens=False)["input_ids"]
    for step in range(len(ids) + 1):
        allowed = constraint.allowed(state).tolist()
        shown = sorted((t for t in allowed if t not in constraint.eos), key=lambda t: (len(tokenizer.decode([t])), t))
        rows.append({"step": step, "so far": tokenizer.decode(ids[:step]), "allowed": len(allowed),
                     "e.g.": " ".join(token_label(tokenizer, t) for t in shown[:examples]),
                     "EOS allowed": constraint.is_complete(state)})
        if step == len(ids):
            break
        state = constraint.next_state(state, ids[step])
        if state < 0:
            rows.append({"step": step + 1, "so far": tokenizer.decode(ids[:step + 1]), "allowed": 0,
                         "e.g.": f"{token_label(tokenizer, ids[step])} is not allowed here", "EOS allowed": False})
            break
    lines = ["| step | output so far | tokens allowed next | e.g. | complete (EOS allowed) |", "|---:|:---|---:|:---|:---|"]
    for row in rows:
        shown = row["so far"].replace("|", "\\|").replace("\n", "\\n") or " "
        lines.append(f"| {row['step']} | `{shown}` | {row['allowed']} | {row['e.g.'].replace('|', '/')} | "
                     f"{'yes' if row['EOS allowed'] else 'no'} |")
    return Markdown("\n".join(lines))


def constraint_widget(tokenizer, pattern: str = r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text: str = "2024-0"):
    """Type a pattern and an output: the table of ``constraint_steps``, live in Jupyter and Colab."""
    import ipywidgets as widgets
    from IPython.display import display

    from .constrained import Constraint

    compiled = {}

    def draw(pattern, text):
        try:
            if pattern not in compiled:
                compiled[pattern] = Constraint(pattern, tokenizer)
            display(constraint_steps(compiled[pattern], tokenizer, text))
        except ValueError as error:
            print(error)

    style = {"description_width": "initial"}
    return widgets.interactive(draw, pattern=widgets.Text(pattern, description="pattern", style=style,
                                                          continuous_update=False),
                               text=widgets.Text(text, description="output so far", style=style,
                                                 continuous_update=False))


def _check_row(t) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 1:
        raise ValueError("pass one distribution: a 1-D tensor [vocab] (index a batch with [0] first)")
