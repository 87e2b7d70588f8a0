"""Argument checks shared by the library.

Every public function validates what it is given and raises a ``ValueError`` that names the
argument and says what is allowed. Nothing is silently clamped: a temperature of -1 or a
logits tensor full of NaN is a bug in the caller, and the earliest clear message is the kindest.

Each check takes the argument's ``name`` as the caller typed it (``scores`` in a Hugging Face
processor, ``logits`` in a function), so that the message points at the caller's own code.
Numbers may be any real number type, Python's or NumPy's (``np.float32(0.7)``, ``np.int64(50)``),
and are returned as plain Python numbers; a bool is not a number here (``top_k=True`` is a bug).

Validated once, at the public boundary. A check of a tensor's values reads a result back from the
device, which on a GPU waits for all the work queued before it. A loop therefore checks what the
model gives it once per step, in the same read as its own per-step question (``bad_logits``), and
runs the rules it calls inside ``trusted()``, where ``check_logits`` and ``check_probs`` check
types and shapes only. Called directly, every function checks everything.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers

import torch

from .devices import exact_dtype

_TRUSTED = contextvars.ContextVar("logitlab_trusted", default=False)


@contextlib.contextmanager
def trusted():
    """Inside: the values of logits and probabilities are not checked again (see the module's
    docstring); whoever enters it has checked them, or reads ``bad_logits`` before trusting a result."""
    token = _TRUSTED.set(True)
    try:
        yield
    finally:
        _TRUSTED.reset(token)


def checking_values() -> bool:
    """False inside ``trusted()``: whether a check may read values back from the device."""
    return not _TRUSTED.get()


def bad_logits(logits: torch.Tensor) -> torch.Tensor:
    """True (a 0-dim tensor, still on the device) where ``check_logits`` would refuse ``logits``:
    a NaN or +inf anywhere, or a row of all -inf. A loop reads it with its own per-step flags."""
    return (logits < float("inf")).all().logical_not() | (logits.amax(dim=-1) == float("-inf")).any()


def check_number(value, name: str, allowed: str, ok) -> float:
    """Return ``value`` as a float if it is a real number (not a bool, not NaN) for which
    ``ok(value)`` holds; otherwise raise, saying that ``name`` must be ``allowed``.

    >>> check_number(1, "top_p", "a number in (0, 1]", lambda v: 0 < v <= 1)
    1.0
    """
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float: beyond every range, as inf is
            number = math.inf if value > 0 else -math.inf
        if not math.isnan(number) and ok(number):
            return number
    raise ValueError(f"{name} must be {allowed}, got {value!r}")


def check_int(value, name: str, minimum: int, allowed: str | None = None, maximum: int | None = None) -> int:
    """Return ``value`` as an int if it is an integer (not a bool) in [``minimum``, ``maximum``].

    ``2.0`` is refused: where a count is expected, a float is usually a computation gone wrong.
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= minimum \
            and (maximum is None or value <= maximum):
        return int(value)
    default = f"an integer >= {minimum}" if maximum is None else f"an integer in [{minimum}, {maximum}]"
    raise ValueError(f"{name} must be {allowed or default}, got {value!r}")


def check_flag(value, name: str) -> bool:
    """``value`` if it is True or False (``1`` is refused: a switch is not a count)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def check_logits(logits, name: str = "logits") -> torch.Tensor:
    """Return ``logits`` if it is a floating tensor ``[..., vocab]`` with no NaN and no +inf.

    ``-inf`` is allowed (it is how a removed token is written) as long as every row keeps at
    least one finite entry, since a row of all ``-inf`` has no distribution.
    """
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape [batch, vocab], got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {logits.dtype}")
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last (vocabulary) dimension, got shape {tuple(logits.shape)}")
    if not checking_values():
        return logits
    # One pass over the tensor in the common case: NaN and +inf both fail `< inf`.
    if not bool((logits < float("inf")).all()):
        if torch.isnan(logits).any():
            raise ValueError(f"{name} contains NaN; every entry must be a number or -inf")
        raise ValueError(f"{name} contains +inf; entries must be finite or -inf")
    if logits.numel() > 0 and bool((logits.amax(dim=-1) == float("-inf")).any()):
        raise ValueError(f"{name} has a row where every entry is -inf; at least one token must stay possible")
    return logits


def check_temperature(temperature, name: str = "temperature") -> float:
    """A temperature is a finite number >= 0 (0 meaning greedy)."""
    return check_number(temperature, name, "a finite number >= 0 (0 means greedy)", lambda v: 0 <= v < math.inf)


def check_token_ids(tokens, name: str, logits: torch.Tensor, logits_name: str = "logits") -> torch.Tensor:
    """Earlier tokens for a penalty: a LongTensor ``[batch, seq]`` (``seq`` may be 0) with the
    leading dimensions of ``logits`` and on its device. Values are not checked: negative ids
    are padding, and ids >= vocab cannot come from this output layer, so neither is counted."""
    if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long:
        got = tokens.dtype if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise ValueError(f"{name} must be a LongTensor [batch, seq] of token ids, got {got}")
    if tokens.dim() != logits.dim() or tokens.shape[:-1] != logits.shape[:-1]:
        raise ValueError(
            f"{name} must be [batch, seq] with the batch of {logits_name} {tuple(logits.shape)}, "
            f"got shape {tuple(tokens.shape)}"
        )
    check_same_device(tokens, name, logits, logits_name)
    return tokens


def check_same_device(a: torch.Tensor, a_name: str, b: torch.Tensor, b_name: str) -> None:
    """Two tensors of one computation must be on one device (torch's own error comes from deep
    inside the kernel and names neither argument)."""
    if a.device != b.device:
        raise ValueError(f"{a_name} is on {a.device} but {b_name} is on {b.device}; move them to one device")


def check_probs(p, name: str) -> torch.Tensor:
    """A probability tensor: floating, no NaN, entries in [0, 1], rows summing to 1 (loosely)."""
    if not isinstance(p, torch.Tensor) or not p.is_floating_point():
        raise ValueError(f"{name} must be a floating-point torch.Tensor of probabilities")
    if p.dim() < 1 or p.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last (vocabulary) dimension, got shape {tuple(p.shape)}")
    if not checking_values():
        return p
    if torch.isnan(p).any() or (p < 0).any() or (p > 1 + 1e-6).any():
        raise ValueError(f"{name} must hold probabilities in [0, 1] (no NaN)")
    sums = p.sum(dim=-1, dtype=exact_dtype(p.device))  # float64 where the device has it
    if not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
        raise ValueError(f"{name} rows must sum to 1, got sums between {sums.min():.4f} and {sums.max():.4f}")
    return p


def check_generator(generator, device: torch.device) -> None:
    """A generator, when given, must be a torch.Generator on the same device type as the data."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    if generator.device.type != device.type:
        raise ValueError(
            f"generator is on {generator.device.type} but the logits are on {device.type}; "
            f"create it with torch.Generator(device={device.type!r})"
        )


def check_processors(processors, name: str = "logits_processor") -> list:
    """``None`` or a list of callables ``(tokens, logits) -> logits``, as a list."""
    if processors is None:
        return []
    if not isinstance(processors, (list, tuple)) or not all(callable(p) for p in processors):
        raise ValueError(f"{name} must be None or a list of processors, each called as (tokens, logits), "
                         f"got {processors!r}")
    return list(processors)


def check_parents(parents) -> list[int]:
    if isinstance(parents, torch.Tensor) and parents.dim() == 1 and not parents.is_floating_point():
        parents = parents.tolist()
    if not isinstance(parents, (list, tuple)) or not parents:
        raise ValueError("parents must be a non-empty list of parent indices (-1: a child of the root)")
    for i, p in enumerate(parents):
        if isinstance(p, bool) or not isinstance(p, int) or not -1 <= p < i:
            raise ValueError(f"parents[{i}] must be an integer in [-1, {i - 1}] (a parent comes before its "
                             f"children; -1 is the root), got {p!r}")
    return list(parents)


def check_branching(branching) -> tuple[int, ...]:
    if not isinstance(branching, (tuple, list)) or not branching or not all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in branching):
        raise ValueError(f"branching must be a non-empty tuple of integers >= 1 (children per node, "
                         f"level by level), got {branching!r}")
    return tuple(branching)


def vocab_size(model) -> int | None:
    """The model's vocabulary size, from its config (None if it has no config)."""
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(size) if size is not None else None


def check_model(model, name: str = "model"):
    """A causal language model: callable with input ids, with parameters (a model's name is not one)."""
    if not isinstance(model, torch.nn.Module):
        hint = " (load it first: model, tokenizer = ll.load(name))" if isinstance(model, str) else ""
        raise ValueError(f"{name} must be a causal language model (a torch.nn.Module), got "
                         f"{type(model).__name__}{hint}")
    return model


def check_body_and_head(model, name: str = "target"):
    """A Hugging Face causal LM split as ``.model`` (its body) and ``.lm_head`` (its output layer),
    which the loops that read hidden states need."""
    check_model(model, name)
    if not (hasattr(model, "model") and hasattr(model, "lm_head") and hasattr(model.model, "embed_tokens")):
        raise ValueError(f"{name} must be a Hugging Face causal LM with .model (its body), .model.embed_tokens "
                         "and .lm_head, such as the SmolLM2 model of ll.load(): this reads its hidden states")
    return model


def check_smollm2(model, name: str, what: str):
    """SmolLM2-135M (vocabulary 49152, hidden size 576, 30 layers): the model ``what`` (the
    book's shipped drafter weights) was trained for."""
    config = getattr(model, "config", None)
    shape = tuple(getattr(config, k, None) for k in ("vocab_size", "hidden_size", "num_hidden_layers"))
    if shape != (49152, 576, 30):
        raise ValueError(f"{name} must be SmolLM2-135M (vocab 49152, hidden size 576, 30 layers), the model "
                         f"{what} trained for; got (vocab, hidden, layers) = {shape}")
    return model


def check_counts(max_new_tokens, min_new_tokens=0, num_return_sequences=1) -> tuple[int, int, int]:
    """Validate the token counts of a loop; numpy integers are fine. Returns them as ints."""
    def integer(value):
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)

    if not integer(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    if not integer(min_new_tokens) or not 0 <= min_new_tokens <= max_new_tokens:
        raise ValueError(f"min_new_tokens must be an integer in [0, max_new_tokens={max_new_tokens}], "
                         f"got {min_new_tokens!r}")
    if not integer(num_return_sequences) or num_return_sequences < 1:
        raise ValueError(f"num_return_sequences must be an integer >= 1, got {num_return_sequences!r}")
    return int(max_new_tokens), int(min_new_tokens), int(num_return_sequences)
