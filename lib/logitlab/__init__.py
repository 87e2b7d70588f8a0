"""logitlab: the library of the book on how a language model chooses its next token.

    import logitlab as ll
    model, tokenizer = ll.load("smollm2-135m")
    probs = ll.softmax(logits, temperature=0.7)
    token = ll.sample(logits, temperature=0.7, generator=ll.generator(model, seed=0))

The folders follow the book's parts: ``sampling`` (chapters 1-3: one token from logits, the
truncation rules, the penalties), ``decoding`` (the loop every method shares), ``search`` (beam
search, best-of-N, token trees: chapters 4-5), ``speculative`` (drafting and verification:
chapters 6-10), ``constrained`` (chapter 11), ``watermark`` (chapter 12) and ``measure`` (timing
and the shipped results, chapter 13). ``course`` (the exercises' checks, the grader), ``figures`` (plots, widgets),
``training`` and ``bench`` are the tooling around them, loaded only when used.
"""

import importlib

# The book's parts (each module says which chapter explains it), and the names the chapters read.
from . import constrained, decoding, devices, fast_cpu, fast_gpu, sampling, search, speculative
from .constrained import Constraint
from .decoding.generate import generate
from .decoding.result import GenerationResult
from .decoding.tree_shape import tree_attention_mask, tree_position_ids
from .devices import device, generator
from .measure import conditioning, exactness, metrics, results, timing
from .models import chat_ids, load, next_token_logits
from .probs import apply_temperature, entropy, kl, log_softmax, softmax, tv_distance
from .sampling.draw import greedy, gumbel_max, sample
from .sampling.pipeline import SamplingConfig, next_token
from .search.beam import BeamSearchResult, beam_search
from .search.best_of_n import BestOfN, best_of_n
from .search.trees import TokenTree, gumbel_top_k, sample_tree, score_paths, score_tree
from .speculative import SpeculativeResult, speculative_generate
from .speculative.typical import TypicalAcceptance, typical_accept
from .toy import toy_bigram, toy_model

__version__ = "0.1.0"

# What the chapters reach through the face but a program using the library does not need: the
# exercises' checks, the figures (matplotlib), the drafters' training and the watermarks. Each loads on first use
# (``ll.checks.check_softmax``), so ``import logitlab`` stays light.
LAZY = {"checks": ".course.checks", "viz": ".figures.viz", "widgets": ".figures.widgets", "training": ".training",
        "watermark": ".watermark"}


def __getattr__(name):
    if name in LAZY:
        module = importlib.import_module(LAZY[name], __name__)
        globals()[name] = module  # later lookups skip this function
        return module
    raise AttributeError(f"module 'logitlab' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(LAZY))


__all__ = [
    "conditioning",
    "constrained",
    "Constraint",
    "results",
    "timing",
    "exactness",
    "decoding",
    "devices",
    "fast_cpu",
    "fast_gpu",
    "generator",
    "metrics",
    "speculative",
    "speculative_generate",
    "SpeculativeResult",
    "TypicalAcceptance",
    "typical_accept",
    "sampling",
    "search",
    "apply_temperature",
    "beam_search",
    "best_of_n",
    "BeamSearchResult",
    "BestOfN",
    "device",
    "entropy",
    "GenerationResult",
    "SamplingConfig",
    "generate",
    "greedy",
    "gumbel_max",
    "kl",
    "load",
    "next_token_logits",
    "chat_ids",
    "log_softmax",
    "next_token",
    "sample",
    "softmax",
    "toy_bigram",
    "toy_model",
    "tv_distance",
    "TokenTree",
    "gumbel_top_k",
    "sample_tree",
    "score_paths",
    "score_tree",
    "tree_attention_mask",
    "tree_position_ids",
]
