"""Rows for chapter 12 and the closing chapter: what each watermark costs a decode, in time and in
distribution, and what it does to speculative sampling.

Every row makes answers at T = 1 on the held-out prompts, timed in turn with plain ``ll.generate``
at T = 1; each says how many answers its detector found at p < 0.001. The green list's row also
gives its exact price per step, ``KL(p_delta || p)`` at every position of plain sampling's answers
(``green_list.price``); the other two marks are exact samples of the model for a random key.
"""

from __future__ import annotations

import statistics

import torch

from ..decoding.generate import generate
from ..measure.table import Table
from ..speculative.draft_model import DraftModelDrafter, load_pretrained
from ..speculative.loop import speculative_generate
from ..watermark import green_list, gumbel, synthid
from ..watermark.green_list import GreenList
from ..watermark.gumbel import GumbelWatermark
from ..watermark.speculation import KeyedDraftModel, KeyedRejectionSampling
from ..watermark.synthid import TournamentWatermark
from .drafting import timed_runs
from .prompts import DRAFT_PROMPTS, chat

FOUND = 1e-3  # the p-value below which an answer counts as found


@torch.inference_mode()
def bench_watermarks(table: Table, model, tokenizer, new_tokens: int = 128, gamma: int = 3, repeat: int = 3) -> None:
    """Plain sampling, the three watermarks as processors of ``ll.generate``, and speculative
    sampling with the shipped draft model (``gamma`` drafts per call), unmarked and keyed, in
    turn on the held-out prompts, ``new_tokens`` tokens per answer (no EOS)."""
    vocab = model.config.vocab_size
    prompts = [chat(tokenizer, q) for q in DRAFT_PROMPTS]
    draft = load_pretrained(model)
    common = dict(max_new_tokens=new_tokens, temperature=1.0, eos_token_id=[])
    marks = {"green list, delta 2": GreenList(vocab, gamma=0.25, delta=2.0),
             "Gumbel-max": GumbelWatermark(vocab), "tournament, 30 rounds": TournamentWatermark(vocab, layers=30)}
    runs = {"ll.generate": lambda ids, g: generate(model, ids, generator=g, **common)}
    for label, mark in marks.items():
        runs[label] = lambda ids, g, mark=mark: generate(model, ids, generator=g, logits_processor=[mark], **common)
    runs[f"draft model, gamma={gamma}"] = lambda ids, g: speculative_generate(
        model, DraftModelDrafter(draft), ids, gamma=gamma, generator=g, **common)
    runs[f"keyed speculative sampling, gamma={gamma}"] = lambda ids, g: speculative_generate(
        model, KeyedDraftModel(draft), ids, gamma=gamma, acceptance=KeyedRejectionSampling(vocab), generator=g,
        **common)
    times, results = timed_runs(model, runs, prompts, repeat)
    detectors = {"green list, delta 2": lambda tokens, prompt: green_list.detect(tokens, vocab),
                 "Gumbel-max": lambda tokens, prompt: gumbel.detect(tokens, vocab, prompt=prompt),
                 "tournament, 30 rounds": lambda tokens, prompt: synthid.detect(tokens, vocab, prompt=prompt),
                 f"keyed speculative sampling, gamma={gamma}":
                     lambda tokens, prompt: gumbel.detect(tokens, vocab, prompt=prompt, streams=2)}
    price = statistics.mean(green_price(model, r.sequences[0], new_tokens) for r in results["ll.generate"])
    name = f"{len(prompts)} prompts, {new_tokens} tokens each, T=1"
    table.add(f"watermarks: ll.generate, {name}", times[0])
    for label, seconds in list(zip(runs, times))[1:]:
        notes = [f"KL {price:.3f} nats per step"] if label.startswith("green list") else []
        if label.startswith(("draft model", "keyed")):
            calls = sum(r.model_calls for r in results[label])
            notes.append(f"{new_tokens * len(prompts) / calls:.2f} tokens per call")
        if label in detectors:
            found = sum(detectors[label](r.new_tokens[0], ids[0]).p_value < FOUND
                        for r, ids in zip(results[label], prompts))
            notes.append(f"found {found} of {len(prompts)} at p < {FOUND:g}")
        table.add(f"watermarks: {label} ({', '.join(notes)}), {name}", seconds, times[0] / seconds,
                  "faster than ll.generate")


def green_price(model, sequence: torch.Tensor, new_tokens: int) -> float:
    """The green list's mean ``KL(p_delta || p)`` (delta 2, gamma 0.25, the default key) over the
    last ``new_tokens`` positions of ``sequence`` (1-d: prompt and answer), each step's green list
    seeded by the token before it."""
    text = sequence.tolist()
    logits = model(sequence[None]).logits[0, -new_tokens - 1:-1].float()
    vocab = logits.shape[-1]
    green = torch.stack([green_list.green_mask(prev, vocab) for prev in text[-new_tokens - 1:-1]]).to(logits.device)
    return float(green_list.price(logits, green, 2.0).mean())
