"""Training data for every drafter in the book: the target's own continuations of varied prompts,
with the target's top-k logits at every new position.

Every trainer distils the target (``python -m logitlab.training.draft``, ``.medusa``,
``.lookahead``): a drafter is judged only on how well it predicts the target, so it learns where
the target actually goes, not human text. The decode step computes the logits anyway, so
recording them costs no extra forward pass. A row is ``(tokens [L], new_from, topv [n, k]
float16, topi [n, k] int32)``: positions ``new_from - 1 .. L - 2`` predict the new tokens.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import random
import time
from pathlib import Path

import torch

from .._validate import check_logits, trusted
from ..decoding.passes import mask_positions
from ..devices import generator as seeded_generator
from ..devices import model_device
from ..fast_cpu import cpu_info
from ..sampling.draw import sample

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


# The draft model of chapter 6 trained on 40 prompts. The heads need many more contexts: each is
# a map from one hidden state, and with few contexts it learns those contexts rather than the
# model. Six kinds of request about fifty topics give 300 chat prompts. None of them is a prompt
# the book measures on (HELD_OUT above, logitlab.bench.DRAFT_PROMPTS, the chapters).
TEMPLATES = ["Explain {}.", "Write a short story about {}.", "What are the most interesting facts about {}?",
             "Describe {} to a child.", "Write a poem about {}.", "Give three practical tips about {}."]
TOPICS = ["volcanoes", "the moon", "honey bees", "trains", "the internet", "chess", "rainforests", "baking bread",
          "electric cars", "the human heart", "glaciers", "photosynthesis", "ancient Rome", "jazz music",
          "recycling", "earthquakes", "vaccines", "the solar system", "coffee", "mountain climbing", "friendship",
          "gardening", "owls", "the printing press", "clouds", "robots", "deserts", "bicycles", "dinosaurs",
          "money", "sleep", "the Olympic Games", "penguins", "windmills", "libraries", "space travel",
          "learning the piano", "rivers", "cats", "a rainy day", "learning a language", "the brain", "pizza",
          "snow", "a busy market", "volunteering", "submarines", "the pyramids of Egypt", "butterflies",
          "a job interview"]


def varied_prompts(tok) -> list[list[int]]:
    return [chat(tok, t.format(topic)) for t in TEMPLATES for topic in TOPICS]



@torch.inference_mode()
def generate_with_logits(model, prompts: list[list[int]], temps: list[float], max_new_tokens: int, k: int,
                         generator: torch.Generator, stop_ids: set[int] | None = None):
    """Sample continuations (row b at temperature ``temps[b]``, 0 = greedy), recording the
    target's top-``k`` logits at every new position (the prediction *of* each new token).

    A plain decode loop rather than ``ll.generate``, because the logits it computes are the
    distillation targets: keeping them costs nothing, recomputing them is a second forward pass.
    Returns per row ``(tokens [L], new_from, topv [n, k] float16, topi [n, k] int32)``: positions
    ``new_from - 1 .. L - 2`` predict the new tokens. With ``stop_ids``, every 16 steps the rows
    that have made one of them leave the batch (a row may run on up to 15 tokens past its stop:
    cut them after), and the loop ends when none is left.
    """
    width, device, n = max(len(p) for p in prompts), model_device(model), len(prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    t = torch.tensor(temps, dtype=torch.float32, device=device)[:, None]
    out = model(input_ids=ids, attention_mask=mask, position_ids=mask_positions(mask), use_cache=True,
                logits_to_keep=1)
    cache = out.past_key_values
    new = torch.zeros(n, max_new_tokens, dtype=torch.long, device=device)
    topv = torch.zeros(n, max_new_tokens, k, dtype=torch.float16, device=device)
    topi = torch.zeros(n, max_new_tokens, k, dtype=torch.int32, device=device)
    rows, ran = torch.arange(n, device=device), [max_new_tokens] * n  # live rows' original index; steps made
    stops = None if not stop_ids else torch.tensor(sorted(stop_ids), device=device)
    stopped = torch.zeros(n, dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        logits = out.logits[:, -1].float()
        v, i = logits.topk(k, dim=-1)
        topv[rows, step], topi[rows, step] = v.half(), i.int()
        # The library's inverse-transform sampler: torch.multinomial's exponential draws over the
        # whole vocabulary took a quarter of a batched CPU step. Greedy rows ignore their draw.
        # The target's logits are not checked for NaN every step (a host read): see the end.
        with trusted():
            drawn = sample(logits / torch.where(t == 0, 1.0, t), 1.0, generator)
        token = torch.where(t[:, 0] == 0, logits.argmax(-1), drawn)
        new[rows, step] = token
        if step == max_new_tokens - 1:
            break
        if stops is not None:
            stopped |= torch.isin(token, stops)
            # One host read every 16 steps (on a GPU each read stalls the queue): finished rows leave,
            # so that the batch's last long answers no longer pay for the short ones.
            if step % 16 == 15:
                keep = (~stopped).nonzero().squeeze(-1)
                for r in rows[stopped].tolist():
                    ran[r] = step + 1
                if len(keep) == 0:
                    break
                if len(keep) < len(rows):
                    cache.batch_select_indices(keep)
                    rows, mask, t, token, stopped = (x[keep] for x in (rows, mask, t, token, stopped))
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        out = model(input_ids=token[:, None], attention_mask=mask, position_ids=(mask.sum(-1, keepdim=True) - 1),
                    past_key_values=cache, use_cache=True)
        cache = out.past_key_values
    new, topv, topi = new.cpu(), topv.cpu(), topi.cpu()
    check_logits(topv.float(), "the target's logits")  # its top-k hold any NaN or +inf it made
    return [(torch.tensor(p + new[b, : ran[b]].tolist(), device="cpu"), len(p), topv[b, : ran[b]], topi[b, : ran[b]])
            for b, p in enumerate(prompts)]


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



def cached(path: str | None, compute):
    """What ``torch.load(path)`` gives if that file exists; else ``compute()``, saved there when a
    path is given (the trainers' target states, which take minutes to compute)."""
    if path and os.path.exists(path):
        return torch.load(path)
    result = compute()
    if path:
        torch.save(result, path)
    return result


def split_held_out(data, prompts: list[list[int]], every: int) -> tuple[list, list]:
    """``(training rows, held-out rows)``: every row of every ``every``-th prompt is held out. A
    random split of rows would measure memory, not prediction: the same prompt's greedy
    continuation repeats in the data. Prompts of the data that ``prompts`` does not list follow
    it in the order the data first shows them."""
    if every < 1:
        raise ValueError(f"held_out_every must be a whole number of at least 1 (one prompt in that many), "
                         f"got {every!r}")
    listed = [tuple(p) for p in prompts]
    known = set(listed)
    for r in data:  # the prompts of a corpus (logitlab.training.corpus) are in the data alone
        key = tuple(r[0][: r[1]].tolist())
        if key not in known:
            known.add(key)
            listed.append(key)
    held_prompts = set(listed[::every])
    held = [r for r in data if tuple(r[0][: r[1]].tolist()) in held_prompts]
    train = [r for r in data if tuple(r[0][: r[1]].tolist()) not in held_prompts]
    if not train or not held:  # a trainer would fail later, deep inside its first measurement
        raise ValueError(f"data: holding out one prompt in {every} leaves {len(train)} rows to train on and "
                         f"{len(held)} to measure; both need some (more prompts, or another held-out-every)")
    return train, held


def choose_vocabulary(data, vocab_size: int, size: int) -> torch.Tensor:
    """The ``size`` tokens to which the target gives the most probability mass over the
    training data (its top-k distribution at every recorded position), as sorted ids. Rows
    without logits (``logitlab.training.corpus.token_rows``, ``greedy_rows``) count their new tokens
    instead: the target's own greedy and sampled choices, an estimate of the same mass."""
    mass = torch.zeros(vocab_size, dtype=torch.float64, device="cpu")  # rows live on the CPU
    for tokens, start, topv, topi in data:
        if topv is None:
            mass.index_add_(0, tokens[start:].long(), torch.ones(len(tokens) - start, dtype=torch.float64))
        else:
            mass.index_add_(0, topi.long().flatten(), torch.softmax(topv.float(), dim=-1).double().flatten())
    return mass.topk(size).indices.sort().values



def length_batches(lengths: list[int], batch: int) -> list[list[int]]:
    """The indices ``0 .. len(lengths) - 1`` in batches of ``batch``, sorted by length, so that
    rows padded to their batch's longest waste little (a corpus's rows run from tens to over a
    thousand tokens); the caller puts what it computes back in the rows' order."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    return [order[b: b + batch] for b in range(0, len(order), batch)]


def padded(rows, device):
    """Right-padded ids ``[B, L]`` of token tensors ``rows`` and their mask (right padding is
    harmless to a causal model: no real position attends to it)."""
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    mask = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    for b, r in enumerate(rows):
        ids[b, : len(r)], mask[b, : len(r)] = r.to(device), 1
    return ids, mask


def new_token_states(body, rows) -> list[torch.Tensor]:
    """Run ``body`` (a model without its output layer, ``model.model``) over the rows and return,
    per row, its last hidden states at the positions that predict the row's new tokens
    (``new_from - 1 .. L - 2``, the ones whose top-k logits the row holds)."""
    ids, mask = padded([r[0] for r in rows], body.embed_tokens.weight.device)
    hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state
    return [hidden[b, s - 1: len(t) - 1] for b, (t, s, _, _) in enumerate(rows)]


def recording_copy(model, dtype: str, device=None):
    """The target that records a trainer's features: ``model`` itself for ``"float32"``, else a
    second copy in ``dtype`` (``"bfloat16"``: several times faster on a CPU with AVX512-BF16),
    so that the float32 model the drafter trains against is not rounded."""
    import logitlab as ll

    return model if dtype == "float32" else ll.load("smollm2-135m", device=device, dtype=getattr(torch, dtype),
                                                    fast=False)[0]


def data_summary(data, held) -> dict:
    """The size of a training's data, for its log: rows and answer tokens, trained on and held out."""
    return {"rows": len(data), "held_out_rows": len(held), "new_tokens": sum(len(r[0]) - r[1] for r in data),
            "held_out_new_tokens": sum(len(r[0]) - r[1] for r in held)}


def return_freed_memory(threshold: int = 65536) -> bool:
    """Fix glibc's ``M_MMAP_THRESHOLD`` at ``threshold`` bytes: a block that large for which the
    heap has no room is then always mapped on its own, and given back to the system when freed.
    True where that was set, False where the C library is not glibc (macOS, Windows), which
    leaves everything as it was.

    Why: by default glibc raises the threshold (up to 32 MB) each time such a mapped block is
    freed, after which blocks of that size grow the heap instead; and a trainer allocates
    tensors of a new size at every step (rows batched by length), so the heap fragments and
    never shrinks. EAGLE's trainer on 1,500 corpus rows grew from 1.4 to 11.8 GB in 80 steps on
    the book's CPU, and ran out of 24 GB on 12,000 rows. (The same as starting Python with
    ``MALLOC_MMAP_THRESHOLD_=65536``.)"""
    if not isinstance(threshold, int) or threshold <= 0:
        raise ValueError(f"threshold must be a positive number of bytes, got {threshold!r}")
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.gnu_get_libc_version  # only glibc has it (and its mallopt takes these numbers)
    except (OSError, AttributeError):
        return False
    m_mmap_threshold = -3  # from glibc's malloc.h
    return libc.mallopt(m_mmap_threshold, threshold) == 1


def write_log(out: str | Path, log: dict) -> None:
    """A training's log as JSON beside its weights (``drafter.safetensors`` -> ``drafter.json``):
    the recipe, the data, the times and the curves a chapter shows. Paths are written as text."""
    Path(out).with_suffix(".json").write_text(json.dumps(log, indent=1, default=str))


def machine(model) -> str:
    """Where a training ran, for its log: the GPU's name, or the CPU's and its threads."""
    device = model_device(model)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_info().get('model name', 'unknown CPU')}, {torch.get_num_threads()} threads"


def steps_within(seconds: float | None, steps: int, done: int, elapsed: float,
                 warm: tuple[int, float] = (0, 0.0)) -> int:
    """How many training steps fit in ``seconds`` at the speed of the ``done`` steps so far
    (``elapsed`` seconds), at most ``steps``: a time budget on a machine of unknown speed. The
    speed leaves out the ``warm`` (steps, seconds) at the start: a GPU's first steps load and
    tune its kernels, and counting them once cut a 190 s budget to 78 s of training."""
    if seconds is None:
        return steps
    warm_steps, warm_seconds = warm
    rate = (done - warm_steps) / (elapsed - warm_seconds)
    return max(done, min(steps, warm_steps + int((seconds - warm_seconds) * rate)))
