"""``python -m logitlab.bench``: the book's performance table, as ratios measured in one run.

The machines that build the book are shared and noisy, so absolute times drift from run to
run; ratios of times taken in the same run, on the same machine, are what the book reports.
Each time is the median of several repetitions after a warm-up. The table is printed as
Markdown and written as JSON (``--json``, default ``bench-out/bench.json``). Ratios still move
between runs (by a fifth or more on the book's shared 2-core CPU), so ``--runs N`` runs the whole
selection N times, one run after the other, and reports each row's median with the range of its
ratio over the runs: a method can be said to beat another only where their ranges do not overlap.

Rows (every Hugging Face row runs on the model as Hugging Face gives it, without the CPU fast
path of ``ll.load``):

* the cost of a forward pass (chapters 5 and 6): the memory-bound decode step (the weights'
  bytes over a read bandwidth measured in the same run), the decode step and the pass over
  n = 2..16 new tokens (v(n), in decode steps) with and without the fast path, and where a pass
  with it spends its time, part by part; the same for llama.cpp on the same weights in float32,
  where ``llama-cpp-python`` is installed (skipped with a message otherwise);
* loading SmolLM2-135M: first load (dequantise the GGUF file) against the cached load
  (chapter 1);
* drawing one token per row of ``[64, 49152]`` logits: ``ll.sample`` and ``ll.gumbel_max``
  against Hugging Face's temperature warper + softmax + ``torch.multinomial`` (chapter 1);
* truncation on ``[64, 49152]`` logits: top-k 50 then top-p 0.9, and top-p 0.9 alone, ours
  against Hugging Face's warpers, after checking that both keep the same tokens (chapter 2);
* parallel sampling: N samples of 32 tokens with ``num_return_sequences`` (N = 1, 4, 16, 64)
  against one sample; scoring a (4, 4, 2) token tree in one forward pass against path by path;
  ``ll.beam_search`` against Hugging Face's beam search (chapters 4 and 5);
* speculative decoding (chapter 6): prompt lookup at temperature 0 on input-grounded prompts
  (the answer copies the prompt) and on open-ended ones, against our autoregressive loop and
  against Hugging Face's prompt-lookup decoding, with the same tokens; the shipped draft model
  at temperature 0 and 1 against our autoregressive loop, with the number of drafts per call
  (gamma) the cost model chooses, its acceptance rate and cost ratio, and against Hugging Face's
  assisted generation with the same draft and gamma;
* Medusa heads and typical acceptance (chapter 7): the shipped heads at temperature 0 as a chain
  and as trees (same tokens as greedy decoding), and at 0.7, 1.0 and 1.3 as a chain under
  rejection sampling (top-token and sampled proposals) and under typical acceptance, and as a
  tree under typical acceptance, each with its tokens per target call, against our
  autoregressive loop;
* the EAGLE drafter (chapter 9): the shipped feature-level drafter as a chain and as EAGLE-2's
  dynamic tree at temperature 0 (same tokens as greedy decoding) and 1, under rejection sampling
  (exact) and at 1 also under typical acceptance, each with its tokens per target call and the
  acceptance rate of each draft position, against our autoregressive loop;
* PaSS (chapter 8): the shipped look-ahead embeddings with the paper's two-call algorithm for
  k = 1 .. 8 and with our single-call variant (slots after every prefix, or after the likeliest
  one) at temperature 0 (same tokens as greedy decoding) and 1, each with its tokens per target
  pass, against our autoregressive loop;
* every drafter on Spec-Bench (chapters 6 to 10; ``logitlab.spec_bench``, the field's benchmark,
  none of whose questions the drafters trained on): the first turn of two questions of each of its
  six tasks, 128 tokens each, at temperature 0 (same tokens as greedy decoding) and 1: prompt
  lookup, the suffix automaton and Token Recycling (no model; each starts empty on every prompt),
  the two combined, Token Recycling again from a table warmed on the book's 40 training prompts
  (8- and 24-node trees; each prompt starts from a copy), the draft model's chain, Medusa's tree, PaSS (two-call, k = 2), EAGLE's chain and tree,
  each with its tokens per target pass and the acceptance of each draft position, against our
  autoregressive loop, task by task;
* every speculative row gives the speedup the cost model predicts for it
  (``logitlab.bench.costmodel``): its target passes priced at the v(n) measured in the same
  run, plus the drafter's own time, both counted on other prompts than the timed ones; and
  (except prompt lookup's chapter 6 rows) the same model's price of the row's own timed passes
  and drafter time, which checks the model's costs apart from its guess of the acceptance;
* the decoding loop: ``ll.generate`` against Hugging Face ``generate``, 128 new tokens, greedy
  and sampled, as a tokens-per-second ratio (the two loops run alternately, so both see the
  same machine load); decoding with against without the KV cache
  (chapter 3);
* watermarks (chapter 12): the green list (delta 2), the Gumbel-max watermark and tournament
  sampling (30 rounds) as processors of ``ll.generate`` at temperature 1, and the shipped draft
  model's speculative sampling unmarked and keyed (every random choice the key's), against
  ``ll.generate`` on the drafters' held-out prompts, 128 tokens per answer; each marked row with
  how many answers its detector found, the green list's with its exact price per step
  (KL(p_delta || p)), the speculative rows with their tokens per target call;
* every decoder that drafts nothing, against ``ll.generate`` at the same temperature on the
  drafters' held-out prompts, 128 tokens per answer (the closing chapter): beam search (4 beams)
  at temperature 0; sampling with each truncation rule, best-of-4 and 4 samples in one batch at
  temperature 1, each truncation row with the probability it removes per step.
"""

from ..measure.table import Table, cpu_name
from .basics import bench_generate, bench_load, bench_parallel, bench_sampling
from .decoders import bench_decoders, removed_mass
from .drafting import bench_draft_model, bench_eagle, bench_pass, bench_speculative, bench_typical, pass_calls
from .prompts import DRAFT_PROMPTS, GROUNDED, OPEN_ENDED, cached_prefix, chat
from .run import main
from .spec_bench import bench_spec_bench
from .verification import bench_verification
from .watermarks import bench_watermarks

# The chapters take the bench's prompts and its removed-mass measure from here, as they are named.
__all__ = ["DRAFT_PROMPTS", "GROUNDED", "OPEN_ENDED", "Table", "bench_decoders", "bench_draft_model", "bench_eagle",
           "bench_generate", "bench_load", "bench_parallel", "bench_pass", "bench_sampling", "bench_spec_bench",
           "bench_speculative", "bench_typical", "bench_verification", "bench_watermarks", "cached_prefix", "chat", "cpu_name", "main",
           "pass_calls", "removed_mass"]
