"""Where tensors live: the model's device, generators on it, float64 where it exists, a fair clock.

Readers run the book on a CPU, on a GPU (Colab) and on Apple's MPS (Macs). Everything the
library creates follows the model's device, so that the same code runs on all three:

* ``model_device(model)``: where the model's parameters are;
* ``generator(model, seed)``: a seeded ``torch.Generator`` there (``ll.generator``);
* ``exact_dtype(device)``: float64 for sums that must not lose rare tokens' mass, float32 on
  MPS, which has no float64;
* ``now(device)``: the time, once the device has finished its queued work;
* ``device()``: the best device this machine has (``ll.device``), ``available_devices()`` all of
  them, and ``pick_device``, which ``ll.load`` uses to refuse one that is not there.
"""

from __future__ import annotations

import numbers
import time

import torch


def model_device(model) -> torch.device:
    """The device of ``model``'s parameters (where its inputs and generators must live)."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    for tensor in [*model.parameters(), *model.buffers()]:  # a wrapper may hold its weights as buffers
        return tensor.device
    raise ValueError(f"model: {type(model).__name__} has no parameters or buffers to tell its device")


def generator(model_or_device, seed: int) -> torch.Generator:
    """A ``torch.Generator`` seeded with ``seed`` on the device of a model (or a device).

    Every sampling function of the library takes one; it must live where the logits are, so
    the same code runs on a CPU, a GPU or a Mac. ``ll.generator(model, 0)`` is the way to make one.
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    if isinstance(model_or_device, (torch.device, str)):
        device = torch.device(model_or_device)
    elif isinstance(model_or_device, torch.nn.Module):
        device = model_device(model_or_device)
    else:
        raise ValueError(f"model_or_device must be a model or a torch.device, got {type(model_or_device).__name__}")
    return torch.Generator(device=device).manual_seed(int(seed))


def exact_dtype(device: torch.device) -> torch.dtype:
    """float64 for sums that must not lose rare tokens' mass; float32 on MPS, which has no float64."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def now(device: torch.device | None = None) -> float:
    """``time.perf_counter()`` once the device (by default: every accelerator there is) has
    finished its queued work. CUDA and MPS run asynchronously: without waiting, a timer
    measures how fast kernels are launched, not how long they take."""
    kind = None if device is None else torch.device(device).type
    if kind in (None, "cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(device)
    if kind in (None, "mps") and torch.backends.mps.is_available():
        torch.mps.synchronize()
    return time.perf_counter()


def device() -> torch.device:
    """The best available device: CUDA, then Apple's MPS, then the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def available_devices() -> list[str]:
    """The devices this machine can run the model on: 'cpu', then 'cuda:0', 'cuda:1', ... and 'mps'."""
    names = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0)]
    mps = getattr(torch.backends, "mps", None)
    return names + (["mps"] if mps is not None and mps.is_available() else [])


def pick_device(dev) -> torch.device:
    if dev is None:
        return device()
    try:
        chosen = torch.device(dev)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be None, a torch.device or a string like 'cpu' or 'cuda', got {dev!r}") from None
    here = available_devices()
    name = f"{chosen.type}:{chosen.index or 0}" if chosen.type == "cuda" else chosen.type
    if name not in here:
        raise ValueError(f"device {dev!r} is not available on this machine; available: {here}")
    return chosen
