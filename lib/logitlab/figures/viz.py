"""The book's plots and tables (its widgets are in ``logitlab.figures.widgets``).

Chapter 1 uses ``token_label``, ``top_tokens_table``, ``plot_top_tokens``,
``plot_temperatures`` and ``plot_inverse_transform``; chapter 2 adds ``plot_kept`` and
``plot_surprisal``, chapter 5
``plot_tree``; chapters 6, 8 and 9 ``outcome_html`` (a
speculative answer coloured by what became of each token); chapter 11 ``constraint_steps``.
Plots draw on a matplotlib ``Axes`` (made for you when none is given) and return it, so a
chapter can add to them.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter
import torch

from ..probs import entropy, log_softmax, softmax
from ..sampling.draw import inverse_transform


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

    check_row(logits)
    probs = softmax(logits.float(), temperature)
    logps = log_softmax(logits.float(), temperature)
    top = torch.topk(probs, k)
    lines = ["| rank | token | id | logit | probability | log-probability |", "|---:|:---|---:|---:|---:|---:|"]
    for rank, (p, i) in enumerate(zip(top.values.tolist(), top.indices.tolist()), start=1):
        label = token_label(tokenizer, i).replace("|", "\\|")
        lines.append(f"| {rank} | `{label}` | {i} | {logits[i].item():.3f} | {p:.4f} | {logps[i].item():.3f} |")
    return Markdown("\n".join(lines))


def most_likely_on_top(ax) -> None:
    """Bar 0 (the most likely token) at the top: the y-axis inverted once. Panels that share
    their y-axis share its inversion, so inverting each of them again would flip it back."""
    if not ax.yaxis_inverted():
        ax.invert_yaxis()


def plot_top_tokens(probs: torch.Tensor, tokenizer, k: int = 15, ax=None, title: str | None = None, color="C0"):
    """Horizontal bars of the ``k`` most likely tokens of one distribution ``probs [vocab]``."""
    check_row(probs)
    ax = ax or plt.subplots(figsize=(5, 0.28 * k + 0.8))[1]
    top = torch.topk(probs.float(), k)
    labels = [token_label(tokenizer, i) for i in top.indices.tolist()]
    ax.barh(range(k), top.values.tolist(), color=color)
    ax.set_yticks(range(k), labels, fontsize=8)
    most_likely_on_top(ax)
    ax.set_xlabel("probability")
    ax.set_xlim(0, max(1e-9, float(top.values[0])) * 1.1)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_temperatures(logits: torch.Tensor, tokenizer, temperatures=(0.0, 0.5, 1.0, 2.0), k: int = 12):
    """Small multiples: the top ``k`` tokens (ranked at T = 1) at several temperatures.

    The tokens are the same in every panel, so the panels show how the same probabilities
    move. The panels share one logarithmic x-axis: a bar's length compares across temperatures,
    the short bars of a high temperature stay visible, and since ``log p_i(T)`` is
    ``(z_i - log Z) / T``, the gaps between the bars' ends shrink in proportion to ``1 / T``.
    Each bar carries its probability; one below the axis (such as the 0 of greedy decoding)
    has no bar, only its label. Each title gives the total probability of the ``k`` tokens
    shown. The static companion of :func:`temperature_widget`.
    """
    check_row(logits)
    ids = torch.topk(logits, k).indices
    labels = [token_label(tokenizer, i) for i in ids.tolist()]
    panels = [softmax(logits.float(), t)[ids] for t in temperatures]
    positive = [q for p in panels for q in p.tolist() if q > 0]
    # A log axis has no 0: the bars start a decade below the smallest one (at most six decades
    # below 1, so that one vanishing probability does not squeeze the others).
    floor = 10.0 ** max(-6, math.floor(math.log10(min(positive))))
    largest = max(positive)
    fig, axes = plt.subplots(1, len(temperatures), figsize=(2.6 * len(temperatures), 0.26 * k + 1.2),
                             sharey=True, sharex=True)
    for ax, t, p in zip(axes, temperatures, panels):
        widths = [max(q, floor) - floor for q in p.tolist()]
        bars = ax.barh(range(k), widths, left=floor, color="C1" if t == 1.0 else "C0")
        ax.bar_label(bars, [f"{q:.2g}" for q in p.tolist()], fontsize=6, padding=2)
        name = f"T = {t:g}" + (" (greedy)" if t == 0 else "")
        ax.set_title(f"{name}\nthese {k} tokens: {p.sum():.2f}", fontsize=9)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 0.01, not 10^-2
        ax.set_xlabel("probability (log scale)")
        ax.tick_params(axis="x", labelsize=7)
    axes[0].set_xlim(floor, largest * 4)  # room for the label of the longest bar
    axes[0].set_yticks(range(k), labels, fontsize=8)
    axes[0].invert_yaxis()
    fig.tight_layout()
    return fig


def plot_inverse_transform(probs: torch.Tensor, tokenizer, uniforms, k: int = 8, ax=None):
    """Multinomial sampling drawn: [0, 1) cut into one interval per token, and where each U falls.

    The ``k`` most likely tokens of ``probs [vocab]`` get an interval each (length = their
    probability, in order of token id, as the cumulative sum lays them out); the other tokens'
    intervals, too thin to draw one by one, are grey. Each value of ``uniforms`` is marked with
    the token whose interval holds it: the token that ``ll.sample`` returns for that U.
    """
    check_row(probs)
    probs = probs.cpu().double()  # on the CPU first: float64 exists there (not on MPS), as in ll.sample's sum
    cumulative = probs.cumsum(0)
    top = set(torch.topk(probs, k).indices.tolist())
    ax = ax or plt.subplots(figsize=(9, 1.9))[1]
    start, colour = 0.0, 0
    for i in sorted(top):
        left = float(cumulative[i] - probs[i])
        if left > start:  # the tokens between two of the top k, merged
            ax.barh(0, left - start, left=start, color="lightgray", edgecolor="white", linewidth=0.3)
        ax.barh(0, float(probs[i]), left=left, color=f"C{colour % 10}", edgecolor="white", linewidth=0.5)
        ax.text(left + float(probs[i]) / 2, 0.48, token_label(tokenizer, i), rotation=45,
                ha="left", va="bottom", fontsize=7)
        start, colour = left + float(probs[i]), colour + 1
    if start < float(cumulative[-1]):
        ax.barh(0, float(cumulative[-1]) - start, left=start, color="lightgray", edgecolor="white", linewidth=0.3)
    for u in uniforms:
        token = int(inverse_transform(cumulative, cumulative[-1:] * float(u)))
        ax.annotate(f"U = {u:.2f}\n→ {token_label(tokenizer, token)}", xy=(u, -0.4), xytext=(u, -1.3),
                    ha="center", va="top", fontsize=7, arrowprops={"arrowstyle": "->", "lw": 0.8})
    ax.set_xlim(0, 1)
    ax.set_ylim(-2.2, 1.6)
    ax.set_yticks([])
    ax.set_xlabel("cumulative probability (tokens in order of id; grey: every other token)")
    return ax


def plot_kept(probs: torch.Tensor, kept: torch.Tensor, tokenizer, k: int = 30, ax=None, title: str | None = None):
    """The ``k`` most likely tokens of ``probs [vocab]``, coloured by whether a rule keeps them.

    ``kept`` is a boolean mask ``[vocab]`` (for example ``~truncated_logits.isneginf()``).
    """
    check_row(probs)
    ax = ax or plt.subplots(figsize=(4, 0.22 * k + 0.8))[1]
    top = torch.topk(probs.float(), k)
    keep = kept[top.indices].tolist()
    colors = ["C0" if x else "lightgray" for x in keep]
    ax.barh(range(k), top.values.tolist(), color=colors)
    ax.set_yticks(range(k), [token_label(tokenizer, i) for i in top.indices.tolist()], fontsize=7)
    most_likely_on_top(ax)
    ax.set_xlabel("probability")
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def plot_surprisal(probs: torch.Tensor, kept: torch.Tensor, tokenizer, ax=None, title: str | None = None,
                   bin_width: float = 0.25):
    """A distribution ``probs [vocab]`` on the surprisal axis, as typical sampling sees it.

    Each bar holds the probability of the tokens whose surprisal ``-log p`` falls in its bin
    (``bin_width`` nats), split into the tokens that ``kept`` (a boolean mask ``[vocab]``) keeps
    and those it removes. A dashed line marks the entropy ``H``, the mean surprisal; the shaded
    band is ``H ± d``, ``d`` the largest distance from ``H`` of a kept token: for typical
    sampling, the window it keeps. The most likely token is labelled. The axis stops where the
    bins have covered 99.5% of the mass; the far tail beyond it is not drawn.
    """
    check_row(probs)
    check_row(kept)
    if kept.shape != probs.shape or kept.dtype != torch.bool or not kept.any():
        raise ValueError("kept must be a boolean mask of the same shape as probs, keeping at least one token")
    probs = probs.detach().cpu().double()
    kept = kept.cpu()
    surprisal = -probs.log()  # +inf for a probability of 0: such a token falls in no bin
    h = float(entropy(probs))  # the mean surprisal
    d = float((surprisal[kept] - h).abs().max())
    order = surprisal.argsort()
    covered = int((probs[order].cumsum(0) < 0.995).sum())  # tokens before 99.5% of the mass
    right = math.ceil(float(surprisal[order[min(covered, len(order) - 1)]]) + 1)
    bins = torch.arange(0, right + bin_width, bin_width).tolist()
    ax = ax or plt.subplots(figsize=(6, 3.2))[1]
    removed = ~kept
    heights, _, _ = ax.hist([surprisal[kept].tolist(), surprisal[removed & surprisal.isfinite()].tolist()], bins=bins,
            weights=[probs[kept].tolist(), probs[removed & surprisal.isfinite()].tolist()], stacked=True,
            color=["C0", "lightgray"],
            label=[f"kept: {int(kept.sum()):,} tokens, mass {float(probs[kept].sum()):.2f}",
                   f"removed: {int(removed.sum()):,} tokens, mass {float(probs[removed].sum()):.2f}"])
    ax.axvspan(h - d, h + d, color="C2", alpha=0.12, lw=0, label=f"H ± {d:.2f}")
    ax.axvline(h, color="k", ls="--", lw=1, label=f"entropy H = {h:.2f}")
    top = int(order[0])
    tallest = float(heights[-1].max())  # the stacked bars' tops
    bar_top = float(heights[-1][min(int(surprisal[top] // bin_width), len(bins) - 2)])
    ax.annotate(f"favourite {token_label(tokenizer, top)}, p = {float(probs[top]):.2f}",
                xy=(float(surprisal[top]), bar_top), xytext=(float(surprisal[top]), bar_top + 0.2 * tallest),
                ha="left", va="bottom", fontsize=7, arrowprops={"arrowstyle": "->", "lw": 0.8})
    ax.set_ylim(0, 1.45 * tallest)  # room above the bars for the label and the legend
    ax.set_xlim(0, right)
    ax.set_xlabel("surprisal −log p (nats)")
    ax.set_ylabel(f"probability per {bin_width:g}-nat bin")
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    return ax


def plot_tree(tree, tokenizer, ax=None, title: str | None = None):
    """A token tree (``ll.TokenTree``) drawn left to right: the prompt, then one column per level.

    Each node shows its token and the probability the model gave it after its path
    (``tree.raw_logprobs``). Leaves are spread evenly from top to bottom in node order, and an
    inner node sits at the mean height of its children, so no two branches cross.
    """
    depths, n = tree.depths, len(tree)
    leaves = tree.leaves()
    ax = ax or plt.subplots(figsize=(8, 0.35 * len(leaves) + 1.5))[1]
    y = [0.0] * n
    for rank, leaf in enumerate(leaves):
        y[leaf] = (len(leaves) - 1) / 2 - rank  # the first leaf on top
    for i in reversed(range(n)):  # children come after their parent in node order
        kids = tree.children(i)
        if kids:
            y[i] = sum(y[k] for k in kids) / len(kids)
    root_y = sum(y[k] for k in tree.children(-1)) / len(tree.children(-1))
    for i, p in enumerate(tree.parents):
        ax.plot([depths[i] - 1, depths[i]], [root_y if p < 0 else y[p], y[i]], color="0.6", lw=1, zorder=1)
    for i in range(n):
        label = token_label(tokenizer, int(tree.tokens[i]))
        ax.annotate(f"{label}\n{float(tree.raw_logprobs[i].exp()):.2f}", (depths[i], y[i]), ha="center",
                    va="center", fontsize=8, bbox=dict(boxstyle="round", fc="white", ec="C0"))
    ax.annotate("prompt", (0, root_y), ha="center", va="center", fontsize=8,
                bbox=dict(boxstyle="round", fc="0.9", ec="0.5"))
    ax.set_xlim(-0.5, max(depths) + 0.5)
    ax.set_ylim(min(y) - 0.7, max(y) + 0.7)
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    return ax


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
        shown = row["so far"].replace("|", "\\|").replace("\n", "\\n")
        shown = f"`{shown}`" if shown else "(empty)"
        lines.append(f"| {row['step']} | {shown} | {row['allowed']} | {row['e.g.'].replace('|', '/')} | "
                     f"{'yes' if row['EOS allowed'] else 'no'} |")
    return Markdown("\n".join(lines))


# What became of each token of a speculative answer, and its colour in ``outcome_html``.
OUTCOME_COLOURS = {"target": "#d9d9d9", "accepted": "#b7e1a1", "replaced": "#f6b26b", "bonus": "#9fc5e8"}


def outcome_spans(result, row: int = 0) -> list[tuple[int, str]]:
    """``(token id, outcome)`` for every new token of ``row`` of a speculative ``result``: the
    first token comes from the prefill (``"target"``); in each call, the drafts the target kept
    are ``"accepted"``, and the token the target added after them is ``"replaced"`` when a draft
    was rejected there and ``"bonus"`` when every draft of the call was kept (for a tree: when the
    kept path reached the tree's last level)."""
    lengths = [len(t) for t in result.new_tokens]
    if not 0 <= row < len(lengths):
        raise ValueError(f"row must be in [0, {len(lengths)}), got {row!r}")
    used = [min(1, n) for n in lengths]  # the prefill gave every row its first token
    kinds = [["target"] * used[r] for r in range(len(lengths))]
    for nums, drafted in zip(result.accepted, result.drafted):
        active = [r for r in range(len(lengths)) if used[r] < lengths[r]]  # rows still in the batch
        for r, num in zip(active, nums):
            call = ["accepted"] * num + ["bonus" if num == drafted else "replaced"]
            call = call[:lengths[r] - used[r]]  # a row can stop inside a call (EOS, max_new_tokens)
            kinds[r] += call
            used[r] += len(call)
    return list(zip(result.new_tokens[row].tolist(), kinds[row]))


def outcome_html(result, tokenizer, row: int = 0):
    """``row`` of a speculative answer as HTML, each token on the colour of its outcome
    (``outcome_spans``), with a legend and the count of each outcome."""
    import html

    from IPython.display import HTML

    spans = outcome_spans(result, row)
    pieces = []
    for token, kind in spans:
        text = html.escape(tokenizer.decode([token])).replace("\n", "↵<br>")
        pieces.append(f'<span style="background:{OUTCOME_COLOURS[kind]};border-radius:2px" title="{kind}">{text}</span>')
    counts = {kind: sum(k == kind for _, k in spans) for kind in OUTCOME_COLOURS}
    legend = " ".join(f'<span style="background:{colour};padding:0 4px">{kind}: {counts[kind]}</span>'
                      for kind, colour in OUTCOME_COLOURS.items())
    return HTML(f'<div class="speculative-outcome"><p style="font-size:90%">{legend}</p>'
                f'<p style="line-height:1.8">{"".join(pieces)}</p></div>')


def check_row(t) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 1:
        raise ValueError("pass one distribution: a 1-D tensor [vocab] (index a batch with [0] first)")
