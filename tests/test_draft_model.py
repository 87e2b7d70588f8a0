"""The book's draft model (logitlab.training.draft, ll.speculative.draft_model.load_pretrained): its reduced output
layer, the choice of its vocabulary, saving and loading, and the shipped file."""

import pytest
import torch

import logitlab as ll
from logitlab.speculative.subset_head import SubsetHead
from logitlab.speculative.draft_model import build_draft, load_pretrained
from logitlab.training.data import choose_vocabulary
from logitlab.training.draft import save_draft


def tiny_target(seed=0, vocab=12):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         tie_word_embeddings=True, bos_token_id=0, eos_token_id=None, pad_token_id=0)
    return LlamaForCausalLM(config).eval()


def test_subset_head_scores_the_subset_like_the_full_layer_and_nothing_else():
    embedding = torch.randn(10, 4)
    vocab = torch.tensor([1, 3, 7])
    hidden = torch.randn(2, 5, 4)
    logits = SubsetHead(embedding, vocab)(hidden)
    assert logits.shape == (2, 5, 10)
    torch.testing.assert_close(logits[..., vocab], hidden @ embedding[vocab].T)
    others = torch.tensor([i for i in range(10) if i not in vocab.tolist()])
    assert torch.isneginf(logits[..., others]).all()
    probs = ll.softmax(logits)  # what the drafter samples from: zero outside the subset
    assert (probs[..., others] == 0).all() and torch.allclose(probs.sum(-1), torch.ones(2, 5))


def test_subset_positions_find_each_token_in_a_subset_in_any_order():
    from logitlab.speculative.subset_head import subset_positions

    vocab = torch.tensor([7, 1, 3])  # not sorted: the Medusa heads' and the draft's vocabularies both serve
    got = subset_positions(vocab, torch.tensor([[3, 0], [7, 1]]), vocab_size=10)
    assert got.tolist() == [[2, -1], [0, 1]]


def test_choose_vocabulary_picks_the_tokens_with_the_most_target_probability():
    # Two recorded positions, top-3 logits each; token 5 is in both and gets the most mass.
    rows = [(None, None, torch.tensor([[3.0, 1.0, 0.0], [2.0, 1.5, -5.0]]).half(),
             torch.tensor([[5, 2, 9], [5, 4, 0]], dtype=torch.int32))]
    p1 = torch.softmax(torch.tensor([3.0, 1.0, 0.0]), 0)
    p2 = torch.softmax(torch.tensor([2.0, 1.5, -5.0]), 0)
    assert p2[1] > p1[1] > p1[2] > p2[2]  # so the order of mass is 5, 4, 2, 9, 0
    assert choose_vocabulary(rows, vocab_size=12, size=2).tolist() == [4, 5]
    assert choose_vocabulary(rows, vocab_size=12, size=3).tolist() == [2, 4, 5]  # sorted ids


def test_save_and_load_round_trip_with_and_without_the_subset(tmp_path):
    target = tiny_target()
    draft = build_draft(target)
    assert draft.model.embed_tokens is target.model.embed_tokens  # shared, not copied
    with torch.no_grad():  # pretend training moved the layer away from the target's layer 0
        for p in draft.model.layers.parameters():
            p.add_(0.1 * torch.randn_like(p))
    path = tmp_path / "draft.safetensors"
    vocab = torch.tensor([0, 2, 3, 8])
    save_draft(draft, str(path), vocab)
    ids = torch.tensor([[1, 5, 2, 7, 3]])
    with torch.inference_mode():
        expected = draft(ids).logits.float()
        full = load_pretrained(target, str(path), full_vocabulary=True)
        reduced = load_pretrained(target, str(path))
        # float16 storage: the round trip is close, not bit-exact
        torch.testing.assert_close(full(ids).logits.float(), expected, atol=2e-2, rtol=1e-2)
        got = reduced(ids).logits.float()
    assert isinstance(reduced.lm_head, SubsetHead) and not isinstance(full.lm_head, SubsetHead)
    torch.testing.assert_close(got[..., vocab], expected[..., vocab], atol=2e-2, rtol=1e-2)
    assert torch.isneginf(got[..., [1, 4, 5, 6, 7, 9, 10, 11]]).all()


def test_load_pretrained_refuses_a_model_it_was_not_trained_for():
    with pytest.raises(ValueError, match="SmolLM2-135M"):
        ll.speculative.draft_model.load_pretrained(tiny_target())
    with pytest.raises(ValueError, match="target"):
        ll.speculative.draft_model.load_pretrained("smollm2")


def test_the_shipped_draft_is_small_loads_and_drafts_only_its_vocabulary():
    assert ll.speculative.draft_model.PRETRAINED_DRAFT.stat().st_size <= 20e6
    model, tokenizer = ll.load("smollm2-135m", device="cpu")
    draft = ll.speculative.draft_model.load_pretrained(model)
    with pytest.raises(ValueError, match="full_vocabulary"):
        ll.speculative.draft_model.load_pretrained(model, full_vocabulary="yes")
    assert isinstance(draft.lm_head, SubsetHead) and draft.config.num_hidden_layers == 1
    assert draft.model.embed_tokens is model.model.embed_tokens
    # A chat answer the draft never saw; its acceptance rate, position by position, against the
    # target: the trained draft must beat the same architecture before training (measured: about
    # 0.23 against 0.08).
    question = [{"role": "user", "content": "Explain how a refrigerator keeps food cold."}]
    prompt = tokenizer.apply_chat_template(question, add_generation_prompt=True, tokenize=False)
    answer = ("A refrigerator keeps food cold by moving heat from the inside to the outside. A refrigerant "
              "circulates through coils: it evaporates inside the fridge, absorbing heat, and a compressor "
              "squeezes it so that it releases that heat through the coils at the back.")
    ids = tokenizer(prompt + answer, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.inference_mode():
        target = ll.softmax(model(ids).logits[0, -40:])
        full = ll.speculative.draft_model.load_pretrained(model, full_vocabulary=True)(ids).logits[0, -40:]
        reduced = draft(ids).logits[0, -40:]
        untrained = build_draft(model)(ids).logits[0, -40:]
    vocab = draft.lm_head.vocab
    torch.testing.assert_close(reduced[:, vocab], full[:, vocab])
    trained_alpha = ll.speculative.acceptance_rate(target, ll.softmax(reduced)).mean()
    untrained_alpha = ll.speculative.acceptance_rate(target, ll.softmax(untrained)).mean()
    assert trained_alpha > 0.15 and trained_alpha > untrained_alpha + 0.1
