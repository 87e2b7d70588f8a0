"""Train a one-layer draft model for SmolLM2-135M, for speculative sampling (chapter 6).

The shipped draft (``ll.drafters.load_pretrained``) was made with

    python -m logitlab.train_draft --gen-seconds 540 --data data.pt --steps 1000 --out draft.safetensors

which generates about nine minutes of training data with SmolLM2 itself, trains for 1000 steps
of 8 sequences, and keeps the 2048 tokens the target uses most as the draft's output vocabulary
(about half an hour on 2 CPU cores in all).

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
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time

import torch
import torch.nn.functional as F

from .decoding import generator as seeded_generator
from .decoding import model_device
from .drafters import build_draft

# Varied short prompts: chat turns (the model is an instruction model, and chat is how the
# book uses it) and plain text to continue. The drafter must not be tuned to one style.
CHAT_PROMPTS = [
    "Explain what a hash table is in two sentences.",
    "Write a haiku about autumn rain.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Give me three tips for learning to play the guitar.",
    "Summarise the plot of Romeo and Juliet.",
    "How do vaccines train the immune system?",
    "Write a Python function that reverses a string.",
    "What are the main causes of inflation?",
    "Describe a sunset to someone who has never seen one.",
    "List five healthy breakfast ideas.",
    "Why is the sky blue?",
    "Write a short story about a robot who learns to paint.",
    "What is the difference between weather and climate?",
    "Translate 'good morning, how are you?' into French and Spanish.",
    "Explain recursion to a ten-year-old.",
    "What should I pack for a weekend camping trip?",
    "Write a polite email declining a meeting invitation.",
    "How does a bicycle stay upright?",
    "Give a recipe for a simple tomato soup.",
    "What is photosynthesis?",
    "Compare cats and dogs as pets.",
    "Write a limerick about a forgetful wizard.",
    "What is machine learning?",
    "How can I improve my sleep?",
    "Explain the rules of chess briefly.",
    "Write a SQL query that counts orders per customer.",
]
TEXT_PROMPTS = [
    "The history of the printing press begins",
    "Once upon a time, in a village at the edge of a forest,",
    "def fibonacci(n):\n",
    "The mitochondria is",
    "In 1969, the first humans",
    "Dear hiring manager,\n\nI am writing to",
    "The best way to learn a new language is",
    "Water boils at 100 degrees Celsius because",
    "Chapter 1\n\nThe rain had not stopped for three days",
    "import numpy as np\n\n# Compute the mean of",
    "The stock market fell sharply today after",
    "Here are some facts about the ocean:\n1.",
    "My favourite recipe for pancakes is",
    "The theory of evolution states that",
]
# Held out from training: the prompts the drafter is measured on.
HELD_OUT = [
    "Explain how a refrigerator keeps food cold.",
    "Write a short poem about the sea.",
    "What are the benefits of regular exercise?",
    "Describe how to make a cup of tea.",
    "Why do leaves change colour in autumn?",
    "Write a Python function that checks whether a number is prime.",
    "The city of Paris is known for",
    "Scientists have recently discovered that",
]


def chat(tok, text: str) -> list[int]:
    # (transformers 5 returns a BatchEncoding when tokenizing here: template as text, then tokenize.)
    text = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False).input_ids


def prompt_ids(tok, texts=None) -> list[list[int]]:
    """Token ids of the training prompts (chat prompts in the chat template, the rest as is)."""
    if texts is not None:
        return [chat(tok, t) if not t[:1].islower() and t.endswith(("?", ".", "!")) else tok(t).input_ids
                for t in texts]
    return [chat(tok, t) for t in CHAT_PROMPTS] + [tok(t).input_ids for t in TEXT_PROMPTS]


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


def choose_vocabulary(data, vocab_size: int, size: int) -> torch.Tensor:
    """The ``size`` tokens to which the target gives the most probability mass over the
    training data (its top-k distribution at every recorded position), as sorted ids."""
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for _, _, topv, topi in data:
        mass.index_add_(0, topi.long().flatten(), torch.softmax(topv.float(), dim=-1).double().flatten())
    return mass.topk(size).indices.sort().values


# --- Training data: the target's own continuations, with its top-k logits ----------------------


@torch.inference_mode()
def generate_with_logits(model, prompts: list[list[int]], temps: list[float], max_new_tokens: int, k: int,
                         generator: torch.Generator):
    """Sample continuations (row b at temperature ``temps[b]``, 0 = greedy), recording the
    target's top-``k`` logits at every new position (the prediction *of* each new token).

    A plain decode loop rather than ``ll.generate``, because the logits it computes are the
    distillation targets: keeping them costs nothing, recomputing them is a second forward pass.
    Returns per row ``(tokens [L], new_from, topv [n, k] float16, topi [n, k] int32)``: positions
    ``new_from - 1 .. L - 2`` predict the new tokens.
    """
    width, device = max(len(p) for p in prompts), model_device(model)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    t = torch.tensor(temps, dtype=torch.float32, device=device)[:, None]
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    cache, new, topv, topi = out.past_key_values, [], [], []
    for step in range(max_new_tokens):
        logits = out.logits[:, -1].float()
        v, i = logits.topk(k, dim=-1)
        topv.append(v.half())
        topi.append(i.int())
        probs = torch.softmax(logits / t.clamp_min(1e-6), dim=-1)
        sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        token = torch.where(t.squeeze(-1) == 0, logits.argmax(-1), sampled)
        new.append(token)
        if step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=(mask.sum(-1, keepdim=True) - 1),
                    past_key_values=cache, use_cache=True)
        cache = out.past_key_values
    new, topv, topi = torch.stack(new, 1), torch.stack(topv, 1), torch.stack(topi, 1)
    return [(torch.tensor(p + new[b].tolist()), len(p), topv[b].cpu(), topi[b].cpu()) for b, p in enumerate(prompts)]


def make_data(model, tok, seconds: float, batch: int = 32, max_new_tokens: int = 128, k: int = 64, seed: int = 0,
              prompts: list[list[int]] | None = None):
    """Generate for about ``seconds``: batches of random prompts (token ids; by default this
    module's), a quarter of each batch greedy and the rest at T = 1."""
    rng, gen = random.Random(seed), seeded_generator(model, seed)
    prompts, data, start = prompt_ids(tok) if prompts is None else prompts, [], time.perf_counter()
    while time.perf_counter() - start < seconds:
        rows = [rng.choice(prompts) for _ in range(batch)]
        temps = [0.0 if b < batch // 4 else 1.0 for b in range(batch)]  # greedy repeats are identical
        data += generate_with_logits(model, rows, temps, max_new_tokens, k, gen)
        print(f"  data: {len(data)} sequences, {time.perf_counter() - start:.0f} s", flush=True)
    return data


def load_or_make_data(model, tok, path: str | None, seconds: float, prompts=None):
    """The data saved at ``path`` if it exists; else ``make_data``'s, saved there when given."""
    if path and os.path.exists(path):
        return torch.load(path)
    start = time.perf_counter()
    data = make_data(model, tok, seconds, prompts=prompts)
    print(f"generated {len(data)} sequences, {sum(len(r[2]) for r in data)} tokens in "
          f"{time.perf_counter() - start:.0f} s")
    if path:
        torch.save(data, path)
    return data


# --- Training ----------------------------------------------------------------------------------


def new_token_states(body, rows) -> list[torch.Tensor]:
    """Run ``body`` (a model without its output layer, ``model.model``) over the rows and return,
    per row, its last hidden states at the positions that predict the row's new tokens
    (``new_from - 1 .. L - 2``, the ones whose top-k logits the row holds)."""
    width, device = max(len(r[0]) for r in rows), body.embed_tokens.weight.device
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    mask = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    for b, (tokens, _, _, _) in enumerate(rows):
        ids[b, : len(tokens)], mask[b, : len(tokens)] = tokens.to(device), 1  # right padding: causal, harmless
    hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state
    return [hidden[b, s - 1: len(t) - 1] for b, (t, s, _, _) in enumerate(rows)]


def loss_on(draft, rows, kind: str = "kl") -> torch.Tensor:
    """KL(target top-k || draft) (target renormalised over its top k), or CE on its argmax."""
    # Only the positions that predict new tokens: gather them before the big output matmul.
    h = torch.cat(new_token_states(draft.model, rows))
    topv = torch.cat([r[2] for r in rows]).float().to(h.device)
    topi = torch.cat([r[3] for r in rows]).long().to(h.device)
    logq = F.log_softmax(draft.lm_head(h).float(), dim=-1)
    if kind == "ce":
        return -logq.gather(-1, topi[:, :1]).mean()  # topi[:, 0] is the target's argmax
    logp = F.log_softmax(topv, dim=-1)
    return (logp.exp() * (logp - logq.gather(-1, topi))).sum(-1).mean()


def train(draft, data, steps: int, lr: float, batch: int = 8, kind: str = "kl", seed: int = 0, log_every: int = 25):
    rng = random.Random(seed)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    # Short warm-up then cosine decay: a few hundred steps from a good start need no more.
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * s / max(steps, 1))))
    draft.train()
    start, history, running = time.perf_counter(), [], []
    for step in range(steps):
        loss = loss_on(draft, rng.sample(data, batch), kind)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        running.append(loss.item())
        if (step + 1) % log_every == 0 or step == 0:
            history.append((step + 1, sum(running) / len(running)))
            print(f"  step {step + 1}: loss {history[-1][1]:.3f}  ({time.perf_counter() - start:.0f} s)", flush=True)
            running = []
    draft.eval()
    return history


@torch.inference_mode()
def eval_loss(draft, data, kind: str = "kl", batch: int = 16) -> float:
    losses = [loss_on(draft, data[i: i + batch], kind).item() for i in range(0, len(data), batch)]
    return sum(losses) / len(losses)


def main(argv=None):
    import logitlab as ll

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--init-layer", type=int, default=0, help="target layer to copy (-1: the last)")
    parser.add_argument("--loss", choices=["kl", "ce"], default="kl")
    parser.add_argument("--gen-seconds", type=float, default=240, help="time budget for generating data")
    parser.add_argument("--data", help="cache the generated data in this torch file (reused if it exists)")
    parser.add_argument("--vocab", type=int, default=2048,
                        help="output vocabulary of the shipped draft: the tokens the target uses most (0: all)")
    parser.add_argument("--out", default="draft.safetensors", help="where the trained layer + norm go")
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    model, tok = ll.load("smollm2-135m")
    data = load_or_make_data(model, tok, args.data, args.gen_seconds)
    held = data[-32:]  # the last batch: a validation loss on unseen continuations
    data = data[:-32]
    draft = build_draft(model, args.init_layer, args.layers)
    print(f"validation loss before training: {eval_loss(draft, held, args.loss):.3f}")
    t0 = time.perf_counter()
    train(draft, data, args.steps, args.lr, args.batch, args.loss)
    print(f"trained {args.steps} steps in {time.perf_counter() - t0:.0f} s; "
          f"validation loss {eval_loss(draft, held, args.loss):.3f}")
    vocab = choose_vocabulary(data, model.config.vocab_size, args.vocab) if args.vocab else None
    save_draft(draft, args.out, vocab)
    print(f"saved {args.out} ({os.path.getsize(args.out) / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
