"""Train a one-layer draft model for SmolLM2-135M, for speculative sampling (chapter 6).

The shipped draft (``ll.speculative.draft_model.load_pretrained``) was made with

    python -m logitlab.training.draft --gen-seconds 540 --data data.pt --steps 1000 --out draft.safetensors

which generates about nine minutes of training data with SmolLM2 itself, trains for 1000 steps
of 8 sequences, and keeps the 2048 tokens the target uses most as the draft's output vocabulary
(about half an hour on 2 CPU cores in all), holding out its last 32 rows to measure.

``--corpus corpus/*.npz --prompts prompts.jsonl.xz`` trains on the repository's corpus instead
(``logitlab.training.corpus``): one pass of the target over every row records its top-64 logits,
which a GPU does in about a minute and a 2-core CPU in hours. ``--held-out-every 7`` holds out the
rows of every seventh prompt, the rows the EAGLE and Medusa trainers hold out of the same data.
The log written beside the weights (``draft.json``) gives the recipe, the data, the time, the loss
curve, and the held-out loss and first-guess accuracy (how often the draft's most likely token is
the target's: the share of first greedy drafts kept) before and after training.

Why this design:

* A drafter is only worth having if one of its steps costs a small fraction ``c`` of a target
  step. SmolLM2-135M has 30 layers; a copy with **one** layer keeps the embedding, the final
  norm and the output layer (tied to the embedding).
* That output layer is then most of the cost: scoring 49152 tokens reads the whole 113 MB
  embedding for every proposed token. The shipped draft scores only the 2048 tokens to which
  the target gives the most probability on the training data (``SubsetHead``): a step gets
  several times cheaper, and the acceptance rate loses little, because the target rarely puts
  much probability elsewhere. Chapter 6 measures both numbers.
* It shares the target's tokenizer by construction (speculative sampling needs that), and
  starting from the target's own weights (embedding, its first layer, the final norm) gives
  it a sensible starting point: before any training it is already a crude bigram-ish model.
* The embedding (and so the output layer) stays **frozen** and is the target's own module,
  not a copy: it is 28M of the ~32M parameters, training it on a few hundred thousand tokens
  would only overfit, and only the small part we train needs saving (the layer and the norm,
  about 7 MB in float16).
* The training data is the target's *own* output (greedy and temperature-1 continuations of
  varied prompts): the drafter is judged only on how well it predicts the target, so we
  imitate the target where it actually goes (distillation), not human text.
* The loss is KL(target || draft) on every generated position, using the target's top-k
  logits recorded **while generating** (the decode step computes them anyway, so the data
  costs no extra forward pass). At temperature 1 the acceptance rate is 1 - TV(p, q), so
  matching the whole distribution matters; at temperature 0 only the argmax matters, so
  cross-entropy on the target's greedy token (``--loss ce``) is the alternative.
* With ``--loss ce --corpus`` the trainer reads the corpus's greedy rows, whose every answer token
  is the target's argmax, from the text: no pass of the target at all (on a 2-core CPU that pass
  takes hours for millions of tokens). The cross-entropy then scores only the ``--vocab`` tokens
  the draft will draft from: the output layer, most of a training step's cost, gets 24 times
  cheaper, and the positions whose argmax lies outside them, which the draft can never propose,
  are left out.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time

import torch
import torch.nn.functional as F

from ..speculative.draft_model import build_draft
from ..speculative.subset_head import SubsetHead, subset_positions
from .corpus import add_corpus_arguments, check_corpus_arguments, greedy_rows, logit_rows
from .data import (
    choose_vocabulary,
    data_summary,
    load_or_make_data,
    machine,
    new_token_states,
    prompt_ids,
    split_held_out,
    steps_within,
    varied_prompts,
    write_log,
)

# --- The draft model ---------------------------------------------------------------------------


def trainable_state(draft) -> dict[str, torch.Tensor]:
    """The weights that differ from the target's: the layers and the final norm."""
    # Stored in float16: half the size, and the draft's quality does not notice.
    return {k: v.detach().to(torch.float16).contiguous() for k, v in draft.state_dict().items()
            if k.startswith(("model.layers.", "model.norm."))}


def save_draft(draft, path: str, vocab: torch.Tensor | None = None) -> None:
    """Write the trained layers and norm (float16) and, if given, the draft's output vocabulary."""
    from safetensors.torch import save_file

    state = trainable_state(draft)
    if vocab is not None:
        state["vocab"] = vocab.to(torch.int32).contiguous()
    save_file(state, path, metadata={"num_hidden_layers": str(draft.config.num_hidden_layers)})


# --- Training ----------------------------------------------------------------------------------


def loss_on(draft, rows, kind: str = "kl", head: SubsetHead | None = None) -> torch.Tensor:
    """KL(target top-k || draft) (target renormalised over its top k), or CE on its argmax; with
    ``head`` (CE only), the CE over the head's vocabulary (``subset_ce``)."""
    # Only the positions that predict new tokens: gather them before the big output matmul.
    h = torch.cat(new_token_states(draft.model, rows))
    topi = torch.cat([r[3] for r in rows]).long().to(h.device)
    if kind == "ce":
        argmax = topi[:, 0]  # the target's argmax
        return F.cross_entropy(draft.lm_head(h).float(), argmax) if head is None else subset_ce(head, h, argmax)
    topv = torch.cat([r[2] for r in rows]).float().to(h.device)
    logq = F.log_softmax(draft.lm_head(h).float(), dim=-1)
    logp = F.log_softmax(topv, dim=-1)
    return (logp.exp() * (logp - logq.gather(-1, topi))).sum(-1).mean()


def subset_ce(head: SubsetHead, h: torch.Tensor, argmax: torch.Tensor) -> torch.Tensor:
    """The cross-entropy of the draft's distribution over ``head``'s vocabulary (the tokens it drafts
    from) at the positions whose target ``argmax`` is one of them; 0 where none is."""
    where = subset_positions(head.vocab, argmax, head.vocab_size)
    inside = where >= 0
    ce = F.cross_entropy(head.scores(h[inside]).float(), where[inside], reduction="sum")
    return ce / inside.sum().clamp(min=1)


def train(draft, data, steps: int, lr: float, batch: int = 8, kind: str = "kl", seed: int = 0, log_every: int = 25,
          seconds: float | None = None, head: SubsetHead | None = None):
    """AdamW, warm-up and cosine decay; with ``seconds``, fewer steps where ``steps`` would take
    longer (from the speed of steps 6 to 20). Returns ``(step, mean loss)`` every ``log_every``.
    ``head``: with CE, the loss over its vocabulary alone (``loss_on``)."""
    if not 1 <= batch <= len(data):
        raise ValueError(f"batch must be between 1 and the {len(data)} training rows, got {batch!r}")
    rng = random.Random(seed)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    # Short warm-up then cosine decay: a few hundred steps from a good start need no more.
    total = [steps]  # the schedule reads it: a time budget may shorten it after 20 steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s / max(total[0], 1), 1))))
    draft.train()
    start, history, running, step = time.perf_counter(), [], [], 0
    while step < total[0]:
        loss = loss_on(draft, rng.sample(data, batch), kind, head)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        running.append(loss.item())
        if step == 4:
            warm = (5, time.perf_counter() - start)  # left out of the speed: see steps_within
        if step == 19:
            total[0] = steps_within(seconds, steps, 20, time.perf_counter() - start, warm)
        if (step + 1) % log_every == 0 or step == 0 or step == total[0] - 1:
            history.append((step + 1, sum(running) / len(running)))
            print(f"  step {step + 1}: loss {history[-1][1]:.3f}  ({time.perf_counter() - start:.0f} s)", flush=True)
            running = []
        step += 1
    draft.eval()
    return history


@torch.inference_mode()
def eval_loss(draft, data, kind: str = "kl", batch: int = 16, head: SubsetHead | None = None) -> float:
    losses = [loss_on(draft, data[i: i + batch], kind, head).item() for i in range(0, len(data), batch)]
    return sum(losses) / len(losses)


@torch.inference_mode()
def first_guess_accuracy(draft, data, batch: int = 16, head: SubsetHead | None = None) -> float:
    """How often the draft's most likely token (over the whole vocabulary, or with ``head`` over the
    tokens it drafts from) is the target's, over the rows' new positions: the share of first greedy
    drafts the target keeps."""
    scorer = draft.lm_head if head is None else head
    hits = total = 0
    for i in range(0, len(data), batch):
        rows = data[i: i + batch]
        guess = scorer(torch.cat(new_token_states(draft.model, rows))).argmax(-1)
        target = torch.cat([r[3][:, 0] for r in rows]).to(guess.device)  # topi[:, 0]: the target's argmax
        hits, total = hits + (guess == target).sum().item(), total + len(target)
    return hits / total


def held_out(data, tok, every: int | None) -> tuple[list, list]:
    """``(training rows, held-out rows)``: with ``every``, the rows of every ``every``-th prompt, as
    the other trainers hold out (the same rows for the same data); without it, the last 32 rows, as
    the shipped draft was made."""
    if every is None:
        if len(data) <= 32:
            raise ValueError(f"data: holding out its last 32 rows leaves none of its {len(data)} to train on")
        return data[:-32], data[-32:]
    return split_held_out(data, varied_prompts(tok) + prompt_ids(tok), every)


def arguments(argv=None) -> argparse.Namespace:
    """The command line: the recipe, the data and where the draft goes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--init-layer", type=int, default=0, help="target layer to copy (-1: the last)")
    parser.add_argument("--loss", choices=["kl", "ce"], default="kl")
    parser.add_argument("--gen-seconds", type=float, default=240, help="time budget for generating data")
    parser.add_argument("--data", help="cache the generated data in this torch file (reused if it exists)")
    add_corpus_arguments(parser, "with the target's logits recomputed in one pass")
    parser.add_argument("--held-out-every", type=int, help="hold out the rows of every N-th prompt, as the "
                        "other trainers do (default: the last 32 rows)")
    parser.add_argument("--vocab", type=int, default=2048,
                        help="output vocabulary of the shipped draft: the tokens the target uses most (0: all)")
    parser.add_argument("--out", default="draft.safetensors", help="where the trained layer + norm go")
    parser.add_argument("--seconds", type=float, help="time budget for training (fewer steps if needed)")
    parser.add_argument("--device", help="cuda, mps or cpu (default: the best there is)")
    args = parser.parse_args(argv)
    check_corpus_arguments(parser, args)
    return args


def main(argv=None):
    import logitlab as ll

    args = arguments(argv)
    torch.manual_seed(0)

    model, tok = ll.load("smollm2-135m", device=args.device)
    if args.corpus and args.loss == "ce":  # CE needs the target's argmax alone: no pass of the target
        data = greedy_rows(tok, args.corpus, args.prompts)
    elif args.corpus:
        data = logit_rows(model, tok, args.corpus, args.prompts)
    else:
        data = load_or_make_data(model, tok, args.data, args.gen_seconds)
    data, held = held_out(data, tok, args.held_out_every)
    vocab = choose_vocabulary(data, model.config.vocab_size, args.vocab) if args.vocab else None
    # Measured as it will draft: over its output vocabulary; with CE also trained on it alone.
    head = None if vocab is None else SubsetHead(model.model.embed_tokens.weight, vocab)
    loss_head = head if args.loss == "ce" else None
    draft = build_draft(model, args.init_layer, args.layers)
    before = [eval_loss(draft, held, args.loss, head=loss_head), first_guess_accuracy(draft, held, head=head)]
    print(f"held-out loss and first-guess accuracy before training: {before[0]:.3f}, {before[1]:.3f}")
    t0 = time.perf_counter()
    history = train(draft, data, args.steps, args.lr, args.batch, args.loss, seconds=args.seconds, head=loss_head)
    train_seconds = time.perf_counter() - t0
    after = [eval_loss(draft, held, args.loss, head=loss_head), first_guess_accuracy(draft, held, head=head)]
    print(f"trained {history[-1][0]} steps in {train_seconds:.0f} s; held-out loss and first-guess accuracy "
          f"{after[0]:.3f}, {after[1]:.3f}")
    save_draft(draft, args.out, vocab)
    write_log(args.out, {"recipe": vars(args), **data_summary(data, held), "train_seconds": round(train_seconds),
                         "steps_run": history[-1][0], "loss": history,
                         "held_out": {"loss": [round(before[0], 4), round(after[0], 4)],
                                      "first_guess_accuracy": [round(before[1], 4), round(after[1], 4)]},
                         "machine": machine(model)})
    print(f"saved {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB) and its training log")


if __name__ == "__main__":
    main()
