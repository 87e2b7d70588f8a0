"""The static path (``logitlab.fast_gpu``, ``decoding.static_cache``), checked on the CPU.

On a GPU the static cache is what lets a pass be recorded as a CUDA graph; the cache itself runs
anywhere, so every loop is checked here against the stock cache: the same logits to float
rounding on the real model, the same tokens in every loop (generate, beam search, trees,
speculative sampling with every drafter, PaSS, constrained decoding), rows finishing early,
trees rolled back. The recording itself needs CUDA and is checked where a GPU is present.
"""

import contextlib

import pytest
import torch
from test_constrained_trees import constraint
from test_medusa import random_heads
from test_speculative import tiny_llama

import logitlab as ll
from logitlab import fast_gpu
from logitlab.decoding import forward
from logitlab.decoding.passes import masked_forward, prefill, tree_forward
from logitlab.decoding.static_cache import BLOCK, StaticCache
from logitlab.search.trees import sample_tree, score_tree
from logitlab.speculative.copy_or_recycle import CopyOrRecycle
from logitlab.speculative.draft_model import DraftModelDrafter
from logitlab.speculative.eagle import EagleDrafter, FeatureDrafter
from logitlab.speculative.medusa import MedusaDrafter
from logitlab.speculative.medusa_heads import medusa_generate
from logitlab.speculative.pass_embeddings import LookaheadEmbeddings, pass_generate
from logitlab.speculative.prompt_lookup import PromptLookupDrafter
from logitlab.speculative.suffix_automaton import SuffixDrafter
from logitlab.speculative.token_recycling import TokenRecycler
from logitlab.speculative.typical import TypicalAcceptance

TARGET, DRAFT = tiny_llama(2, 0, vocab=50), tiny_llama(1, 1, vocab=50)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [10]]  # different lengths: left padding
EOS = 44  # frequent enough in tiny_llama's outputs that rows finish at different steps


@contextlib.contextmanager
def static(model, room=fast_gpu.ROOM):
    fast_gpu.enable(model, graphs=False, room=room)
    try:
        yield model
    finally:
        fast_gpu.disable(model)


def both(model, run, room=fast_gpu.ROOM):
    """``run()`` on the stock cache and on the static one."""
    stock = run()
    with static(model, room):
        return stock, run()


def tokens(out):
    return [t.tolist() for t in out.new_tokens]


def seeded():
    return torch.Generator().manual_seed(0)


# --- The cache itself ---------------------------------------------------------------------------


def test_a_pass_writes_at_the_length_and_the_mask_hides_the_rest():
    cache = StaticCache(TARGET, batch=2, capacity=5)
    assert cache.capacity == BLOCK and cache.length == 0
    mask = cache.begin(3, torch.tensor([[0, 1, 1], [1, 1, 1]]))  # row 0 has one padding position
    assert cache.slots[:3].tolist() == [0, 1, 2] and mask.shape == (2, 1, 3, BLOCK)
    seen = (mask[:, 0] == 0)[..., :4]
    assert seen.tolist() == [[[False, False, False, False], [False, True, False, False], [False, True, True, False]],
                             [[True, False, False, False], [True, True, False, False], [True, True, True, False]]]
    assert not (mask[..., 3:] == 0).any()  # nothing beyond the pass is seen
    cache.end()
    mask = cache.begin(2, None)  # causal after the three positions
    assert cache.slots[:2].tolist() == [3, 4]
    assert (mask[0, 0] == 0)[:, :6].tolist() == [[True] * 4 + [False] * 2, [True] * 5 + [False]]


def test_crop_and_rows_follow_the_dynamic_cache():
    cache = StaticCache(TARGET, batch=3, capacity=8)
    cache.begin(6, None)
    for i, layer in enumerate(cache.layers):
        cache.update(torch.randn(3, 1, 6, 8), torch.randn(3, 1, 6, 8), i)
    cache.end()
    before = cache.layers[0].keys.clone()
    cache.crop(-2)
    assert cache.get_seq_length() == 4
    cache.crop(10)  # longer than the cache: nothing to drop, as DynamicCache.crop
    assert cache.length == 4
    address = cache.layers[0].keys.data_ptr()
    cache.batch_select_indices(torch.tensor([2, 0, 1]))  # a beam reordering: in place
    assert cache.layers[0].keys.data_ptr() == address
    assert torch.equal(cache.layers[0].keys[:, :, :4], before[[2, 0, 1], :, :4])
    cache.batch_select_indices(torch.tensor([1]))  # a row left: new buffers, the row's positions kept
    assert cache.batch == 1 and torch.equal(cache.layers[0].keys[0, :, :4], before[0, :, :4])
    cache.batch_repeat_interleave(2)
    assert cache.batch == 2 and torch.equal(cache.layers[0].keys[1, :, :4], before[0, :, :4])


def test_the_cache_grows_keeping_what_it_holds():
    cache = StaticCache(TARGET, batch=1, capacity=1)
    cache.begin(BLOCK - 1, None)
    for i in range(len(cache.layers)):
        cache.update(torch.randn(1, 1, BLOCK - 1, 8), torch.randn(1, 1, BLOCK - 1, 8), i)
    cache.end()
    held = cache.layers[1].values[:, :, :BLOCK - 1].clone()
    mask = cache.begin(3, None)
    assert cache.capacity == 2 * BLOCK and mask.shape[-1] == 2 * BLOCK
    assert torch.equal(cache.layers[1].values[:, :, :BLOCK - 1], held)
    assert cache.slots[:3].tolist() == [BLOCK - 1, BLOCK, BLOCK + 1]


def test_a_gone_caches_storage_serves_the_next_cache_of_its_shape():
    with static(TARGET):
        pool = TARGET.logitlab_static.pool
        first = prefill(TARGET, torch.tensor([[1, 2, 3]]), torch.ones(1, 3, dtype=torch.long)).cache
        address = first.layers[0].keys.data_ptr()
        second = prefill(TARGET, torch.tensor([[4, 5]]), torch.ones(1, 2, dtype=torch.long)).cache
        assert second.layers[0].keys.data_ptr() != address  # the first is still held: never shared
        del first
        assert len(pool.free) == 1
        third = prefill(TARGET, torch.tensor([[6]]), torch.ones(1, 1, dtype=torch.long)).cache
        assert third.layers[0].keys.data_ptr() == address and not pool.free
        other = prefill(TARGET, torch.tensor([[6], [7]]), torch.ones(2, 1, dtype=torch.long)).cache
        assert other.batch == 2 and other.layers[0].keys.data_ptr() != address  # another shape
        # Rows leaving, or the cache growing, hand the storage it leaves to the pool at once.
        other.batch_select_indices(torch.tensor([1]))
        assert [key for key, _ in pool.free] == [(2, other.capacity)]
        del second, third, other


def test_the_pool_keeps_the_latest_few():
    pool = fast_gpu.Pool(size=2)
    for i in range(3):
        pool.give(("key", i % 2), i)
    assert pool.take(("key", 0), lambda: "new") == 2 and pool.take(("key", 1), lambda: "new") == 1
    assert pool.take(("key", 0), lambda: "new") == "new"  # 0 went first


def test_a_pass_that_was_not_begun_is_refused():
    cache = StaticCache(TARGET, batch=1, capacity=8)
    with pytest.raises(ValueError, match="not begun"):
        TARGET(torch.tensor([[1, 2]]), past_key_values=cache)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="graphs"):
        fast_gpu.enable(TARGET, graphs=True)  # recording needs CUDA
    with pytest.raises(ValueError, match="room"):
        fast_gpu.enable(TARGET, room=0)
    assert not fast_gpu.wanted("cpu") and fast_gpu.wanted("cuda")
    with pytest.raises(ValueError, match="Llama-like"):
        fast_gpu.enable(ll.toy_model(vocab_size=5))


def test_a_drafters_model_follows_its_target():
    draft = tiny_llama(1, 1, vocab=50)
    with static(TARGET, room=40):
        assert fast_gpu.follow(draft, TARGET).logitlab_static == fast_gpu.Plan(room=40, graphs=False)
    assert not hasattr(fast_gpu.follow(draft, TARGET), "logitlab_static")


def test_the_environment_switches_it_off(monkeypatch):
    monkeypatch.setenv("LOGITLAB_FAST_GPU", "0")
    assert not fast_gpu.wanted("cuda")


# --- The same tokens in every loop (tiny models: every path, in milliseconds) -------------------


@pytest.mark.parametrize("settings", [dict(temperature=0), dict(temperature=1.0, num_return_sequences=2),
                                      dict(temperature=0.8, top_k=5, repetition_penalty=1.3)],
                         ids=["greedy", "T=1 two each", "top-k penalty"])
def test_generate(settings):
    stock, fixed = both(TARGET, lambda: ll.generate(TARGET, PROMPTS, max_new_tokens=40, eos_token_id=[EOS],
                                                    generator=seeded(), **settings))
    assert tokens(fixed) == tokens(stock)
    assert len({len(t) for t in tokens(stock)}) > 1  # rows finished at different steps


def test_generate_again_on_the_storage_the_last_call_left():
    with static(TARGET):
        first = ll.generate(TARGET, PROMPTS, max_new_tokens=20, eos_token_id=[], temperature=0)
        assert len(TARGET.logitlab_static.pool.free) >= 1
        again = ll.generate(TARGET, PROMPTS, max_new_tokens=20, eos_token_id=[], temperature=0)
    assert tokens(again) == tokens(first)


def test_generate_past_the_room_it_began_with():
    stock, fixed = both(TARGET, lambda: ll.generate(TARGET, PROMPTS, max_new_tokens=50, eos_token_id=[],
                                                    temperature=0), room=8)
    assert tokens(fixed) == tokens(stock)


def test_constrained_generate():
    target = tiny_llama(2, seed=0)
    prompts = [[1, 2], [3, 4, 5, 1]]
    run = lambda: ll.generate(target, prompts, max_new_tokens=12, temperature=0, eos_token_id=[5],  # noqa: E731
                              constraint=[constraint(), constraint(r"d(ab)*c?")])
    stock, fixed = both(target, run)
    assert tokens(fixed) == tokens(stock)


def test_beam_search():
    stock, fixed = both(TARGET, lambda: ll.beam_search(TARGET, PROMPTS[:2], num_beams=4, max_new_tokens=20,
                                                       eos_token_id=[EOS]))
    assert [s.tolist() for s in fixed.sequences] == [s.tolist() for s in stock.sequences]


def test_trees():
    def run():
        tree = sample_tree(TARGET, [1, 2, 3], branching=(3, 2, 2), generator=seeded())
        return tree.tokens.tolist(), score_tree(TARGET, [1, 2, 3], tree.parents, tree.tokens)[0]
    (stock_tokens, stock_scores), (tokens_, scores) = both(TARGET, run)
    assert tokens_ == stock_tokens
    torch.testing.assert_close(scores, stock_scores, atol=1e-5, rtol=0)


def drafters():
    feature = FeatureDrafter(TARGET)
    torch.nn.init.normal_(feature.fc.weight, std=0.2, generator=torch.Generator().manual_seed(1))
    heads = random_heads(TARGET, 3, seed=2)
    return {
        "draft model": DraftModelDrafter(DRAFT),
        "prompt lookup": PromptLookupDrafter(50),
        "suffix automaton": SuffixDrafter(50, corpus=[[1, 2, 3, 4, 5, 6]]),
        "token recycling": TokenRecycler(50),
        "copy or recycle": CopyOrRecycle(50),
        "medusa tree": MedusaDrafter(heads, tree=(3, 2, 1)),
        "eagle chain": EagleDrafter(feature),
        "eagle dynamic tree": EagleDrafter(feature, tree=dict(top_k=2, nodes=6)),
        "eagle fixed tree": EagleDrafter(feature, tree=dict(branching=(2, 2, 1))),
        "look-ahead embeddings": LookaheadEmbeddings(TARGET, 3),
    }


@pytest.mark.parametrize("temperature", [0, 1.0], ids=["greedy", "T=1"])
@pytest.mark.parametrize("name", list(drafters()))
def test_speculative_sampling_with_every_drafter(name, temperature):
    def run():
        drafter = drafters()[name]  # a fresh one: some drafters learn from what they saw
        for inner in (getattr(drafter, "model", None), getattr(drafter, "drafter", None)):
            if isinstance(inner, torch.nn.Module):  # a drafter's own model follows its target's path
                fast_gpu.follow(inner, TARGET)
                made.append(drafter)
        return ll.speculative_generate(TARGET, drafter, PROMPTS, gamma=3, max_new_tokens=30, eos_token_id=[EOS],
                                       temperature=temperature, generator=seeded())
    made = []
    stock, fixed = both(TARGET, run)
    assert tokens(fixed) == tokens(stock)
    assert fixed.accepted == stock.accepted
    if made:  # the draft model's and EAGLE's own passes: on a static cache too
        assert not isinstance(made[0].cache, StaticCache) and isinstance(made[1].cache, StaticCache)


def test_typical_acceptance_medusa_and_pass():
    heads = random_heads(TARGET, 3, seed=2)
    lookahead = LookaheadEmbeddings(TARGET, 3)
    runs = {
        "typical": lambda: ll.speculative_generate(TARGET, MedusaDrafter(heads, tree=(2, 2)), PROMPTS, gamma=2,
                                                   max_new_tokens=30, eos_token_id=[EOS], temperature=0.7,
                                                   acceptance=TypicalAcceptance(), generator=seeded()),
        "medusa_generate": lambda: medusa_generate(TARGET, heads, PROMPTS, branching=(3, 2, 1), max_new_tokens=30,
                                                   eos_token_id=[EOS]),
        "pass_generate": lambda: pass_generate(TARGET, lookahead, [1, 2, 3], max_new_tokens=30, temperature=1.0,
                                               generator=seeded()),
    }
    for name, run in runs.items():
        stock, fixed = both(TARGET, run)
        assert tokens(fixed) == tokens(stock), name


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_constrained_speculative_sampling(tree):
    target = tiny_llama(2, seed=0)
    feature = FeatureDrafter(target)
    torch.nn.init.normal_(feature.fc.weight, std=0.2, generator=torch.Generator().manual_seed(1))
    drafter = EagleDrafter(feature, tree=dict(top_k=2, nodes=6) if tree else None)
    prompts, constraints = [[1, 2], [3, 4, 5, 1], [2]], [constraint(), constraint(r"d(ab)*c?"), None]
    stock, fixed = both(target, lambda: ll.speculative_generate(target, drafter, prompts, gamma=3, max_new_tokens=12,
                                                                temperature=0, eos_token_id=[5],
                                                                constraint=constraints))
    assert tokens(fixed) == tokens(stock)


# --- The real model: the same logits to float rounding, the same long generations ---------------


def test_every_kind_of_pass_gives_the_stock_logits(smollm):
    model, tokenizer = smollm
    ids = [ll.chat_ids(tokenizer, "Name three rivers."), ll.chat_ids(tokenizer, "What is the capital of Peru?")]
    width = max(map(len, ids))
    batch = torch.tensor([[0] * (width - len(i)) + i for i in ids])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(i) for i in ids])[:, None]).long()
    parents = [-1, 0, 0, 1]
    allowed = ll.tree_attention_mask(parents)

    def passes():
        first = prefill(model, batch, mask, hidden=True, layers=(2, 30))
        grown = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
        step = forward(model, cache=first.cache, input_ids=torch.tensor([[504], [253]]), attention_mask=grown,
                       position_ids=grown.sum(-1, keepdim=True) - 1, logits_to_keep=1)
        start = grown.sum(-1, keepdim=True)
        tree = tree_forward(model, step.cache, grown, allowed.expand(2, -1, -1), start + torch.tensor([0, 1, 1, 2]),
                            input_ids=torch.tensor([[30, 31, 32, 33]] * 2), hidden=True)
        longest = max(ids, key=len)  # no padding: masked_forward lets the new inputs see every position before
        one = prefill(model, torch.tensor([longest]), torch.ones(1, width, dtype=torch.long))
        masked = masked_forward(model, one.cache, allowed, torch.tensor([0, 1, 1, 2]) + width,
                                input_ids=torch.tensor([40, 41, 42, 43]))
        # (padding's own hidden states are garbage either way: they see nothing)
        return [first.logits, first.hidden[mask.bool()], step.logits, tree.logits, tree.hidden, masked.logits]

    with torch.inference_mode():
        stock, fixed = both(model, passes)
    for name, a, b in zip(["prefill", "fused features", "decode step", "tree", "tree hidden", "masked"], fixed, stock):
        torch.testing.assert_close(a, b, atol=2e-4, rtol=1e-4, msg=name)


@pytest.mark.slow  # 8-11 s; under transformers 4.56 the tiny models' tests cover the same paths
def test_long_greedy_generations_and_eagle_trees_give_the_stock_tokens(smollm):
    model, tokenizer = smollm
    prompts = ["Write a short story about a lighthouse keeper.", "Explain how vaccines work."]
    common = dict(tokenizer=tokenizer, temperature=0, eos_token_id=[])
    drafter = EagleDrafter(ll.speculative.eagle.load_pretrained(model), tree=dict(top_k=3, nodes=10))
    stock, fixed = both(model, lambda: (ll.generate(model, prompts, max_new_tokens=96, **common),
                                        ll.speculative_generate(model, drafter, prompts[:1], gamma=4, max_new_tokens=48,
                                                                **common)))
    assert tokens(fixed[0]) == tokens(stock[0])
    assert tokens(fixed[1]) == tokens(stock[1]) == [tokens(stock[0])[0][:48]]


# --- The recording (CUDA only) ------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="recording a pass as a CUDA graph needs CUDA")
def test_recorded_passes_replay_the_unrecorded_ones():
    import warnings

    model, tokenizer = ll.load("smollm2-135m", device="cuda")
    assert isinstance(model.logitlab_static, fast_gpu.Plan) and model.logitlab_static.graphs
    prompts = ["Write a short story about a lighthouse keeper.", "Explain how vaccines work."]
    common = dict(tokenizer=tokenizer, temperature=0, eos_token_id=[], max_new_tokens=64)
    drafter = ll.speculative.eagle.load_pretrained(model)
    draft = ll.speculative.draft_model.load_pretrained(model)

    def every_loop():
        return [ll.generate(model, prompts, **common), ll.generate(model, prompts, **common),  # again: replayed
                ll.speculative_generate(model, EagleDrafter(drafter, tree=dict(top_k=3, nodes=10)), prompts,
                                        gamma=4, **common),
                ll.speculative_generate(model, DraftModelDrafter(draft), prompts, gamma=3, **common),
                ll.beam_search(model, prompts[:1], num_beams=3, max_new_tokens=24, eos_token_id=[], tokenizer=tokenizer)]

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a pass that could not be recorded warns
        recorded = every_loop()
    assert fast_gpu.recorded(model)["passes"] > 0 and fast_gpu.recorded(model)["failed"] == 0
    for m in (model, drafter, draft):
        fast_gpu.enable(m, graphs=False)
    unrecorded = every_loop()
    for m in (model, drafter, draft):
        fast_gpu.disable(m)
    stock = every_loop()
    for a, b, c in zip(recorded[:4], unrecorded[:4], stock[:4]):
        assert tokens(a) == tokens(b) == tokens(c)
    assert [s.tolist() for s in recorded[4].sequences] == [s.tolist() for s in stock[4].sequences]


# --- What the static path reads back from the device ---------------------------------------------


def test_the_static_path_reads_nothing_more_from_the_device():
    """Its length is a Python number and its mask is built on the device: the loops read back from
    the device what they read on the stock cache, and nothing more (on a GPU, each read waits for
    every pass queued before it)."""
    from test_host_reads import library_reads

    def count(run):
        with library_reads() as counts:
            run()
        return sum(counts.values())

    runs = [lambda: ll.generate(TARGET, PROMPTS, max_new_tokens=30, eos_token_id=[EOS], temperature=0),
            lambda: ll.speculative_generate(TARGET, DraftModelDrafter(DRAFT), PROMPTS, gamma=3, max_new_tokens=30,
                                            eos_token_id=[EOS], temperature=0),
            lambda: ll.speculative_generate(TARGET, drafters()["eagle dynamic tree"], PROMPTS, gamma=3,
                                            max_new_tokens=30, eos_token_id=[EOS], temperature=0)]
    for run in runs:
        stock, fixed = both(TARGET, lambda: count(run))
        assert 0 < fixed <= stock
