"""Train PaSS look-ahead embeddings for SmolLM2-135M, for chapter 8 ("Parallel speculative sampling").

The shipped embeddings (``ll.lookahead.load_pretrained``) were made in two runs, the second
continuing from the first:

    python -m logitlab.train_lookahead --data medusa_data.pt --also draft_data.pt \
        --steps 220 --batch 3 --groups 16 --lr 0.03 --out stage1.safetensors
    python -m logitlab.train_lookahead --data medusa_data.pt --also draft_data.pt \
        --steps 180 --batch 4 --groups 32 --lr 0.01 --init stage1.safetensors --out lookahead.safetensors

(12 and 17 minutes on 2 CPU cores; the second run uses the faster two-pass loss of
``logitlab.lookahead.lookahead_losses``, which the first predates: same loss, less backward work.)

The data are the model's own continuations with its top-64 logits at every new position, made
by ``logitlab.train_draft.make_data`` on chapter 7's 300 varied prompts (``--gen-seconds`` of
generation when the ``--data`` file does not exist yet; the book's run reused chapter 7's file)
plus chapter 6's draft data (``--also``). The rows of every seventh prompt are held out.

Why this design:

* One set of ``k = 8`` embeddings is trained, and a PaSS drafter with ``k < 8`` uses its first
  ``k``. Slot ``i`` attends to the context and to slots ``1..i-1`` only, so what slots 1..k
  predict does not depend on the vectors after them: the first k are a working set of k. (What
  the joint training adds is that slot i's vector is also shaped to help the later slots, which
  read its keys and values; a set trained for k alone might be slightly better at small k.)
* The loss is KL(target || slot) on the target's recorded top-64, for every slot, at ``groups``
  random contexts per row, all the slot groups scored in one pass with a tree mask
  (``logitlab.lookahead.training_layout``). Gradients flow through the frozen model into the
  ``8 x 576`` numbers. The rows run first without gradients, then the slots on their cache, so
  the backward pass runs through the slots only.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from .lookahead import load_lookahead, save_lookahead, slot_accuracy, train_lookahead, training_curve
from .train_draft import load_or_make_data, prompt_ids
from .train_medusa import varied_prompts


def main(argv=None):
    import logitlab as ll

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=8, help="look-ahead embeddings")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch", type=int, default=4, help="rows per step")
    parser.add_argument("--groups", type=int, default=16, help="contexts per row per step")
    parser.add_argument("--gen-seconds", type=float, default=240, help="time budget for generating data")
    parser.add_argument("--data", help="the generated data as a torch file (reused if it exists)")
    parser.add_argument("--also", nargs="*", default=[], help="more data files (train_draft's)")
    parser.add_argument("--held-out-every", type=int, default=7)
    parser.add_argument("--init", help="continue from embeddings saved in this file (their curve is kept)")
    parser.add_argument("--out", default="lookahead.safetensors")
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    model, tok = ll.load("smollm2-135m", device="cpu")
    data = load_or_make_data(model, tok, args.data, args.gen_seconds, prompts=varied_prompts(tok))
    for path in args.also:
        data += torch.load(path)
    held_prompts = {tuple(p) for p in (varied_prompts(tok) + prompt_ids(tok))[:: args.held_out_every]}
    held = [r for r in data if tuple(r[0][: r[1]].tolist()) in held_prompts][:48]
    data = [r for r in data if tuple(r[0][: r[1]].tolist()) not in held_prompts]
    print(f"{len(data)} training rows, {sum(len(r[2]) for r in data)} new tokens; {len(held)} held-out rows")
    t0 = time.perf_counter()
    start, before = None, []
    if args.init:
        start = load_lookahead(model, args.init)
        curve = training_curve(args.init)
        before = [] if curve is None else curve.tolist()
    lookahead, losses = train_lookahead(model, args.k, data, args.steps, args.lr, args.batch, args.groups,
                                        lookahead=start)
    seconds = time.perf_counter() - t0
    first, last = sum(losses[0]) / args.k, sum(sum(x) for x in losses[-10:]) / (10 * args.k)
    print(f"trained {args.steps} steps in {seconds:.0f} s; mean KL per slot {first:.3f} -> {last:.3f} (last 10 steps)")
    print(f"held-out top-1 accuracy per slot: {[round(a, 3) for a in slot_accuracy(lookahead, held)]}")
    save_lookahead(lookahead, args.out, before + losses)
    print(f"saved {args.out} ({os.path.getsize(args.out) / 1e3:.0f} KB)")


if __name__ == "__main__":
    main()
