"""Every entry point follows the model's device, and runs where there is no float64 (Apple MPS).

There is no GPU here, so the two ways code breaks on another device are caught on the CPU:

* **float64.** MPS has none. The library picks its exact dtype with ``devices.exact_dtype``; the
  tests tell every module that it is on MPS (``exact_dtype`` gives float32) and fail any
  operation that *introduces* a float64 tensor (a float64 result from inputs that have none,
  including factories such as ``torch.rand(..., dtype=torch.float64)``).
* **the device.** A tensor or a generator made without a device lands on the CPU, which is wrong
  when the model is on a GPU. The tests run every entry point with PyTorch's default device set
  to ``meta`` (tensors with no data): anything the library creates without naming a device is
  then a meta tensor: the first time it meets the model's real tensors the call fails, and a
  result that holds one fails the test. A ``torch.Generator()`` without a device is caught by
  reading the source (the last test of this group). What code builds on the CPU on purpose
  (``device="cpu"``: masks, seeds) is not caught here, since the tests' model is on the CPU.
"""

import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import logitlab as ll
from logitlab.speculative.draft_model import DraftModelDrafter
from logitlab.speculative.medusa import MedusaDrafter
from logitlab.speculative.prompt_lookup import PromptLookupDrafter
from logitlab.speculative.pass_embeddings import LookaheadEmbeddings, pass_generate
from logitlab.speculative.medusa_heads import MedusaHeads, medusa_generate


def tiny_llama(layers=2, seed=0, vocab=6):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


def entry_points():
    """Every public decoding entry point, at T = 0 and T > 0, on tiny models (name, call)."""
    target, small = tiny_llama(2, 0), tiny_llama(1, 1)
    heads = MedusaHeads(target.lm_head.weight.detach(), 2)
    lookahead = LookaheadEmbeddings(target, 2)
    prompts = [[1, 2, 3], [4, 5]]

    def spec(drafter, **kw):
        return lambda: ll.speculative_generate(target, drafter, prompts, gamma=2, max_new_tokens=5, eos_token_id=[],
                                               generator=ll.generator(target, 0), **kw)

    calls = {
        "generate": lambda: ll.generate(target, prompts, max_new_tokens=4, top_k=3, top_p=0.9, repetition_penalty=1.2,
                                        presence_penalty=0.5, num_return_sequences=2,
                                        generator=ll.generator(target, 0)),
        "generate greedy": lambda: ll.generate(target, prompts, max_new_tokens=4, temperature=0),
        "beam_search": lambda: ll.beam_search(target, prompts, num_beams=3, max_new_tokens=4),
        "best_of_n": lambda: ll.best_of_n(target, prompts, n=3, max_new_tokens=4, generator=ll.generator(target, 0)),
        "sample_tree": lambda: ll.sample_tree(target, [1, 2], branching=(2, 2), generator=ll.generator(target, 0)),
        "score_tree": lambda: ll.score_tree(target, [1, 2], [-1, -1, 0], [1, 2, 3]),
        "draft model, T=1": spec(DraftModelDrafter(small), top_p=0.9),
        "draft model, T=0": spec(DraftModelDrafter(small), temperature=0),
        "prompt lookup": spec(PromptLookupDrafter(6)),
        "medusa chain, sampled": spec(MedusaDrafter(heads, "sample")),
        "medusa chain, typical": spec(MedusaDrafter(heads), acceptance=ll.TypicalAcceptance(next_token="sample")),
        "look-ahead, two calls": spec(lookahead),
        "medusa tree, typical": lambda: medusa_generate(target, heads, [[1, 2]], branching=(2, 1), max_new_tokens=5,
                                                        temperature=1.0, acceptance=ll.TypicalAcceptance(),
                                                        generator=ll.generator(target, 0)),
        "medusa tree, greedy": lambda: medusa_generate(target, heads, [[1, 2]], branching=(2, 1), max_new_tokens=5),
        "pass_generate, all": lambda: pass_generate(target, lookahead, [[1, 2]], max_new_tokens=6, temperature=1.0,
                                                    generator=ll.generator(target, 0)),
        "pass_generate, likely": lambda: pass_generate(target, lookahead, [[1, 2]], max_new_tokens=6, temperature=1.0,
                                                       prefixes="likely", generator=ll.generator(target, 0)),
    }
    return list(calls.items()) + training_entry_points(target, heads, lookahead)


def training_entry_points(target, heads, lookahead):
    """One small step of every trainer (draft model, Medusa heads, look-ahead embeddings) and of
    the data they are trained on."""
    from logitlab.speculative.draft_model import build_draft
    from logitlab.training import data, draft, medusa
    from logitlab.training.lookahead import train_lookahead

    small = build_draft(target)  # made before the test sets the default device, as in a script

    def rows():
        return data.generate_with_logits(target, [[1, 2, 3], [4, 5]], [0.0, 1.0], 4, 3, ll.generator(target, 0))

    def train_heads():
        r = rows()
        tensors = medusa.training_tensors(r, medusa.hidden_states(target, r), torch.arange(6, device="cpu"), 6, 2)
        medusa.train(heads, tensors, steps=1, lr=1e-3, batch=4)

    return [
        ("training data", rows),
        ("train the draft model", lambda: draft.train(small, rows(), steps=1, lr=1e-3, batch=2)),
        ("train Medusa heads", train_heads),
        ("train look-ahead embeddings", lambda: train_lookahead(target, 2, rows(), steps=1, batch=2, groups=2,
                                                                progress=False, lookahead=lookahead)),
    ]


ENTRY_POINTS = entry_points()


class NoNewFloat64(TorchDispatchMode):
    """Fails any operation whose result is float64 while none of its inputs is."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if any(t.dtype == torch.float64 for t in outputs) and not any(t.dtype == torch.float64 for t in inputs):
            raise AssertionError(f"{func} introduced a float64 tensor, which MPS does not have")
        return out


def pretend_mps(monkeypatch):
    """Every module of the library that chooses a dtype by device now believes it is on MPS."""
    for name, module in list(sys.modules.items()):
        if name.startswith("logitlab") and hasattr(module, "exact_dtype"):
            monkeypatch.setattr(module, "exact_dtype", lambda device: torch.float32)


@pytest.mark.parametrize("name, call", ENTRY_POINTS, ids=[n for n, _ in ENTRY_POINTS])
def test_no_float64_is_introduced_where_the_device_has_none(monkeypatch, name, call):
    pretend_mps(monkeypatch)
    with NoNewFloat64():
        call()


def test_the_float64_guard_fails_code_that_introduces_float64():
    with pytest.raises(AssertionError, match="float64"):
        with NoNewFloat64():
            torch.rand(3, dtype=torch.float64)
    with pytest.raises(AssertionError, match="float64"):
        with NoNewFloat64():
            torch.ones(3).double()


def meta_tensors(result) -> list[str]:
    """The fields of a result (a dataclass, a tensor or a tuple of them) that hold meta tensors."""
    if isinstance(result, torch.Tensor):
        return ["result"] if result.is_meta else []
    fields = vars(result) if hasattr(result, "__dict__") else dict(enumerate(result or ()))
    found = []
    for name, value in fields.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(v, torch.Tensor) and v.is_meta for v in values):
            found.append(str(name))
    return found


@pytest.mark.parametrize("name, call", ENTRY_POINTS, ids=[n for n, _ in ENTRY_POINTS])
def test_what_the_library_creates_follows_the_models_device(name, call):
    torch.set_default_device("meta")  # a tensor made without a device is now a meta tensor
    try:
        result = call()
    finally:
        torch.set_default_device(None)
    # A tensor made without a device and only stored, never computed with, fails here.
    assert not meta_tensors(result), f"{name}: {meta_tensors(result)} made without the model's device"


class FactoriesWithoutDevice(TorchFunctionMode):
    """Records every tensor factory called from the library's own code without ``device=``
    (such a tensor lands on the CPU whatever the model's device). ``*_like`` factories and
    conversions of a tensor follow their input and are not factories here."""

    FACTORIES = {torch.tensor, torch.zeros, torch.ones, torch.full, torch.empty, torch.arange, torch.rand,
                 torch.randn, torch.randint, torch.eye, torch.linspace, torch.as_tensor}
    def __init__(self, watched=(str(Path(ll.__file__).parent),)):
        super().__init__()
        self.watched, self.found = tuple(watched), []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        from_tensor = func is torch.as_tensor and args and isinstance(args[0], torch.Tensor)
        if func in self.FACTORIES and kwargs.get("device") is None and not from_tensor:
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(self.watched):
                self.found.append(f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno} {func.__name__}")
        return func(*args, **kwargs)


@pytest.mark.parametrize("name, call", ENTRY_POINTS, ids=[n for n, _ in ENTRY_POINTS])
def test_the_library_makes_no_tensor_without_a_device(name, call):
    with FactoriesWithoutDevice() as mode:
        call()
    assert not mode.found, f"{name}: tensors made without a device at {sorted(set(mode.found))}"


def test_the_device_check_fails_code_that_makes_a_tensor_without_a_device(monkeypatch):
    # The loop's log-probabilities replaced by a function that forgets the device; the mode
    # watches this file too, where that function lives.
    monkeypatch.setattr(sys.modules["logitlab.decoding.generate"], "token_logprobs",
                        lambda logits, tokens: torch.zeros(len(tokens)))
    with FactoriesWithoutDevice(watched=(str(Path(ll.__file__).parent), __file__)) as mode:
        dict(ENTRY_POINTS)["generate"]()
    assert mode.found and all(f.startswith("test_devices.py") and f.endswith("zeros") for f in mode.found)


def test_every_generator_in_the_library_and_the_chapters_names_its_device():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = list((root / "lib").rglob("*.py")) + list((root / "chapters").glob("*.ipynb"))
    bare = [f.name for f in files if re.search(r"torch\.Generator\(\s*\)", f.read_text())]
    assert not bare, f"torch.Generator() without a device in {bare}: use ll.generator(model, seed)"


# --- Exactness in float32 ------------------------------------------------------------------------
# On MPS every sum the library keeps in float64 elsewhere runs in float32. The exactness tests
# must still pass there: the same chi-square tests as in test_speculative and test_lookahead (each
# with its false-positive rate P_MIN = 1e-4), run with the library told it is on MPS and with no
# float64 allowed into the computation.


@pytest.mark.statistical
def test_sampling_stays_exact_in_float32(monkeypatch):
    from collections import Counter

    from scipy.stats import chisquare
    from test_speculative import P_MIN

    pretend_mps(monkeypatch)
    logits = torch.tensor([[2.0, 0.5, -1.0, 1.5, -9.0, 0.0]]).expand(60_000, -1)
    with NoNewFloat64():
        tokens = ll.sample(logits, temperature=0.7, generator=ll.generator("cpu", 0))
    probs = torch.softmax(logits[0].double() / 0.7, dim=-1)
    counts = Counter(tokens.tolist())
    assert chisquare([counts.get(i, 0) for i in range(6)], (probs * len(tokens)).tolist()).pvalue > P_MIN


@pytest.mark.statistical
@pytest.mark.parametrize("gamma", [1, 3])
def test_speculative_sampling_stays_exact_in_float32(monkeypatch, gamma):
    from test_speculative import P_MIN, chi_square_pvalue, exact_sequence_probs

    target = ll.toy_model(vocab_size=5, order=2, seed=0)
    drafter = DraftModelDrafter(ll.toy_model(vocab_size=5, order=3, seed=9))
    settings = dict(temperature=0.8, top_p=0.9)
    probs = exact_sequence_probs(target, [1, 2], 3, ll.SamplingConfig(**settings), eos=(4,))  # in float64
    pretend_mps(monkeypatch)
    with NoNewFloat64():
        out = ll.speculative_generate(target, drafter, [[1, 2]], gamma=gamma, max_new_tokens=3, eos_token_id=[4],
                                      num_return_sequences=30_000, generator=ll.generator(target, gamma), **settings)
    assert 0 < out.alpha < 1
    assert chi_square_pvalue(out.new_tokens, probs) > P_MIN


@pytest.mark.slow
def test_pass_stays_exact_in_float32(monkeypatch):
    from test_lookahead import pooled_pvalue, random_lookahead
    from test_speculative import P_MIN, exact_llama_probs
    from test_speculative import tiny_llama as sharp_llama

    target = sharp_llama(2, seed=0, vocab=4)
    lookahead = random_lookahead(target, 2, seed=1)
    probs = exact_llama_probs(target, [1, 2], 4, ll.SamplingConfig(temperature=1.0))  # in float64
    pretend_mps(monkeypatch)
    with NoNewFloat64():
        out = ll.speculative_generate(target, lookahead, [[1, 2]], gamma=3, max_new_tokens=4, temperature=1.0,
                                      eos_token_id=[], num_return_sequences=20_000, generator=ll.generator(target, 0))
    # The first draft is the target's own sample (accepted up to rounding); the look-ahead
    # drafts after it are tested, some accepted and some not.
    assert out.acceptance_by_position()[0] > 0.999
    assert 0.05 < out.acceptance_by_position()[1:].mean() < 0.95
    assert pooled_pvalue(out.new_tokens, probs) > P_MIN


def test_the_float32_exactness_test_detects_a_biased_sampler(monkeypatch):
    # The same chi-square test as above fails a sampler that is off by the temperature.
    from collections import Counter

    from scipy.stats import chisquare
    from test_speculative import P_MIN

    logits = torch.tensor([[2.0, 0.5, -1.0, 1.5, -9.0, 0.0]]).expand(60_000, -1)
    tokens = ll.sample(logits, temperature=0.8, generator=ll.generator("cpu", 0))
    probs = torch.softmax(logits[0].double() / 0.7, dim=-1)
    counts = Counter(tokens.tolist())
    assert chisquare([counts.get(i, 0) for i in range(6)], (probs * len(tokens)).tolist()).pvalue < P_MIN
