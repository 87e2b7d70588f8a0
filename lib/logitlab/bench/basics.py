"""Rows for chapters 1 to 5: loading, sampling, truncation, the decoding loop, batches, trees, beams."""

from __future__ import annotations

import tempfile

import torch

from .. import models
from ..decoding.generate import generate
from ..devices import generator as seeded_generator
from ..measure.table import Table
from ..measure.timing import forward_seconds, interleaved_median_times, median_time
from ..sampling.draw import gumbel_max, sample
from ..sampling.pipeline import SamplingConfig, next_token, process_logits
from ..search.beam import beam_search
from ..search.trees import sample_tree, score_paths, score_tree


def bench_load(table: Table) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        old = models.os.environ.get("LOGITLAB_CACHE")
        models.os.environ["LOGITLAB_CACHE"] = tmp
        try:
            first = models.load("smollm2-135m", device="cpu")[0].logitlab_load_seconds
            cached = models.load("smollm2-135m", device="cpu")[0].logitlab_load_seconds
        finally:
            if old is None:
                del models.os.environ["LOGITLAB_CACHE"]
            else:
                models.os.environ["LOGITLAB_CACHE"] = old
    table.add("load SmolLM2-135M, first time (dequantise GGUF, save cache)", first, first / cached, "the cached load")
    table.add("load SmolLM2-135M from the cache", cached)


@torch.inference_mode()
def bench_sampling(table: Table, model, tokenizer, batch: int = 64) -> None:
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    step = forward_seconds(model, ids[0].tolist(), 1)
    table.add("one decode step of SmolLM2-135M (batch 1)", step)

    # Realistic logits: 64 different next-token distributions from a real generation.
    text = generate(model, ids, max_new_tokens=batch, temperature=1.0, eos_token_id=[],
                    generator=seeded_generator(model, 0)).sequences[0][None]
    logits = model(text).logits[0, -batch:].float().contiguous()
    gen = seeded_generator(model, 0)
    shape = f"[{batch}, {logits.shape[-1]}]"

    def hf_sample(warpers):
        scores = logits.clone()
        for w in warpers:
            scores = w(ids, scores)
        return torch.multinomial(torch.softmax(scores, dim=-1), 1, generator=gen)

    hf_t = median_time(lambda: hf_sample([TemperatureLogitsWarper(0.7)]))
    table.add(f"Hugging Face warper+softmax+multinomial, T=0.7, {shape}", hf_t, hf_t / step, "a decode step")
    for name, fn in [("ll.sample", sample), ("ll.gumbel_max", gumbel_max)]:
        t = median_time(lambda: fn(logits, 0.7, gen))
        table.add(f"{name}, T=0.7, {shape}", t, hf_t / t, "faster than Hugging Face")

    # Truncation: check the kept sets agree before timing anything.
    for label, config, warpers in [
        ("top-k 50 then top-p 0.9", SamplingConfig(top_k=50, top_p=0.9), [TopKLogitsWarper(50), TopPLogitsWarper(0.9)]),
        ("top-p 0.9 alone", SamplingConfig(top_p=0.9), [TopPLogitsWarper(0.9)]),
    ]:
        ours = process_logits(logits, config)
        theirs = logits.clone()
        for w in warpers:
            theirs = w(ids, theirs)
        if not torch.equal(ours.isneginf(), theirs.isneginf()):
            raise AssertionError(f"{label}: our kept set differs from Hugging Face's")
        hf_t = median_time(lambda: hf_sample(warpers))
        t = median_time(lambda: next_token(logits, config, generator=gen))
        table.add(f"Hugging Face {label} + sample, {shape}", hf_t)
        table.add(f"ll {label} + sample, {shape} (same kept sets)", t, hf_t / t, "faster than Hugging Face")


@torch.inference_mode()
def bench_generate(table: Table, model, tokenizer, new_tokens: int = 128, repeat: int = 5, stock=None) -> None:
    """``ll.generate`` on ``model`` against Hugging Face ``generate`` on ``stock`` (the model as
    Hugging Face gives it; default ``model``), and decoding with against without the KV cache."""
    from transformers import GenerationConfig

    stock = model if stock is None else stock
    ids = tokenizer("Write a short story about a lighthouse keeper.", return_tensors="pt").input_ids
    settings = {"greedy": dict(temperature=0), "sampled T=0.7 top-p 0.9": dict(temperature=0.7, top_p=0.9)}
    for label, kwargs in settings.items():
        # Both loops do the same work: exactly new_tokens tokens, EOS forbidden until then.
        do_sample = kwargs["temperature"] > 0
        hf_config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=do_sample,
                                     temperature=kwargs["temperature"] or None, top_p=kwargs.get("top_p"),
                                     top_k=None, pad_token_id=model.generation_config.eos_token_id)
        results = {}

        def ours():
            results["ours"] = generate(model, ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kwargs,
                                       generator=seeded_generator(model, 0)).new_tokens[0]

        def theirs():
            torch.manual_seed(0)
            results["theirs"] = stock.generate(ids, generation_config=hf_config)[0, ids.shape[1]:]

        hf_t, t = interleaved_median_times([theirs, ours], repeat=repeat)
        if len(results["ours"]) != new_tokens or len(results["theirs"]) != new_tokens:
            raise AssertionError(f"{label}: a loop did not produce {new_tokens} tokens")
        if not do_sample and not torch.equal(results["ours"], results["theirs"]):
            raise AssertionError("greedy: ll.generate and Hugging Face chose different tokens")
        table.add(f"Hugging Face generate, {label}, {new_tokens} tokens", hf_t)
        table.add(f"ll.generate, {label}, {new_tokens} tokens", t, hf_t / t, "Hugging Face's tokens/s")

    # Without the cache every step runs the model on the whole sequence so far.
    short = 64

    def no_cache():
        seq = ids
        for _ in range(short):
            seq = torch.cat([seq, model(seq).logits[:, -1].argmax(-1, keepdim=True)], dim=1)

    def with_cache():
        generate(model, ids, max_new_tokens=short, temperature=0, eos_token_id=[])

    without, with_cache = interleaved_median_times([no_cache, with_cache], repeat=3)
    table.add(f"greedy, {short} tokens, no KV cache (whole sequence every step)", without)
    table.add(f"ll.generate greedy, {short} tokens, with the KV cache", with_cache, without / with_cache,
              "faster than without the cache")


@torch.inference_mode()
def bench_parallel(table: Table, model, tokenizer, stock=None) -> None:
    from transformers import GenerationConfig

    stock = model if stock is None else stock
    ids = tokenizer("Write one sentence about the sea:", return_tensors="pt").input_ids

    def samples(n):
        return lambda: generate(model, ids, max_new_tokens=32, num_return_sequences=n, eos_token_id=[],
                                generator=seeded_generator(model, n))

    sizes = [1, 4, 16, 64]
    times = interleaved_median_times([samples(n) for n in sizes], repeat=3)
    for n, t in zip(sizes, times):
        table.add(f"{n} samples of 32 tokens (num_return_sequences={n})", t, t / times[0], "the time of one sample")

    # A (4, 4, 2) tree after a prompt: 52 nodes, 32 paths of three tokens.
    story = tokenizer("Once upon a time, in a small village,", return_tensors="pt").input_ids
    tree = sample_tree(model, story, branching=(4, 4, 2), generator=seeded_generator(model, 2))
    one, paths = interleaved_median_times([lambda: score_tree(model, story, tree.parents, tree.tokens),
                                           lambda: score_paths(model, story, tree.parents, tree.tokens)])
    table.add("score a (4, 4, 2) tree path by path (32 forward passes)", paths)
    table.add("score a (4, 4, 2) tree in one forward pass (tree mask)", one, paths / one, "faster than path by path")

    # Beam search, 4 beams, 32 tokens, both implementations returning the same best sequence.
    config = GenerationConfig(num_beams=4, max_new_tokens=32, do_sample=False, eos_token_id=[], pad_token_id=2)
    results = {}

    def ours():
        results["ours"] = beam_search(model, ids, num_beams=4, max_new_tokens=32, eos_token_id=[]).best[0].tokens

    def theirs():
        results["theirs"] = stock.generate(ids, generation_config=config)[0, ids.shape[1]:]

    hf_t, t = interleaved_median_times([theirs, ours], repeat=3)
    if not torch.equal(results["ours"], results["theirs"]):
        raise AssertionError("beam search: ll.beam_search and Hugging Face returned different sequences")
    table.add("Hugging Face beam search, 4 beams, 32 tokens", hf_t)
    table.add("ll.beam_search, 4 beams, 32 tokens (same sequence)", t, hf_t / t, "faster than Hugging Face")
