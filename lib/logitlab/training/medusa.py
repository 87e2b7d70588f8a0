"""Train Medusa heads for SmolLM2-135M, for chapter 7 ("Typical acceptance").

The shipped heads (``ll.speculative.medusa_heads.load_pretrained``) were made with

    python -m logitlab.training.medusa --gen-seconds 600 --data medusa_data.pt --also draft_data.pt \
        --steps 1500 --out heads.safetensors

``--gen-seconds 600`` lets SmolLM2 answer 300 varied chat prompts for ten minutes, recording its
top-64 logits at every new position (``logitlab.training.data``; 896 continuations of 128
tokens here), and ``--also`` adds the data that trained chapter 6's draft model (``draft_data.pt``
from ``python -m logitlab.training.draft --data draft_data.pt``, 768 more). The target then runs
once over all of it to record its last hidden states (183k positions, about 6 minutes), and the
heads train on those states: 1500 steps of 1024 positions, 7 minutes on 2 CPU cores. The
target's 30 layers never run during training, which is what makes it cheap.

The rows of every seventh prompt are held out. Measured on them (top-1 accuracy: the target's
most likely token k + 1 places ahead is head k's first guess): 0.27, 0.15, 0.12, 0.10 for heads
1 to 4; top-3: 0.45, 0.29, 0.23, 0.21. With only the draft model's 40 prompts the first head
reached 0.24 on held-out prompts and 0.42 on rows of prompts it had seen: few contexts are
memorised, hence the varied prompts.

``--corpus corpus/*.npz --prompts prompts.jsonl.xz`` trains on the repository's corpus instead
(``logitlab.training.corpus``, read as text: one pass of the target records the states, and its
output layer gives the top-64 logits from them), holding out the rows the EAGLE trainer holds
out. ``--target-dtype bfloat16`` makes that pass in bfloat16, about four times faster on a CPU
with AVX512-BF16 (1.5k positions a second on the book's; a GPU does millions in a minute). The log written beside the heads
(``heads.json``) gives the recipe, the data, the times and the held-out accuracies.

Why this design:

* Head k reads the hidden state ``h_t`` at position t (the one that predicts token t + 1) and
  learns the target's distribution of token t + 1 + k, which the data holds: the top-64 logits
  the target produced at position t + k while generating. This is distillation on the model's
  own output, as for the draft model, so the heads imitate where the target actually goes.
* Each head is one residual block starting at the identity (``logitlab.speculative.medusa_heads.ResBlock``), and
  all share the target's frozen output layer restricted to the 2048 tokens it uses most: only
  ``4 x (576 x 576 + 576)`` numbers are trained and shipped (about 2.7 MB in float16). The
  target's probability on tokens outside the 2048 is dropped and the rest renormalised, since
  the heads cannot propose those tokens anyway.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.nn.functional as F

from ..speculative.medusa_heads import MedusaHeads, save_heads
from ..speculative.subset_head import subset_positions
from .corpus import add_corpus_arguments, check_corpus_arguments, token_rows
from .data import (
    cached,
    choose_vocabulary,
    data_summary,
    length_batches,
    load_or_make_data,
    machine,
    new_token_states,
    prompt_ids,
    recording_copy,
    split_held_out,
    varied_prompts,
    write_log,
)


@torch.inference_mode()
def hidden_states(target, data, batch: int = 16) -> list[torch.Tensor]:
    """The target's last hidden state at each recorded position of each row (``[n, H]`` per row,
    on the target's device, in its dtype). Rows go through in batches of near-equal length (a
    corpus's rows run from tens to hundreds of tokens) and come back in their own order."""
    states = [None] * len(data)
    for index in length_batches([len(r[0]) for r in data], batch):
        for i, h in zip(index, new_token_states(target.model, [data[i] for i in index])):
            states[i] = h.clone()  # not a view that keeps its whole batch alive
    return states


@torch.inference_mode()
def with_top_logits(target, rows, states, k: int = 64) -> list:
    """Rows read as text (``token_rows``: no logits) with the target's top-``k`` logits at every
    answer position, taken from their hidden states by the target's output layer: the states'
    pass is then the only pass over a corpus, where ``logit_rows`` would make a second."""
    head = target.lm_head
    device = head.weight.device
    out = []
    for (tokens, start, _, _), h in zip(rows, states):
        # 64 positions at a time: logits blocks of one size, which the allocator reuses (rows'
        # own sizes, up to 256 x 49,152 floats, fragmented a CPU's heap by gigabytes over a corpus)
        v, top = map(torch.cat, zip(*(head(h[i: i + 64].to(device, head.weight.dtype)).float().topk(k, dim=-1)
                                     for i in range(0, len(h), 64))))
        out.append((tokens, start, v.half().cpu(), top.int().cpu()))
    return out


def training_tensors(data, states, vocab: torch.Tensor, vocab_size: int, num_heads: int):
    """Flatten the rows: hidden states ``[N, H]``, the target's top-k restricted to ``vocab``
    (indices into it ``[N, k]`` and probabilities ``[N, k]``, zero outside), and for each head the
    row of its target (``[num_heads, N]``, -1 where the sequence ends first)."""
    hidden = torch.cat(states).float()
    device = hidden.device  # all four on the states' device: training indexes them together
    topv = torch.cat([r[2] for r in data]).float().to(device)
    sub = subset_positions(vocab, torch.cat([r[3] for r in data]).to(device), vocab_size)  # [N, k]
    probs = torch.softmax(topv.masked_fill(sub < 0, float("-inf")), dim=-1).nan_to_num(0.0)
    target_row = torch.full((num_heads, len(hidden)), -1, dtype=torch.long, device=device)
    offset = 0
    for r in data:
        n = len(r[2])
        for k in range(1, num_heads + 1):
            j = torch.arange(max(n - k, 0), device=device)
            target_row[k - 1, offset + j] = offset + j + k
        offset += n
    return hidden, sub.clamp_min(0), probs, target_row


def head_losses(heads: MedusaHeads, hidden, sub, probs, target_row, index) -> torch.Tensor:
    """KL(target || head k) for each head, averaged over the positions ``index`` it can learn from."""
    logq = F.log_softmax(heads.small_logits(hidden[index]), dim=-1)  # [b, K, vocab]
    losses = []
    for k in range(heads.num_heads):
        rows = target_row[k, index]
        # A position whose target has none of the vocabulary (all probabilities 0) teaches nothing.
        ok = (rows >= 0) & (probs[rows.clamp_min(0)].sum(-1) > 0)
        p, s = probs[rows[ok]], sub[rows[ok]]
        kl = (torch.xlogy(p, p) - p * logq[ok, k].gather(-1, s)).sum(-1)
        losses.append(kl.mean())
    return torch.stack(losses)


@torch.inference_mode()
def accuracy(heads: MedusaHeads, hidden, sub, probs, target_row, top: int = 1, batch: int = 4096) -> list[float]:
    """How often the target's most likely token (among the heads' vocabulary) is among head k's
    ``top`` guesses, per head, over the positions that have a target with some of that vocabulary."""
    guesses = torch.cat([heads.small_logits(hidden[i: i + batch]).topk(top, dim=-1).indices
                         for i in range(0, len(hidden), batch)])  # [N, K, top]
    result = []
    for k in range(heads.num_heads):
        rows = target_row[k]
        ok = (rows >= 0) & (probs[rows.clamp_min(0)].sum(-1) > 0)
        best = sub[rows[ok]].gather(-1, probs[rows[ok]].argmax(-1, keepdim=True))  # [n, 1]
        result.append((guesses[ok, k] == best).any(-1).float().mean().item())
    return result


def train(heads, tensors, steps: int, lr: float, batch: int, weight_decay: float = 0.0, seed: int = 0,
          log_every: int = 250, evaluate=None):
    hidden, sub, probs, target_row = tensors
    gen = torch.Generator(device=hidden.device).manual_seed(seed)  # where the states are
    opt = torch.optim.AdamW(heads.blocks.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / max(steps, 1))))
    start = time.perf_counter()
    for step in range(steps):
        index = torch.randint(len(hidden), (batch,), generator=gen, device=hidden.device)
        loss = head_losses(heads, hidden, sub, probs, target_row, index)
        opt.zero_grad()
        loss.sum().backward()
        opt.step()
        sched.step()
        if (step + 1) % log_every == 0 or step == 0:
            held = f", held-out top-1 accuracy {evaluate()}" if evaluate else ""
            print(f"  step {step + 1}: KL per head {[round(x, 2) for x in loss.tolist()]}{held} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)


def main(argv=None):
    import logitlab as ll

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=1024, help="positions per step")
    parser.add_argument("--vocab", type=int, default=2048, help="tokens the heads' output layer scores")
    parser.add_argument("--gen-seconds", type=float, default=240, help="time budget for generating data")
    parser.add_argument("--data", help="the generated data as a torch file (reused if it exists; "
                                       "logitlab.training.draft's file works)")
    parser.add_argument("--also", nargs="*", default=[], help="more data files to train on (logitlab.training.draft's)")
    add_corpus_arguments(parser, "read as text: the target's states and top-64 logits from one pass")
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--held-out-every", type=int, default=7,
                        help="the rows of every N-th prompt are held out, to measure the accuracy")
    parser.add_argument("--hidden", help="cache the target's hidden states in this torch file")
    parser.add_argument("--out", default="heads.safetensors")
    parser.add_argument("--device", help="cuda, mps or cpu (default: the best there is)")
    parser.add_argument("--state-batch", type=int, default=16, help="rows per pass when recording hidden states")
    parser.add_argument("--target-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="the target's weights while it records the states (bfloat16: several times faster on "
                        "a CPU with AVX512-BF16)")
    args = parser.parse_args(argv)
    check_corpus_arguments(parser, args)
    torch.manual_seed(0)

    model, tok = ll.load("smollm2-135m", device=args.device)
    if args.corpus:  # read as text: its logits come from the states' pass below
        data = token_rows(tok, args.corpus, args.prompts)
    else:
        data = load_or_make_data(model, tok, args.data, args.gen_seconds, prompts=varied_prompts(tok))
    for path in args.also:
        data += torch.load(path)
    data, held = split_held_out(data, varied_prompts(tok) + prompt_ids(tok), args.held_out_every)
    body = recording_copy(model, args.target_dtype, args.device)  # the states (and a corpus's logits)
    t0 = time.perf_counter()
    states, held_states = cached(args.hidden, lambda: (hidden_states(body, data, args.state_batch),
                                                       hidden_states(body, held, args.state_batch)))
    if args.corpus:
        data, held = with_top_logits(body, data, states), with_top_logits(body, held, held_states)
    vocab = choose_vocabulary(data, model.config.vocab_size, args.vocab)
    train_t = training_tensors(data, states, vocab, model.config.vocab_size, args.heads)
    held_t = training_tensors(held, held_states, vocab, model.config.vocab_size, args.heads)
    state_seconds = time.perf_counter() - t0
    print(f"hidden states of {len(train_t[0])} positions ({len(held_t[0])} held out) in {state_seconds:.0f} s")
    heads = MedusaHeads(model.lm_head.weight, args.heads, vocab).to(model.device)
    before = [round(a, 4) for a in accuracy(heads, *held_t)]
    print(f"held-out top-1 accuracy before training: {before}")
    t0 = time.perf_counter()
    train(heads, train_t, args.steps, args.lr, args.batch, args.weight_decay,
          evaluate=lambda: [round(a, 3) for a in accuracy(heads, *held_t)])
    train_seconds = time.perf_counter() - t0
    print(f"trained {args.steps} steps in {train_seconds:.0f} s")
    after = {top: [round(a, 4) for a in accuracy(heads, *held_t, top=top)] for top in (1, 3)}
    for top, per_head in after.items():
        print(f"held-out top-{top} accuracy per head: {per_head}")
    save_heads(heads, args.out)
    write_log(args.out, {"recipe": vars(args), **data_summary(data, held), "state_seconds": round(state_seconds),
                         "train_seconds": round(train_seconds), "held_out_top1_before": before,
                         "held_out_top1": after[1], "held_out_top3": after[3], "machine": machine(model)})
    print(f"saved {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB) and its training log")


if __name__ == "__main__":
    main()
