"""Train PaSS look-ahead embeddings for SmolLM2-135M, for chapter 8 ("Parallel speculative sampling").

The shipped embeddings (``ll.speculative.pass_embeddings.load_pretrained``) were made in two runs, the second
continuing from the first:

    python -m logitlab.training.lookahead --data medusa_data.pt --also draft_data.pt \
        --steps 220 --batch 3 --groups 16 --lr 0.03 --out stage1.safetensors
    python -m logitlab.training.lookahead --data medusa_data.pt --also draft_data.pt \
        --steps 180 --batch 4 --groups 32 --lr 0.01 --init stage1.safetensors --out lookahead.safetensors

(12 and 17 minutes on 2 CPU cores; the second run uses the faster two-pass loss of
``lookahead_losses`` below, which the first predates: same loss, less backward work.)

``--corpus corpus/*.npz --prompts prompts.jsonl.xz`` trains on the repository's corpus instead
(``logitlab.training.corpus``), on the answers long enough for every slot, holding out the rows
the EAGLE trainer holds out; ``--train-rows N`` samples N of them, since each step reads only
``--batch`` rows and the target's logits are recomputed for the rows read. A JSON log beside the
embeddings gives the recipe, the data, the time and the held-out accuracy per slot.

The data are the model's own continuations with its top-64 logits at every new position, made
by ``logitlab.training.data.make_data`` on chapter 7's 300 varied prompts (``--gen-seconds`` of
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
  (``pass_embeddings.training_layout``). Gradients flow through the frozen model into the
  ``8 x 576`` numbers. The rows run first without gradients, then the slots on their cache, so
  the backward pass runs through the slots only.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time

import torch
import torch.nn.functional as F

from .._validate import check_body_and_head
from ..decoding.passes import additive_mask
from ..decoding.tree_shape import tree_attention_mask, tree_position_ids
from ..speculative.pass_embeddings import (
    LookaheadEmbeddings,
    check_lookahead,
    load_pretrained,
    save_lookahead,
    training_curve,
    training_layout,
)
from .corpus import add_corpus_arguments, check_corpus_arguments, token_rows, with_logits
from .data import data_summary, load_or_make_data, machine, prompt_ids, split_held_out, varied_prompts, write_log

# Up to this many tokens of training rows, ``train_lookahead`` keeps every row's KV cache (about
# 46 kB a token for SmolLM2-135M in float32: 1.5 GB) instead of recomputing it at every step.
ROW_CACHE_TOKENS = 32_768


@torch.no_grad()
def row_caches(model, rows) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Each row's own KV cache, one ``(keys, values)`` pair per layer: what the first pass of
    ``lookahead_losses`` computes, which the vectors being trained cannot change."""
    device = model.model.embed_tokens.weight.device
    caches = []
    for tokens, *_ in rows:
        cache = model.model(input_ids=tokens[None].to(device), use_cache=True).past_key_values
        caches.append([(layer.keys, layer.values) for layer in cache.layers])
    return caches


def stacked_cache(caches, width: int):
    """One batch's cache from rows' own caches (``row_caches``), each right-padded with zeros to
    ``width`` positions: the padding is never attended to, as in a batched pass."""
    from transformers import DynamicCache

    def padded(states):  # [1, heads, length, dim] -> [1, heads, width, dim]
        return F.pad(states, (0, 0, 0, width - states.shape[2]))

    cache = DynamicCache()
    for layer in range(len(caches[0])):
        keys = torch.cat([padded(row[layer][0]) for row in caches])
        values = torch.cat([padded(row[layer][1]) for row in caches])
        cache.update(keys, values, layer)
    return cache


def lookahead_losses(lookahead: LookaheadEmbeddings, rows, groups: int, rng: random.Random,
                     caches=None) -> torch.Tensor:
    """KL(target || look-ahead) per slot, ``[k]``, averaged over ``groups`` random contexts of each row.

    ``rows`` are training rows of ``logitlab.training.data`` (tokens, start of the new tokens, top-64
    logits ``topv``/ids ``topi`` at the positions predicting them): the target's distribution of
    token ``t + 1 + i`` is at position ``t + i``, row ``t + i - (start - 1)`` of ``topv``. That is
    the target's distribution given the true tokens up to ``t + i``, the ones the slot skips.

    Two passes: the rows alone, without gradients (the vectors do not affect them), then all the
    slot groups on that cache, each group seeing its own context only (``training_layout``'s
    mask). The backward pass then runs through the slots alone. ``caches`` (``row_caches`` of
    ``rows``) replace the first pass: the same losses up to float rounding.
    """
    model, k = lookahead.model, lookahead.k
    embed = model.model.embed_tokens
    device = embed.weight.device
    width = max(len(r[0]) for r in rows)
    tokens_in, masks, positions, targets_v, targets_i = [], [], [], [], []
    for tokens, start, topv, topi in rows:
        last = len(tokens) - 2 - k  # slot k must still have a recorded target
        if last < start - 1:
            raise ValueError(f"rows: a row is too short for k = {k} (needs at least {k + 1} new tokens)")
        starts = [rng.randint(start - 1, last) for _ in range(groups)]
        tokens_in.append(torch.cat([tokens, tokens.new_zeros(width - len(tokens))]))  # right padding: never seen
        parents = training_layout(width, starts, k)
        masks.append(additive_mask(tree_attention_mask(parents)[width:], model))  # the slots' rows
        positions.append(tree_position_ids(parents)[width:])
        rel = torch.tensor([[t + i - (start - 1) for i in range(1, k + 1)] for t in starts], device="cpu")  # [groups, k]
        targets_v.append(topv[rel].float())
        targets_i.append(topi[rel].long())
    if caches is not None:
        cache = stacked_cache(caches, width)
    else:
        with torch.no_grad():
            cache = model.model(input_ids=torch.stack(tokens_in).to(device), use_cache=True).past_key_values
    slots = lookahead.inputs().repeat(groups, 1)  # [groups * k, d]: the k vectors, once per group
    hidden = model.model(inputs_embeds=slots.expand(len(rows), -1, -1), past_key_values=cache, use_cache=True,
                         attention_mask=torch.stack(masks)[:, None].to(device),
                         position_ids=torch.stack(positions).to(device)).last_hidden_state
    logq = F.log_softmax(model.lm_head(hidden).float(), dim=-1)  # [B, groups * k, V]
    logq = logq.view(len(rows), groups, k, -1)
    logp = F.log_softmax(torch.stack(targets_v).to(device), dim=-1)  # the target renormalised over its top 64
    kl = (logp.exp() * (logp - logq.gather(-1, torch.stack(targets_i).to(device)))).sum(-1)  # [B, groups, k]
    return kl.mean(dim=(0, 1))


def rows_from_tokens(model, sequences, tokenizer=None, top: int = 64) -> list:
    """Training rows from plain text: each sequence (a string, with ``tokenizer``, or token ids)
    is run through ``model`` once, and its top-``top`` logits at every position are recorded,
    the form ``logitlab.training.data.make_data`` produces (the whole sequence counts as new)."""
    return [row for row, _ in _rows_and_states(model, sequences, tokenizer, top, keep_states=False)]


def rows_and_states(model, sequences, tokenizer=None, top: int = 64) -> tuple[list, list[torch.Tensor]]:
    """The rows of ``rows_from_tokens`` and, from the same pass, each row's last hidden states
    at its recorded positions (``[L - 1, H]``, what ``logitlab.training.medusa.hidden_states``
    computes from the rows): one pass over the model instead of two."""
    pairs = list(_rows_and_states(model, sequences, tokenizer, top, keep_states=True))
    return [row for row, _ in pairs], [states for _, states in pairs]


@torch.inference_mode()
def _rows_and_states(model, sequences, tokenizer, top: int, keep_states: bool):
    device = model.model.embed_tokens.weight.device
    for seq in sequences:
        if isinstance(seq, str):
            if tokenizer is None:
                raise ValueError("data: texts need a tokenizer (pass tokenizer=...)")
            seq = tokenizer(seq)["input_ids"]
        ids = torch.as_tensor(seq, dtype=torch.long, device=device)
        if ids.dim() != 1 or len(ids) < 3:
            raise ValueError(f"data: each sequence must be one list of at least 3 token ids, got shape {tuple(ids.shape)}")
        hidden = model.model(input_ids=ids[None]).last_hidden_state[0, :-1]
        logits = model.lm_head(hidden).float()
        v, i = logits.topk(min(top, logits.shape[-1]), dim=-1)
        yield (ids.cpu(), 1, v.half().cpu(), i.int().cpu()), hidden.clone() if keep_states else None


def _as_rows(model, data, tokenizer):
    """Rows as they are, or made from texts / token sequences (``rows_from_tokens``)."""
    if not isinstance(data, (list, tuple)) or not data:
        raise ValueError("data must be a non-empty list of training rows (logitlab.training.data), texts or "
                         "token sequences")
    if all(isinstance(r, tuple) and len(r) == 4 and isinstance(r[2], torch.Tensor) for r in data):
        return list(data)
    return rows_from_tokens(model, data, tokenizer)


def train_lookahead(model, k: int, data, steps: int, lr: float = 0.01, batch: int = 4, groups: int = 16,
                    seed: int = 0, progress: bool = True, lookahead: LookaheadEmbeddings | None = None,
                    tokenizer=None):
    """Train ``k`` look-ahead embeddings for ``model`` (frozen) by distillation.

    ``data``: training rows as made by ``logitlab.training.data.make_data`` (the model's own
    continuations with its top-64 logits), or texts (with ``tokenizer``) or token sequences,
    which are first run through the model to record its logits (``rows_from_tokens``). Each step
    takes ``batch`` rows and ``groups`` random contexts in each. Returns ``(lookahead, losses)``:
    ``losses[s]`` is step s's KL per slot (a list of ``k`` floats), for the loss curve. Adam,
    short warm-up, cosine decay. A progress bar shows the loss unless ``progress=False``.
    """
    check_body_and_head(model, "model")
    for name, v, lo in (("steps", steps, 1), ("batch", batch, 1), ("groups", groups, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
        raise ValueError(f"lr must be a number > 0, got {lr!r}")
    if not isinstance(data, (list, tuple)) or len(data) < batch:
        raise ValueError(f"data must be a list of at least batch={batch} training rows (logitlab.training.data), "
                         "texts or token sequences")
    lookahead = LookaheadEmbeddings(model, k, seed) if lookahead is None else lookahead
    check_lookahead(lookahead, model)
    if lookahead.k != k:
        raise ValueError(f"k={k} but the lookahead given has {lookahead.k} embeddings")
    data = _as_rows(model, data, tokenizer)
    # The rows' own pass does not depend on the vectors: with little data, run it once per row.
    caches = row_caches(model, data) if sum(len(r[0]) for r in data) <= ROW_CACHE_TOKENS else None
    rng = random.Random(seed)
    opt = torch.optim.Adam(lookahead.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 10) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    frozen = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)  # gradients flow through the model to the vectors only
    losses, start = [], time.perf_counter()
    bar = _progress(steps, progress)
    try:
        for step in range(steps):
            index = rng.sample(range(len(data)), batch)  # the same draws as sampling the rows themselves
            per_slot = lookahead_losses(lookahead, [data[i] for i in index], groups, rng,
                                        None if caches is None else [caches[i] for i in index])
            opt.zero_grad()
            per_slot.mean().backward()
            opt.step()
            sched.step()
            losses.append(per_slot.tolist())
            bar(step, sum(losses[-1]) / k, time.perf_counter() - start)
    finally:
        for p, f in zip(model.parameters(), frozen):
            p.requires_grad_(f)
    return lookahead, losses


def _progress(steps: int, enabled: bool):
    """A progress bar (tqdm's, in a notebook or a terminal) updated once per step."""
    if not enabled:
        return lambda step, loss, seconds: None
    from tqdm.auto import tqdm

    bar = tqdm(total=steps, desc="look-ahead training")

    def update(step, loss, seconds):
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}")
        if step == steps - 1:
            bar.close()

    return update


@torch.inference_mode()
def slot_accuracy(lookahead: LookaheadEmbeddings, rows, groups: int = 16, seed: int = 0) -> list[float]:
    """Top-1 accuracy per slot on ``rows``: how often slot i's most likely token is the target's
    most likely token ``i + 1`` places ahead (the rate greedy PaSS would accept it at, if every
    earlier draft were right)."""
    rng = random.Random(seed)
    model, k = lookahead.model, lookahead.k
    hits, total = torch.zeros(k, device="cpu"), 0
    device = model.model.embed_tokens.weight.device
    for row in rows:
        tokens, start, topv, topi = row
        if len(tokens) - 2 - k < start - 1:
            raise ValueError(f"rows: a row is too short for k = {k} (needs at least {k + 1} new tokens)")
        starts = [rng.randint(start - 1, len(tokens) - 2 - k) for _ in range(groups)]
        parents = training_layout(len(tokens), starts, k)
        inputs = torch.cat([model.model.embed_tokens(tokens.to(device)), lookahead.inputs().repeat(groups, 1)])
        mask = additive_mask(tree_attention_mask(parents), model)[None, None].to(device)
        hidden = model.model(inputs_embeds=inputs[None], attention_mask=mask,
                             position_ids=tree_position_ids(parents)[None].to(device)).last_hidden_state[0]
        guess = model.lm_head(hidden[len(tokens):]).argmax(-1).view(groups, k).cpu()
        rel = torch.tensor([[t + i - (start - 1) for i in range(1, k + 1)] for t in starts], device="cpu")
        hits += (guess == topi[rel][..., 0].long()).float().sum(0)
        total += groups
    return (hits / total).tolist()


def corpus_rows(model, data, held, args, parser) -> tuple[list, list]:
    """A corpus's training and held-out rows (read as text) for ``k`` slots: only the answers
    longer than k (slot k needs a target k + 1 places ahead), a seeded sample of ``--train-rows``
    of them, 48 held out, with the target's logits recomputed for those rows alone."""
    data, held = ([r for r in rows if len(r[0]) - r[1] > args.k] for rows in (data, held))
    if len(data) < args.batch or not held:
        parser.error(f"--corpus: {len(data)} training and {len(held)} held-out answers have more than "
                     f"--k {args.k} new tokens; training needs at least --batch {args.batch}, and some held out")
    if args.train_rows is not None and args.train_rows < len(data):
        data = random.Random(0).sample(data, args.train_rows)
    return with_logits(model, data), with_logits(model, held[:48])


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
    parser.add_argument("--also", nargs="*", default=[], help="more data files (logitlab.training.draft's)")
    add_corpus_arguments(parser, "with the target's logits recomputed for the rows it trains on")
    parser.add_argument("--train-rows", type=int, help="with --corpus: a seeded sample of this many of its training "
                        "rows (each step reads only --batch rows: a few thousand steps see a few thousand rows)")
    parser.add_argument("--held-out-every", type=int, default=7)
    parser.add_argument("--init", help="continue from embeddings saved in this file (their curve is kept)")
    parser.add_argument("--out", default="lookahead.safetensors")
    parser.add_argument("--device", help="cuda, mps or cpu (default: the best there is)")
    args = parser.parse_args(argv)
    check_corpus_arguments(parser, args)
    if args.train_rows is not None and (not args.corpus or args.train_rows < args.batch):
        parser.error(f"--train-rows goes with --corpus and must be at least --batch ({args.batch})")
    torch.manual_seed(0)

    model, tok = ll.load("smollm2-135m", device=args.device)
    if args.corpus:
        data = token_rows(tok, args.corpus, args.prompts)
    else:
        data = load_or_make_data(model, tok, args.data, args.gen_seconds, prompts=varied_prompts(tok))
    for path in args.also:
        data += torch.load(path)
    data, held = split_held_out(data, varied_prompts(tok) + prompt_ids(tok), args.held_out_every)
    data, held = corpus_rows(model, data, held, args, parser) if args.corpus else (data, held[:48])
    print(f"{len(data)} training rows, {sum(len(r[2]) for r in data)} new tokens; {len(held)} held-out rows")
    t0 = time.perf_counter()
    start, before = None, []
    if args.init:
        start = load_pretrained(model, args.init)
        curve = training_curve(args.init)
        before = [] if curve is None else curve.tolist()
    lookahead, losses = train_lookahead(model, args.k, data, args.steps, args.lr, args.batch, args.groups,
                                        lookahead=start)
    seconds = time.perf_counter() - t0
    tail = losses[-10:]  # a run of fewer than 10 steps averages over those it made
    first, last = sum(losses[0]) / args.k, sum(sum(x) for x in tail) / (len(tail) * args.k)
    print(f"trained {args.steps} steps in {seconds:.0f} s; mean KL per slot {first:.3f} -> {last:.3f} (last 10 steps)")
    accuracy = [round(a, 4) for a in slot_accuracy(lookahead, held)]
    print(f"held-out top-1 accuracy per slot: {accuracy}")
    save_lookahead(lookahead, args.out, before + losses)
    write_log(args.out, {"recipe": vars(args), **data_summary(data, held), "train_seconds": round(seconds),
                         "mean_kl_per_slot": [round(first, 4), round(last, 4)], "held_out_top1": accuracy,
                         "machine": machine(model)})
    print(f"saved {args.out} ({os.path.getsize(args.out) / 1e3:.0f} KB)")


if __name__ == "__main__":
    main()
