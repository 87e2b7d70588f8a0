"""The CPU fast path (logitlab.fast_cpu): the same products to float rounding, the same greedy
tokens as the stock model over long generations, chosen by measurement, and easy to switch off."""

import json

import pytest
import torch
import torch.nn.functional as F

import logitlab as ll
from logitlab import fast_cpu
from logitlab.speculative.prompt_lookup import PromptLookupDrafter


@pytest.fixture(scope="module")
def fast():
    return ll.load("smollm2-135m", device="cpu")


@pytest.fixture(scope="module")
def stock():
    return ll.load("smollm2-135m", device="cpu", fast=False)[0]


def forward_mode(module):
    return "forward" in vars(module)


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 17])
@pytest.mark.parametrize("bias", [False, True])
def test_turned_is_f_linear_to_rounding(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(300, 64, generator=gen)
    b = torch.randn(300, generator=gen) if bias else None
    x = torch.randn(2, rows, 64, generator=gen)[:, ::1]  # a batch dimension, as a model passes it
    ours, plain = fast_cpu.turned(x, weight, b), F.linear(x, weight, b)
    assert ours.shape == plain.shape == (2, rows, 300)
    assert ours.is_contiguous()
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-4)
    # A transposed input (what an elementwise op on a transposed result gives) works as well.
    xt = torch.randn(64, rows, generator=gen).T
    torch.testing.assert_close(fast_cpu.turned(xt, weight), F.linear(xt, weight), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 2, 3, 17])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("parts", [1, 2, 3])
def test_transposed_is_f_linear_to_rounding(rows, bias, parts):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(300, 64, generator=gen)
    b = torch.randn(300, generator=gen) if bias else None
    x = torch.randn(2, rows, 64, generator=gen)
    blocks = fast_cpu.transposed_blocks(weight, parts)
    assert blocks.shape == (parts, 64, 300 // parts) and blocks.is_contiguous()
    ours, plain = fast_cpu.transposed(x, blocks, b), F.linear(x, weight, b)
    assert ours.shape == plain.shape == (2, rows, 300)
    assert ours.is_contiguous()
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [1, 2, 17])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_is_f_linear_to_rounding(rows, bias):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(300, 64, generator=gen)
    b = torch.randn(300, generator=gen) if bias else None
    x = torch.randn(2, rows, 64, generator=gen)
    try:
        weight_packed = fast_cpu.packed_weight(weight)
    except (RuntimeError, AttributeError):
        pytest.skip("this build of PyTorch cannot pack weights for oneDNN")
    ours, plain = fast_cpu.packed(x, weight_packed, b), F.linear(x, weight, b)
    assert ours.shape == plain.shape == (2, rows, 300)
    torch.testing.assert_close(ours, plain, rtol=1e-5, atol=1e-4)


def test_transposed_blocks_divide_the_outputs_evenly():
    weight = torch.randn(12, 5)
    assert fast_cpu.transposed_blocks(weight, 5).shape == (4, 5, 3)  # 5 parts do not divide 12: 4 do
    assert torch.equal(fast_cpu.transposed_blocks(weight, 4).transpose(0, 1).reshape(5, 12), weight.T)
    assert fast_cpu.transposed_blocks(torch.randn(7, 5), 4).shape == (1, 5, 7)


def test_each_layer_keeps_only_the_copies_its_kernels_read(monkeypatch):
    fastest = {(8, 8): {n: "transposed" if n == 1 else "packed" for n in fast_cpu.ROWS},
               (4, 8): {n: "linear" if n == 1 else "turned" for n in fast_cpu.ROWS}}
    table = {(shape, n): {k: (0.5 if k == kernel else 1.0) for k in fast_cpu.KERNELS}
             for shape, per_rows in fastest.items() for n, kernel in per_rows.items()}
    monkeypatch.setattr(fast_cpu, "_product_times", lambda linears, kernels, rounds: table)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    assert fast_cpu.enable(model) == fastest
    assert torch.equal(model[0].logitlab_transposed, fast_cpu.transposed_blocks(model[0].weight))
    assert hasattr(model[0], "logitlab_packed")
    assert not hasattr(model[1], "logitlab_transposed") and not hasattr(model[1], "logitlab_packed")
    monkeypatch.undo()
    x = torch.randn(1, 8)
    calls = []
    real = fast_cpu.transposed
    monkeypatch.setattr(fast_cpu, "transposed", lambda *args: calls.append(len(args[0])) or real(*args))
    with torch.no_grad():  # one row through the transposed copy, two through the packed one
        torch.testing.assert_close(model[0](x), F.linear(x, model[0].weight, model[0].bias), rtol=1e-5, atol=1e-5)
        assert calls == [1]  # the one-row product went through the transposed kernel, not F.linear
        torch.testing.assert_close(model[0](x.repeat(2, 1)), F.linear(x, model[0].weight, model[0].bias).repeat(2, 1),
                                   rtol=1e-5, atol=1e-5)
    fast_cpu.disable(model)
    assert not any(hasattr(m, "logitlab_transposed") or hasattr(m, "logitlab_packed") for m in model)


def test_a_choice_among_fewer_kernels_is_not_read(monkeypatch, tmp_path):
    # A file saved before a kernel was added does not hold that kernel's measurement: its name differs.
    linears = [torch.nn.Linear(8, 8)]
    now = fast_cpu.remembered_choice(tmp_path, linears)
    monkeypatch.setattr(fast_cpu, "KERNELS", fast_cpu.KERNELS[:-1])
    assert fast_cpu.remembered_choice(tmp_path, linears) != now


def test_load_calibrates_every_row_count(fast):
    model = fast[0]
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    shapes = {(m.out_features, m.in_features) for m in linears}
    assert set(model.logitlab_fast_cpu) == shapes == {(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)}
    for per_rows in model.logitlab_fast_cpu.values():
        assert set(per_rows) == set(fast_cpu.ROWS) and set(per_rows.values()) <= set(fast_cpu.KERNELS)
    assert all(forward_mode(m) for m in linears)
    # A layer keeps a packed or a transposed copy of its weight only where its kernels read it.
    for m in linears:
        assert hasattr(m, "logitlab_packed") == ("packed" in m.logitlab_kernels.values())
        assert hasattr(m, "logitlab_transposed") == ("transposed" in m.logitlab_kernels.values())


@torch.inference_mode()
def test_passes_on_a_cached_prefix_match_the_stock_model(fast, stock):
    model, tokenizer = fast
    context = tokenizer("The printing press changed how books were made, because", return_tensors="pt").input_ids
    for n in [1, 2, 3, 4, 5, 8, 9, 16, 24, 64]:
        new = torch.arange(200, 200 + n)[None]
        out = []
        for m in (model, stock):
            cache = m(context, use_cache=True).past_key_values
            out.append(m(new, past_key_values=cache, use_cache=True).logits)
        torch.testing.assert_close(out[0], out[1], rtol=0, atol=2e-3)
        assert torch.equal(out[0].argmax(-1), out[1].argmax(-1)), n


@pytest.mark.slow
@pytest.mark.parametrize("prompt", ["Write a short story about a lighthouse keeper.", "List ten uses for a brick:"])
def test_greedy_tokens_equal_the_stock_model_over_long_generations(fast, stock, prompt):
    model, tokenizer = fast
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    ours = ll.generate(model, ids, max_new_tokens=192, temperature=0, eos_token_id=[]).new_tokens[0]
    theirs = ll.generate(stock, ids, max_new_tokens=192, temperature=0, eos_token_id=[]).new_tokens[0]
    assert torch.equal(ours, theirs)


def test_verification_passes_give_the_stock_models_greedy_tokens(fast, stock):
    # Prompt lookup verifies several drafts per pass: the few-row kernels, not the one-row one.
    model, tokenizer = fast
    text = "The quick brown fox jumps over the lazy dog. " * 3 + "Repeat the sentence above once more:"
    ids = tokenizer(text, return_tensors="pt").input_ids
    drafted = ll.speculative_generate(model, PromptLookupDrafter(model.config.vocab_size), ids, gamma=8,
                                      max_new_tokens=96, temperature=0, eos_token_id=[])
    plain = ll.generate(stock, ids, max_new_tokens=96, temperature=0, eos_token_id=[])
    assert max(drafted.drafted) >= 4 and drafted.tokens_per_call > 2  # passes with several rows, mostly accepted
    assert torch.equal(drafted.new_tokens[0], plain.new_tokens[0])


def test_grad_mode_uses_the_stock_product(fast, stock):
    # Training backpropagates through the target: the fast kernels are inference-only.
    model = fast[0]
    ids = torch.tensor([[5, 6, 7]])
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
    ours = model(inputs_embeds=embeds).logits
    ours[0, -1, 0].backward()
    assert embeds.grad is not None and embeds.grad.abs().sum() > 0
    with torch.no_grad():
        assert torch.equal(stock(inputs_embeds=embeds).logits, ours.detach())


def test_switching_off():
    model = torch.nn.Sequential(torch.nn.Linear(64, 4096), torch.nn.Linear(4096, 64))
    x = torch.randn(1, 64)
    with torch.no_grad():
        before = model(x)
        choice = fast_cpu.enable(model)
        assert set(choice) == {(4096, 64), (64, 4096)} and all(set(c) == set(fast_cpu.ROWS) for c in choice.values())
        assert all(forward_mode(m) for m in model)
        fast_cpu.disable(model)
        assert not any(forward_mode(m) or hasattr(m, "logitlab_packed") for m in model)
        assert torch.equal(model(x), before)


def test_the_measured_fastest_kernel_is_chosen(monkeypatch):
    fastest = {(8, 8): {1: "turned", 2: "linear", 4: "packed", 8: "turned", 16: "packed", 32: "turned", 64: "packed"},
               (4, 8): {1: "linear", 2: "turned", 4: "turned", 8: "packed", 16: "packed", 32: "packed", 64: "linear"}}
    table = {(shape, n): {k: (0.5 if k == kernel else 1.0) for k in fast_cpu.KERNELS}
             for shape, per_rows in fastest.items() for n, kernel in per_rows.items()}
    monkeypatch.setattr(fast_cpu, "_product_times", lambda linears, kernels, rounds: table)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 4))
    assert fast_cpu.enable(model) == fastest
    assert model[0].logitlab_kernels is model.logitlab_fast_cpu[8, 8]
    assert model[1].logitlab_kernels is model.logitlab_fast_cpu[4, 8]
    # A pass over n rows uses the choice for the next calibrated count up; more than 64, F.linear.
    calls = []
    monkeypatch.setattr(fast_cpu, "_product", lambda kernel, layer, x: calls.append(kernel) or x)
    with torch.no_grad():
        for n in (1, 3, 5, 16, 17, 33, 64):
            model[0](torch.zeros(n, 8))
        model[0](torch.zeros(65, 8))
    assert calls == ["turned", "packed", "turned", "packed", "turned", "packed", "packed", "linear"]


def test_the_choice_is_remembered_per_machine_and_per_weights(monkeypatch, tmp_path):
    measured = []
    times = {k: 1.0 for k in fast_cpu.KERNELS}

    def product_times(linears, kernels, rounds):
        measured.append(len(linears))
        return {((m.out_features, m.in_features), n): dict(times) for m in linears for n in fast_cpu.ROWS}

    monkeypatch.setattr(fast_cpu, "_product_times", product_times)

    def model(out=8):
        return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, out))

    times["turned"] = 0.5  # the first measurement prefers "turned" everywhere
    first = fast_cpu.enable(model(), remember=tmp_path)
    (file,) = (tmp_path / "fast_cpu").iterdir()
    assert measured == [2] and set(first[8, 8].values()) == {"turned"}
    times["turned"], times["linear"] = 1.0, 0.5  # a second measurement would prefer "linear"
    again = model()
    assert fast_cpu.enable(again, remember=tmp_path) == first and measured == [2]  # read, not measured
    assert again[0].logitlab_kernels == {n: "turned" for n in fast_cpu.ROWS}
    # Other weights, another machine (here: thread count), or a damaged file: measured again.
    fast_cpu.enable(model(out=4), remember=tmp_path)
    assert len(measured) == 2 and len(list((tmp_path / "fast_cpu").iterdir())) == 2
    monkeypatch.setattr(fast_cpu, "machine", lambda: "another CPU | 1 threads | torch 2.13.0")
    fast_cpu.enable(model(), remember=tmp_path)
    assert len(measured) == 3 and len(list((tmp_path / "fast_cpu").iterdir())) == 3
    monkeypatch.undo()
    monkeypatch.setattr(fast_cpu, "_product_times", product_times)
    for damaged in ["{not json", '{"8x8": {"1": "linear"}}', '{"8x8": 3}', "[]"]:
        file.write_text(damaged)
        assert set(fast_cpu.enable(model(), remember=tmp_path)[8, 8].values()) == {"linear"}
        fast_cpu.enable(model(), remember=tmp_path)  # the file was rewritten whole: read, not measured
        assert len(measured) == 4
        measured.pop()
    assert not list(tmp_path.glob("fast_cpu/*.tmp"))  # no partial file left behind
    # A saved choice of oneDNN kernels where packing now fails: measured again, without them.
    file.write_text(json.dumps({"8x8": {str(n): "packed" for n in fast_cpu.ROWS}}))
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", lambda *args: (_ for _ in ()).throw(RuntimeError()))
    again = model()
    assert set(fast_cpu.enable(again, remember=tmp_path)[8, 8].values()) == {"linear"} and len(measured) == 4
    assert not hasattr(again[0], "logitlab_packed")
    measured.pop()
    monkeypatch.undo()
    monkeypatch.setattr(fast_cpu, "_product_times", product_times)
    # A folder that cannot be written: the choice is measured and used all the same.
    blocked = tmp_path / "a file"
    blocked.write_text("")
    assert set(fast_cpu.enable(model(), remember=blocked)[8, 8].values()) == {"linear"}


def test_the_machine_names_the_cpu_threads_and_torch():
    assert f"{torch.get_num_threads()} threads | torch {torch.__version__}" in fast_cpu.machine()


def test_a_forgotten_choice_is_measured_again(monkeypatch, tmp_path):
    measured, times = [], {k: 1.0 for k in fast_cpu.KERNELS}

    def product_times(linears, kernels, rounds):
        measured.append(len(linears))
        return {((m.out_features, m.in_features), n): dict(times) for m in linears for n in fast_cpu.ROWS}

    monkeypatch.setattr(fast_cpu, "_product_times", product_times)
    times["turned"] = 0.5
    fast_cpu.enable(torch.nn.Sequential(torch.nn.Linear(8, 8)), remember=tmp_path)
    (tmp_path / "fast_cpu" / "attention-0123456789abcdef.json").write_text("{}")
    (tmp_path / "fast_cpu" / "notes.txt").write_text("not a choice")
    times["turned"], times["linear"] = 1.0, 0.5  # the machine has changed: "linear" is now faster
    forgotten = fast_cpu.forget_choices(tmp_path)
    assert sorted(f.name.split("-")[0] for f in forgotten) == ["attention", "choice"]
    assert [f.name for f in (tmp_path / "fast_cpu").iterdir()] == ["notes.txt"]  # only the choices go
    again = torch.nn.Sequential(torch.nn.Linear(8, 8))
    assert set(fast_cpu.enable(again, remember=tmp_path)[8, 8].values()) == {"linear"} and measured == [1, 1]
    assert fast_cpu.forget_choices(tmp_path / "nothing here") == []


def test_load_remembers_its_choice_in_the_cache(fast, stock, monkeypatch):
    import json

    from logitlab.models import cache_dir

    # The load saved a choice for this machine; the stock copy, given the fast path from the same
    # folder, reads it instead of measuring. (Compared with the file, not with `fast`: a test
    # worker loading at the same moment may have measured and saved its own.)
    linears = [m for m in stock.modules() if isinstance(m, torch.nn.Linear)]
    saved = json.loads(fast_cpu.remembered_choice(cache_dir(), linears).read_text())
    monkeypatch.setattr(fast_cpu, "_product_times", lambda *args: pytest.fail("measured again"))
    try:
        choice = fast_cpu.enable(stock, remember=cache_dir())
    finally:
        fast_cpu.disable(stock)
    assert {f"{out}x{in_}": {str(n): k for n, k in per_rows.items()} for (out, in_), per_rows in choice.items()} == saved
    assert set(choice) == set(fast[0].logitlab_fast_cpu)


def test_without_onednn_packing_the_other_kernels_remain(monkeypatch):
    def refuse(*args):
        raise RuntimeError("no oneDNN here")

    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", refuse)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Linear(256, 64))
    choice = fast_cpu.enable(model)
    kernels = {kernel for per_rows in choice.values() for kernel in per_rows.values()}
    assert kernels <= {"linear", "turned", "transposed"}
    assert not any(hasattr(m, "logitlab_packed") for m in model)
    x = torch.randn(3, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), F.linear(F.linear(x, model[0].weight, model[0].bias), model[1].weight,
                                                      model[1].bias), rtol=1e-5, atol=1e-5)


def test_a_model_off_the_cpu_is_left_alone():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8, device="meta"))
    assert fast_cpu.enable(model) == {}
    assert not forward_mode(model[0])
    assert not fast_cpu.wanted("cuda") and not fast_cpu.wanted("mps") and fast_cpu.wanted("cpu")


def test_the_environment_and_the_argument_switch_it_off(monkeypatch):
    monkeypatch.setenv("LOGITLAB_FAST_CPU", "0")
    assert not fast_cpu.wanted("cpu")
    model = ll.load("smollm2-135m", device="cpu")[0]  # what ll.load does with it, not only wanted()
    assert not any(forward_mode(m) for m in model.modules() if isinstance(m, torch.nn.Linear))
    with pytest.raises(ValueError, match="fast must be True or False"):
        ll.load("smollm2-135m", device="cpu", fast="yes")


def test_a_stock_load_is_not_patched(stock):
    assert not any(forward_mode(m) for m in stock.modules() if isinstance(m, torch.nn.Linear))


@pytest.mark.parametrize("n, mask", [(1, None), (5, None), (4, "bool"), (4, "float"), (16, "float"), (3, "static")])
def test_gqa_attention_is_hugging_faces_sdpa_attention(n, mask):
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    gen = torch.Generator().manual_seed(n)
    # No mask: a prefill (causal) or one token (sees all). "static": no mask but a longer cache, as
    # in a prefill into an empty static cache, where only the first n keys are real.
    length = n if mask is None else 30 + n
    if mask == "static":
        mask = None
    query = torch.randn(2, 9, n, 64, generator=gen)
    key, value = torch.randn(2, 2, 3, length, 64, generator=gen)
    allowed = None
    if mask is not None:  # the new tokens see the cache and each other causally, minus a few cached ones
        allowed = torch.ones(n, length, dtype=torch.bool).tril(length - n)
        allowed[:, 3:7] = False
        allowed = allowed[None, None].expand(2, 1, n, length)
        if mask == "float":
            allowed = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    with torch.no_grad():
        ours, _ = fast_cpu.gqa_attention(module, query, key, value, allowed, scaling=0.125)
        theirs, _ = sdpa_attention_forward(module, query, key, value, allowed, scaling=0.125)
    assert ours.shape == theirs.shape == (2, n, 9, 64)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_the_fast_path_switches_attention_and_back(fast, stock):
    from transformers import AttentionInterface

    model = fast[0]
    assert model.config._attn_implementation == fast_cpu.ATTENTION
    assert AttentionInterface()[fast_cpu.ATTENTION] is fast_cpu.gqa_attention
    # With gradients on (training), Hugging Face's own function runs.
    calls = []
    import transformers.integrations.sdpa_attention as hf_sdpa

    original = hf_sdpa.sdpa_attention_forward
    try:
        hf_sdpa.sdpa_attention_forward = lambda *a, **k: calls.append(1) or original(*a, **k)
        q = torch.randn(1, 9, 2, 64, requires_grad=True)
        fast_cpu.gqa_attention(model.model.layers[0].self_attn, q, torch.randn(1, 3, 2, 64), torch.randn(1, 3, 2, 64),
                               None, scaling=0.125)[0].sum().backward()
    finally:
        hf_sdpa.sdpa_attention_forward = original
    assert calls == [1] and q.grad is not None
    # The stock model, borrowed and given back: one on another attention keeps it.
    try:
        stock.config._attn_implementation = "eager"
        fast_cpu.enable(stock, rounds=1)
        assert stock.config._attn_implementation == "eager"
        stock.config._attn_implementation = "sdpa"
        fast_cpu.enable(stock, rounds=1)
        assert stock.config._attn_implementation == fast_cpu.ATTENTION
        fast_cpu.disable(stock)
        assert stock.config._attn_implementation == "sdpa"
    finally:
        fast_cpu.disable(stock)
        stock.config._attn_implementation = "sdpa"


@pytest.mark.parametrize("shape", [(3, 9, 3, 17), (2, 4, 4, 5), (1, 8, 2, 300)])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "none"])
def test_grouped_attention_is_sdpa_to_rounding(shape, mask_kind):
    batch, heads, kv, length = shape
    gen = torch.Generator().manual_seed(length)
    q = torch.randn(batch, heads, 1, 64, generator=gen)
    k, v = (torch.randn(batch, kv, length, 64, generator=gen) for _ in range(2))
    seen = torch.rand(batch, 1, 1, length, generator=gen) > 0.3
    seen[..., -1] = True  # a decode step's row always sees its own token
    mask = {"bool": seen, "none": None,
            "additive": torch.zeros(seen.shape).masked_fill(~seen, torch.finfo(torch.float32).min)}[mask_kind]
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else seen, enable_gqa=kv != heads)
    ours = fast_cpu.grouped_attention(q, k, v, mask)
    assert ours.shape == (batch, 1, heads, 64) and ours.is_contiguous()
    torch.testing.assert_close(ours, sdpa.transpose(1, 2), rtol=1e-5, atol=1e-5)
    # Each query head reads its own group's key/value head: swapping two kv heads changes the result.
    if kv > 1:
        assert not torch.allclose(fast_cpu.grouped_attention(q, k.flip(1), v.flip(1), mask), ours)


def test_a_decode_step_uses_the_kernel_chosen_for_the_nearest_setting():
    layer = torch.nn.Module()
    assert fast_cpu.one_query_kernel(layer, 1, 100) == "sdpa"  # not calibrated
    layer.logitlab_one_query = {(r, c): f"{r}/{c}" for r in fast_cpu.ONE_QUERY_ROWS for c in fast_cpu.ONE_QUERY_CONTEXT}
    got = [fast_cpu.one_query_kernel(layer, rows, context) for rows, context in
           [(1, 100), (2, 100), (8, 300), (9, 400), (64, 5000), (500, 129)]]
    assert got == ["1/128", "8/128", "8/128", "64/1024", "64/1024", "64/128"]


def test_one_query_attention_is_chosen_by_measurement_and_remembered(monkeypatch, tmp_path, fast):
    model, tokenizer = fast
    measured = []

    def times(shape, dtype, rounds):  # "grouped" faster only with 8 rows or more
        measured.append((shape, dtype))
        return {(r, c): {"sdpa": 1.0, "grouped": 0.5 if r >= 8 else 2.0} for r, c in fast_cpu._one_query_settings()}

    monkeypatch.setattr(fast_cpu, "_one_query_times", times)
    monkeypatch.setattr(fast_cpu, "_ONE_QUERY_MEASURED", {})  # not what this process measured before
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    file = fast_cpu.remembered_choice(tmp_path, linears)
    first = fast_cpu.one_query_choice(model, torch.float32, 1, file)
    assert measured == [([9, 3, 64], torch.float32)]
    assert first == {(r, c): "grouped" if r >= 8 else "sdpa" for r, c in fast_cpu._one_query_settings()}
    assert fast_cpu.one_query_choice(model, torch.float32, 1, file) == first and len(measured) == 1  # read back
    assert fast_cpu.one_query_choice(model, torch.float32, 1, None) == first and len(measured) == 1  # this process's
    file.with_name(file.name.replace("choice-", "attention-")).write_text('{"shape": [9, 3, 64], "choice": 3}')
    monkeypatch.setattr(fast_cpu, "_ONE_QUERY_MEASURED", {})
    assert fast_cpu.one_query_choice(model, torch.float32, 1, file) == first and len(measured) == 2  # damaged
    layers = [m for m in model.modules() if hasattr(m, "logitlab_one_query")]
    assert len(layers) == 30  # ll.load's enable gave every attention layer its choice


def test_grouped_decode_steps_give_the_same_tokens(fast):
    model, tokenizer = fast
    prompts = [ll.chat_ids(tokenizer, "Name three rivers."), ll.chat_ids(tokenizer, "Why is the sky blue? Be brief.")]
    layers = [m for m in model.modules() if hasattr(m, "logitlab_one_query")]
    kept = [m.logitlab_one_query for m in layers]
    out = {}
    try:
        for kernel in fast_cpu.ONE_QUERY_KERNELS:  # padding in the batch: the mask matters
            for m in layers:
                m.logitlab_one_query = {key: kernel for key in kept[0]}
            out[kernel] = ll.generate(model, prompts, max_new_tokens=40, temperature=0, eos_token_id=[])
    finally:
        for m, choice in zip(layers, kept):
            m.logitlab_one_query = choice
    assert [t.tolist() for t in out["grouped"].new_tokens] == [t.tolist() for t in out["sdpa"].new_tokens]
