"""Train the feature-level (EAGLE) drafter for SmolLM2-135M, for chapter 9.

The shipped drafter (``ll.speculative.eagle.load_pretrained``) was made with

    python -m logitlab.training.eagle --data eagle_data.pt --steps 1200 --out eagle.safetensors

on data from two runs of ``logitlab.training.data.make_data`` (900 s at batch 32 with seed 0,
then 2700 s at batch 96 with seed 1: 2560 rows of 128 new tokens), concatenated into one file.
``--corpus corpus/*.npz --prompts prompts.jsonl.xz`` trains on the corpus of
``logitlab.training.corpus`` instead (the repository's ``corpus/`` folder says how its prompts
file is made), read from its token files as text: this trainer records the target's features
itself and needs none of its logits. Without ``--data`` or ``--corpus``, ``--gen-seconds``
makes the data: SmolLM2 answers the varied chat prompts of
``logitlab.training.data`` and continues its plain-text prompts (a quarter of the rows greedy, the
rest at T = 1) for that long. The target then runs once over every row to record its feature
(last hidden state) at every position, and the drafter trains on those: the target's 30 layers
never run during training.

What it learns, at every position t of a row: from the target's feature ``f_t`` and the token
``x_{t+1}`` that followed, predict ``f_{t+1}``. Two losses, as in EAGLE: a regression on the
feature (smooth L1) and the cross-entropy between the target's next-token distribution (its
output layer on ``f_{t+1}``, on the drafter's vocabulary) and the drafter's (the same layer on the
prediction), weighted ``--token-weight``. With ``--unroll 2`` it also learns from its own
predictions ("training-time test", EAGLE-3): the predicted ``f_{t+1}`` and ``x_{t+2}`` must give
``f_{t+2}``, attending to the true features before and to its own prediction, as at drafting time.

The rows of every seventh prompt are held out; the script reports, on their new tokens, how
often the drafter's first and second guesses are the target's most likely token (the acceptance
rate of greedy drafting, position by position).

``--init drafter.safetensors`` continues the training of a drafter this script saved (its weights
and vocabulary) instead of starting a new one: on a CPU an hour's budget is about one pass over the
corpus, and several runs add up. The optimiser starts afresh (warm-up, then the cosine decay over
the run's steps), and the training log counts the steps and seconds of the runs before it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import fast_cpu, fast_gpu
from ..decoding.passes import forward
from ..devices import generator as seeded_generator
from ..speculative.eagle import FeatureDrafter, load_pretrained, save_drafter
from .corpus import add_corpus_arguments, check_corpus_arguments, token_rows
from .data import (
    cached,
    choose_vocabulary,
    data_summary,
    length_batches,
    load_or_make_data,
    machine,
    padded,
    prompt_ids,
    recording_copy,
    return_freed_memory,
    split_held_out,
    steps_within,
    varied_prompts,
    write_log,
)


@torch.inference_mode()
def row_features(target, data, batch: int = 16, layers=None, max_len: int | None = None,
                 dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """The target's last hidden state at every position of every row (``[L, H]`` per row), or with
    ``layers`` the outputs of those layers, concatenated (``[L, len(layers) * H]``). With
    ``max_len``, only the positions ``cropped`` keeps (the pass still reads the whole row); stored
    as ``dtype`` (bfloat16 halves the memory of millions of positions). A ``target`` on the GPU's
    static path (``ll.load``'s default on CUDA) would record a CUDA graph for every batch shape:
    load it with ``fast=False``."""
    feats = [None] * len(data)
    for index in length_batches([len(r[0]) for r in data], batch):  # rows of near-equal length together
        rows = [data[i] for i in index]
        ids, mask = padded([r[0] for r in rows], target.model.embed_tokens.weight.device)
        # Right padding: causal, harmless.
        hidden = forward(target, input_ids=ids, attention_mask=mask, hidden=True, scores=False, layers=layers).hidden
        for b, (i, r) in enumerate(zip(index, rows)):
            feats[i] = hidden[b, crop_start(r, max_len): len(r[0])].to(dtype).clone()
    return feats


def crop_start(row, max_len: int | None) -> int:
    """How many of the row's first tokens ``cropped`` drops: the start of a prompt that makes the
    row longer than ``max_len``, never the answer or the two tokens before it (they predict its
    first tokens)."""
    tokens, start = row[0], row[1]
    return 0 if max_len is None else max(min(len(tokens) - max_len, start - 2), 0)


def cropped(rows, max_len: int):
    """Rows without the start of any prompt that makes a row longer than ``max_len``; their
    features come from ``row_features(..., max_len=max_len)``, recorded on the whole row, so
    they still carry the whole prompt: only the drafter's own attention, whose cost grows with
    the square of the length, sees less of it."""
    out = []
    for tokens, start, topv, topi in rows:
        cut = crop_start((tokens, start), max_len)
        out.append((tokens[cut:], start - cut, topv, topi))
    return out



def batch_tensors(rows, feats, index):
    """Tokens ``[B, L]``, features ``[B, L, H]`` (float32, whatever they are stored as) and mask
    ``[B, L]`` of the rows ``index``."""
    ids, mask = padded([rows[i][0] for i in index], feats[0].device)
    f = torch.zeros(len(index), ids.shape[1], feats[0].shape[1], device=ids.device)
    for b, i in enumerate(index):
        f[b, : len(feats[i])] = feats[i]
    return ids, f, mask


def losses(drafter: FeatureDrafter, ids, feats, mask, token_weight: float, noise: float, unroll: int, gen=None):
    """One loss per unrolled step (``[unroll]``): the mean over the valid positions of
    smooth-L1(predicted, true feature) + token_weight x cross-entropy(target's distribution, drafter's)."""
    batch, length = ids.shape
    positions = torch.arange(length - 1, device=ids.device).expand(batch, -1)
    inputs = feats[:, :-1]
    if noise > 0:  # features at drafting time are the drafter's own, never exact: train on noisy ones
        inputs = inputs + noise * (2 * torch.rand(inputs.shape, generator=gen, device=inputs.device) - 1)
    valid = (mask[:, 1:] * mask[:, :-1]).bool()  # entry t: (f_t, x_{t+1}) -> f_{t+1}
    pred, _ = drafter(inputs, ids[:, 1:], mask[:, 1:], positions)
    top = feats[..., -pred.shape[-1]:]  # the top layer's feature: what is predicted (the last of fused ones)
    result = [step_loss(drafter, pred, top[:, 1:], valid, token_weight)]
    if unroll >= 2:
        out = second_pass(drafter, inputs, ids, mask, pred)
        valid2 = valid[:, 1:] & valid[:, :-1]
        result.append(step_loss(drafter, out, top[:, 2:], valid2, token_weight))
    return torch.stack(result)


def step_loss(drafter, pred, true, valid, token_weight):
    reg = F.smooth_l1_loss(pred, true, reduction="none").mean(-1)
    rows = drafter.lm_head.rows
    p = torch.softmax(true @ rows.T, dim=-1)
    ce = -(p * torch.log_softmax(pred @ rows.T, dim=-1)).sum(-1)
    return (reg + token_weight * ce)[valid].mean()


@torch.inference_mode()
def accuracy(drafter: FeatureDrafter, rows, feats, batch: int = 16) -> list[float]:
    """On the new tokens of ``rows`` (the target's continuation, not the prompt, whose chat
    template is easy to guess): how often the drafter's first guess (from the target's feature)
    and its second (from its own predicted feature) are the target's most likely token over the
    *whole* vocabulary, as greedy verification judges them."""
    hits, counts = torch.zeros(2, device=feats[0].device), torch.zeros(2, device=feats[0].device)
    output = drafter.full_output  # the target's whole output layer
    for i in range(0, len(rows), batch):
        index = list(range(i, min(i + batch, len(rows))))
        ids, f, mask = batch_tensors(rows, feats, index)
        n = ids.shape[1] - 1
        positions = torch.arange(n, device=ids.device).expand(len(ids), -1)
        new = torch.zeros_like(mask[:, 1:], dtype=torch.bool)
        for b, r in enumerate(index):
            new[b, rows[r][1] - 2:] = True  # entry t predicts token t + 2: the new tokens from new_from
        valid = (mask[:, 1:] * mask[:, :-1]).bool() & new
        pred, _ = drafter(f[:, :-1], ids[:, 1:], mask[:, 1:], positions)
        best = (f[:, 1:, -output.shape[1]:] @ output.T).argmax(-1)  # from the top layer's feature
        hits[0] += (drafter.logits(pred).argmax(-1) == best)[valid].sum()
        counts[0] += valid.sum()
        out = second_pass(drafter, f[:, :-1], ids, mask, pred)
        valid2 = valid[:, 1:] & valid[:, :-1]
        hits[1] += (drafter.logits(out).argmax(-1) == best[:, 1:])[valid2].sum()
        counts[1] += valid2.sum()
    return (hits / counts.clamp_min(1)).tolist()


def second_pass(drafter, inputs, ids, mask, pred) -> torch.Tensor:
    """The drafter's second guesses: entry t reads (its own predicted f_{t+1}, x_{t+2}) at position
    t + 1 and attends to the true entries 0..t (``inputs``: the features it was given) and to
    itself, which is the situation of a second draft. One pass over both kinds of entries."""
    n, device = ids.shape[1] - 1, ids.device
    first = drafter.inputs(inputs, ids[:, 1:])
    second = drafter.inputs(pred[:, :-1], ids[:, 2:])
    allowed = torch.zeros(2 * n - 1, 2 * n - 1, dtype=torch.bool, device=device)
    allowed[:n, :n] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    allowed[n:, :n - 1] = torch.ones(n - 1, n - 1, dtype=torch.bool, device=device).tril()
    allowed[n:, n:] = torch.eye(n - 1, dtype=torch.bool, device=device)
    full = allowed[None] & torch.cat([mask[:, 1:], mask[:, 2:]], dim=1).bool()[:, None, :]
    full |= torch.eye(2 * n - 1, dtype=torch.bool, device=device)  # padding entries see themselves
    additive = torch.zeros(full.shape, device=device).masked_fill(~full, torch.finfo(torch.float32).min)
    positions = torch.arange(n, device=device).expand(len(ids), -1)
    return drafter.model(inputs_embeds=torch.cat([first, second], dim=1), attention_mask=additive[:, None],
                         position_ids=torch.cat([positions, positions[:, :-1] + 1], dim=1)).last_hidden_state[:, n:]


def train(drafter, rows, feats, steps: int, lr: float, batch: int = 16, token_weight: float = 0.1,
          noise: float = 0.0, unroll: int = 1, seed: int = 0, progress: bool = True, evaluate=None,
          log_every: int = 200, seconds: float | None = None, autocast: torch.dtype | None = None) -> list[float]:
    """AdamW with a warm-up and a cosine decay; returns the loss of every step (summed over the
    unrolled steps). Shows a progress bar, and what ``evaluate(step)`` returns every ``log_every``
    steps and after the last. With ``seconds``, fewer steps where ``steps`` would take longer
    (counted from the speed of steps 6 to 20, so that the decay still ends at the last step). With
    ``autocast`` (bfloat16), the forward passes run in that precision where torch deems it safe,
    the weights and their updates staying float32 (mixed precision: faster where the device
    multiplies bfloat16 natively, as a CPU with AVX512-BF16 does)."""
    from tqdm.auto import tqdm

    rng, gen = random.Random(seed), seeded_generator(drafter.fc.weight.device, seed)  # row choice; noise
    params = [p for name, p in drafter.named_parameters() if not name.startswith("lm_head")]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    total = [steps]  # the schedule reads it: a time budget may shorten it after 20 steps
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * min(s / max(total[0], 1), 1))))
    drafter.train()
    history, bar, start = [], tqdm(total=steps, desc="EAGLE drafter training", disable=not progress), time.perf_counter()
    step = 0
    while step < total[0]:
        index = [rng.randrange(len(rows)) for _ in range(batch)]
        ids, f, mask = batch_tensors(rows, feats, index)
        with torch.autocast(ids.device.type, dtype=autocast, enabled=autocast is not None):
            loss = losses(drafter, ids, f, mask, token_weight, noise, unroll, gen)
        opt.zero_grad()
        loss.sum().backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        history.append(loss.sum().item())
        bar.update(1)
        bar.set_postfix(loss=f"{history[-1]:.3f}")
        if step == 4:
            warm = (5, time.perf_counter() - start)  # left out of the speed: see steps_within
        if seconds is not None and step == 19:
            total[0] = steps_within(seconds, steps, 20, time.perf_counter() - start, warm)
            bar.total = total[0]
        if evaluate is not None and ((step + 1) % log_every == 0 or step == total[0] - 1):
            drafter.eval()
            bar.write(f"  step {step + 1}: loss {history[-1]:.3f}, held-out accuracy {evaluate(step + 1)}")
            drafter.train()
        step += 1
    bar.close()
    drafter.eval()
    return history


def starting_drafter(model, data, vocab: int, layers=None, init: str | Path | None = None) -> FeatureDrafter:
    """The drafter a training starts from: a new one scoring the ``vocab`` commonest tokens of
    ``data`` or, with ``init``, the one saved there (its weights and its vocabulary), to train on."""
    if init is None:
        return FeatureDrafter(model, choose_vocabulary(data, model.config.vocab_size, vocab), layers)
    drafter = load_pretrained(model, init)
    if drafter.layers != (None if layers is None else tuple(layers)):
        raise ValueError(f"init: the drafter saved there reads the target's layers {drafter.layers}, "
                         f"not {layers} (--layers)")
    # Training changes the weights: no packed copies of them (the CPU fast path) and no static
    # cache (the GPU's), which the loading gave it to draft with.
    fast_cpu.disable(drafter)
    fast_gpu.disable(drafter)
    return drafter


def runs_before(init: str | Path | None) -> dict:
    """What the runs that trained ``init`` did, from the log saved beside it: their steps and
    training seconds (none without ``init`` or its log)."""
    log = None if init is None else Path(init).with_suffix(".json")
    if log is None or not log.exists():
        return {"steps": 0, "train_seconds": 0}
    earlier = json.loads(log.read_text())
    if "runs" in earlier:  # the shipped drafter's log: every run that made it, one after the other
        return {"steps": sum(run["steps_run"] for run in earlier["runs"]),
                "train_seconds": sum(run["train_seconds"] for run in earlier["runs"])}
    before = earlier.get("runs_before", {"steps": 0, "train_seconds": 0})
    return {"steps": before["steps"] + earlier["steps_run"],
            "train_seconds": before["train_seconds"] + earlier["train_seconds"]}


def recorded_features(model, args, layers, *row_sets) -> tuple:
    """``row_features`` of each set of rows, as the command line asks: recorded by a second copy of
    the target in ``--target-dtype`` if that is not float32 (rounding the drafter's own copy would
    stay), kept as ``--feature-dtype``, cropped to ``--max-len``."""
    body = recording_copy(model, args.target_dtype, args.device)
    stored = getattr(torch, args.feature_dtype)
    return tuple(row_features(body, rows, args.feature_batch, layers, args.max_len, stored) for rows in row_sets)


def arguments(argv=None) -> argparse.Namespace:
    """The command line: the recipe, the data and where the drafter goes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--batch", type=int, default=16, help="rows per step")
    parser.add_argument("--vocab", type=int, default=2048, help="tokens the drafter's output layer scores")
    parser.add_argument("--token-weight", type=float, default=0.1)
    parser.add_argument("--noise", type=float, default=0.0, help="uniform noise added to the input features")
    parser.add_argument("--unroll", type=int, default=1, choices=(1, 2), help="2: also train on its own predictions")
    parser.add_argument("--layers", help="fuse these target layers' outputs, e.g. 8,16,30 (the last must be the top)")
    parser.add_argument("--gen-seconds", type=float, default=900, help="time budget for generating data")
    parser.add_argument("--data", help="the generated data as a torch file (reused if it exists)")
    add_corpus_arguments(parser, "read as text (this trainer records the target's features itself)")
    parser.add_argument("--features", help="cache the target's features in this torch file")
    parser.add_argument("--held-out-every", type=int, default=7)
    parser.add_argument("--train-rows", type=int, help="train on a seeded sample of this many rows (default all)")
    parser.add_argument("--eval-rows", type=int, help="measure the held-out accuracy on this many rows (default all)")
    parser.add_argument("--log-every", type=int, default=200, help="steps between held-out measurements")
    parser.add_argument("--seconds", type=float, help="time budget for training (fewer steps if needed)")
    parser.add_argument("--device", help="cuda, mps or cpu (default: the best there is)")
    parser.add_argument("--feature-batch", type=int, default=16, help="rows per pass when recording features")
    parser.add_argument("--max-len", type=int, help="train on at most this many positions of a row (its end)")
    parser.add_argument("--feature-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="how the features are kept (bfloat16: half the memory, for millions of positions)")
    parser.add_argument("--target-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="the target's weights while it records the features (bfloat16: several times faster "
                        "on a CPU with AVX512-BF16, features near the float32 ones the drafter later reads)")
    parser.add_argument("--train-dtype", choices=("float32", "bfloat16"), default="float32",
                        help="the precision of the training's forward passes (bfloat16: mixed precision, "
                        "the weights stay float32)")
    parser.add_argument("--init", help="continue training the drafter saved in this file (its weights and "
                        "vocabulary; --vocab is then not used)")
    parser.add_argument("--out", default="eagle.safetensors")
    args = parser.parse_args(argv)
    check_corpus_arguments(parser, args)
    return args


def main(argv=None):
    import logitlab as ll

    args = arguments(argv)
    torch.manual_seed(0)
    return_freed_memory()  # or the heap fragments over a long run (see its docstring)

    start = time.perf_counter()
    # The stock forward: the fast paths are for decoding. On CUDA the static path would record a CUDA
    # graph for every new shape of the feature pass's batches (rows batched by length: hundreds).
    model, tok = ll.load("smollm2-135m", device=args.device, fast=False)
    prompts = varied_prompts(tok) + prompt_ids(tok)
    if args.corpus:
        data = token_rows(tok, args.corpus, args.prompts)
    else:
        data = load_or_make_data(model, tok, args.data, args.gen_seconds, prompts=prompts)
    data, held = split_held_out(data, prompts, args.held_out_every)
    held = held[: args.eval_rows]
    if args.train_rows is not None and args.train_rows < len(data):  # a seeded sample, for short ablations
        data = [data[i] for i in sorted(random.Random(0).sample(range(len(data)), args.train_rows))]
    t0 = time.perf_counter()
    layers = tuple(int(i) for i in args.layers.split(",")) if args.layers else None
    feats, held_feats = cached(args.features, lambda: recorded_features(model, args, layers, data, held))
    print(f"features of {sum(len(f) for f in feats)} positions ({sum(len(f) for f in held_feats)} held out) "
          f"in {time.perf_counter() - t0:.0f} s")
    feature_seconds = time.perf_counter() - t0
    if args.max_len:
        data, held = cropped(data, args.max_len), cropped(held, args.max_len)
    drafter = starting_drafter(model, data, args.vocab, layers, args.init)
    before = accuracy(drafter, held, held_feats)
    print(f"held-out accuracy (first, second guess) before training: {before}")
    t0, curve = time.perf_counter(), []

    def evaluate(step):
        curve.append([step, *[round(a, 4) for a in accuracy(drafter, held, held_feats)]])
        return curve[-1][1:]

    history = train(drafter, data, feats, args.steps, args.lr, args.batch, args.token_weight, args.noise, args.unroll,
                    evaluate=evaluate, log_every=args.log_every, seconds=args.seconds,
                    autocast=None if args.train_dtype == "float32" else getattr(torch, args.train_dtype))
    train_seconds = time.perf_counter() - t0
    print(f"trained {len(history)} steps in {train_seconds:.0f} s")
    print(f"held-out accuracy (first, second guess): {curve[-1][1:]}")
    save_drafter(drafter, args.out)
    # What the chapter shows of the training: the recipe, the data, the times and the curves.
    log = {"recipe": vars(args), **data_summary(data, held), "feature_seconds": round(feature_seconds), "train_seconds": round(train_seconds),
           "loss": [round(x, 4) for x in history], "held_out_accuracy": [[0, *before]] + curve,
           "steps_run": len(history), "runs_before": runs_before(args.init), "machine": machine(model)}
    write_log(args.out, log)
    print(f"saved {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB) and its training log; "
          f"{time.perf_counter() - start:.0f} s in all")


if __name__ == "__main__":
    main()
