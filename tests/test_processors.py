"""Truncation and repetition rules (chapters 2 and 3): logitlab.sampling.truncation and logitlab.sampling.penalties,
with Hugging Face's processors as the oracle."""

import collections
import math

import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
    TypicalLogitsWarper,
)

import logitlab.sampling.truncation as processors
from logitlab.sampling.penalties import (
    FrequencyPenalty,
    PresencePenalty,
    RepetitionPenalty,
    frequency_penalty,
    presence_penalty,
    repetition_penalty,
)
from logitlab.sampling.truncation import MinP, TopK, TopP, Typical, min_p, top_k, top_p, typical

INF = float("inf")
HALF = [torch.float16, torch.bfloat16]


def hf(processor, logits, input_ids=None):
    """Run a Hugging Face processor on a copy (some of them write into their input)."""
    if input_ids is None:
        input_ids = torch.zeros(logits.shape[0], 1, dtype=torch.long)
    return processor(input_ids, logits.clone())


def random_logits(seed, batch, vocab, scale, dtype=torch.float32):
    """Gaussian logits with a few adversarial rows: some -inf entries, all but one -inf."""
    gen = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(batch, vocab, generator=gen)
    if batch >= 3 and vocab >= 4:
        logits[1, torch.randperm(vocab, generator=gen)[: vocab // 2]] = -INF
        logits[2] = -INF
        logits[2, seed % vocab] = 0.5
    return logits.to(dtype)


# Vocabulary sizes from 2 to 50000 and scales from nearly uniform to nearly one-hot.
RANDOM = [(seed, batch, vocab, scale) for seed, (batch, vocab, scale) in enumerate([
    (1, 2, 1.0), (4, 2, 5.0), (3, 5, 0.1), (5, 16, 2.0), (4, 100, 1.0), (6, 1000, 3.0),
    (3, 1000, 0.2), (4, 5000, 10.0), (3, 50000, 1.0), (4, 50000, 3.0), (2, 50000, 30.0),
])]
P_VALUES = [1e-9, 0.1, 0.5, 0.9, 0.95, 0.999]


def kept(x):
    return ~torch.isneginf(x)


def assert_kept_values_unchanged(out, logits):
    assert out.dtype == logits.dtype and out.shape == logits.shape
    assert torch.equal(out[kept(out)], logits[kept(out)])


# ---------------------------------------------------------------- top_k


@pytest.mark.parametrize("seed, batch, vocab, scale", RANDOM)
def test_top_k_is_hugging_faces(seed, batch, vocab, scale):
    logits = random_logits(seed, batch, vocab, scale)
    for k in sorted({1, 2, 5, 50, vocab - 1, vocab, vocab + 7} - {0}):
        ours = top_k(logits, k)
        assert torch.equal(ours, hf(TopKLogitsWarper(k), logits)), k
        assert_kept_values_unchanged(ours, logits)
        if k >= vocab:
            assert torch.equal(ours, logits)


def test_top_k_keeps_every_token_tied_with_the_kth():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    expected = torch.tensor([[-INF, 3.0, 3.0, -INF], [0.0, 0.0, 0.0, 0.0]])
    assert torch.equal(top_k(logits, 1), expected)
    assert torch.equal(hf(TopKLogitsWarper(1), logits), expected)


@pytest.mark.parametrize("dtype", HALF)
def test_top_k_half_precision(dtype):
    logits = random_logits(0, 4, 1000, 3.0, dtype)
    ours = top_k(logits, 20)
    assert ours.dtype == dtype
    assert torch.equal(ours, hf(TopKLogitsWarper(20), logits))


# ---------------------------------------------------------------- top_p


def reference_top_p(logits, p, min_tokens_to_keep=1):
    """HF's TopPLogitsWarper with a stable sort: the rule logitlab documents, ties included."""
    if p == 1:
        return logits.clone()
    ascending, ids = torch.sort(logits, stable=True)
    remove = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1 - p
    remove[..., -min_tokens_to_keep:] = False
    return logits.masked_fill(remove.scatter(-1, ids, remove), -INF)


@pytest.mark.parametrize("seed, batch, vocab, scale", RANDOM)
def test_top_p_is_hugging_faces(seed, batch, vocab, scale):
    logits = random_logits(seed, batch, vocab, scale)
    for p in P_VALUES:
        for m in (1, 3):
            ours = top_p(logits, p, m)
            theirs = hf(TopPLogitsWarper(p, min_tokens_to_keep=m), logits)
            assert torch.equal(kept(ours), kept(theirs)), (p, m)
            assert_kept_values_unchanged(ours, logits)


def test_top_p_float64_is_hugging_faces():
    for seed, scale in enumerate([0.3, 3.0, 10.0]):
        logits = random_logits(seed, 6, 20000, scale, torch.float64)
        for p in (0.1, 0.5, 0.9, 0.99):
            ours = top_p(logits, p)
            assert torch.equal(kept(ours), kept(hf(TopPLogitsWarper(p), logits)))
            assert_kept_values_unchanged(ours, logits)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("seed, batch, vocab, scale", RANDOM)
def test_top_p_half_precision_keeps_as_many_as_hugging_face(seed, batch, vocab, scale, dtype):
    # Half precision has many tied logits, and for rows longer than 16 tokens HF's order among
    # them comes from an unstable sort: compare how many, and which values, are kept.
    logits = random_logits(seed, batch, vocab, scale, dtype)
    for p in (0.1, 0.5, 0.9, 0.999):
        ours = top_p(logits, p)
        theirs = hf(TopPLogitsWarper(p), logits)
        assert ours.dtype == dtype
        assert torch.equal(kept(ours).sum(-1), kept(theirs).sum(-1)), p
        for ours_row, theirs_row in zip(ours.float(), theirs.float()):
            assert torch.equal(ours_row[kept(ours_row)].sort().values, theirs_row[kept(theirs_row)].sort().values)
        assert torch.equal(ours, reference_top_p(logits, p))
        assert_kept_values_unchanged(ours, logits)


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
def test_top_p_ties_follow_the_stable_order_as_hugging_face_on_short_rows(dtype):
    # Rows of up to 16 tokens: HF's sort is stable, so its tie order is ours (higher id first).
    gen = torch.Generator().manual_seed(0)
    for vocab in (2, 3, 8, 16):
        logits = torch.randint(-2, 3, (64, vocab), generator=gen).to(dtype)
        for p in (0.1, 0.3, 0.5, 0.7, 0.9):
            for m in (1, 2):
                ours = top_p(logits, p, m)
                assert torch.equal(ours, hf(TopPLogitsWarper(p, min_tokens_to_keep=m), logits)), (vocab, p, m)
    uniform = torch.zeros(1, 8, dtype=dtype)
    assert torch.equal(kept(top_p(uniform, 0.5)), torch.tensor([[False] * 4 + [True] * 4]))


@pytest.mark.parametrize("vocab", [1000, 50000])
def test_top_p_ties_on_long_rows_keep_the_higher_ids(vocab):
    # Groups of equal logits, one of them split by the boundary: HF keeps the same number of
    # tokens, and ours are the most likely ones with ties going to the higher ids.
    gen = torch.Generator().manual_seed(1)
    logits = torch.randint(0, 40, (6, vocab), generator=gen).float() / 4
    logits[:, :300] += 8  # enough mass near the top for the fast path to decide the rows
    for p in (0.3, 0.5, 0.8, 0.9):
        ours = top_p(logits, p)
        assert torch.equal(kept(ours).sum(-1), kept(hf(TopPLogitsWarper(p), logits)).sum(-1))
        assert torch.equal(ours, reference_top_p(logits, p))
        for row, row_kept in zip(logits, kept(ours)):
            assert row[row_kept].min() >= row[~row_kept].max()
            boundary = row[row_kept].min()
            tied = (row == boundary).nonzero().squeeze(-1)
            kept_ties = tied[row_kept[tied]]
            assert torch.equal(kept_ties, tied[len(tied) - len(kept_ties):])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, *HALF])
def test_top_p_exact_boundaries_with_dyadic_probabilities(dtype):
    logits = torch.tensor([[0.5, 0.25, 0.125, 0.125]]).log().to(dtype)
    # A token is kept while the tokens above it hold less than p: at exactly p it is removed.
    for p, count in [(0.5, 1), (0.75, 2), (0.8, 3), (0.875, 3), (0.9, 4), (1.0, 4)]:
        ours = top_p(logits, p)
        assert kept(ours).sum().item() == count, p
        if p < 1:
            assert torch.equal(ours, hf(TopPLogitsWarper(p), logits))
    # The same boundaries inside a long row (-inf elsewhere: the fast path after a top_k).
    long_row = torch.full((2, 3000), -INF, dtype=dtype)
    long_row[:, [7, 100, 2000, 2999]] = logits[0]
    assert torch.equal(kept(top_p(long_row, 0.75)).nonzero()[:, 1], torch.tensor([7, 100, 7, 100]))
    assert torch.equal(top_p(long_row, 0.75), hf(TopPLogitsWarper(0.75), long_row))


def test_top_p_extreme_p_and_min_tokens_to_keep():
    logits = random_logits(3, 4, 500, 2.0)
    assert torch.equal(top_p(logits, 1.0), logits)
    assert top_p(logits, 1.0).data_ptr() != logits.data_ptr()
    top = top_p(logits, 1e-9)
    assert torch.equal(kept(top), kept(top_k(logits, 1)))
    for m in (2, 7, 499, 500, 10_000):
        out = top_p(logits, 1e-9, min_tokens_to_keep=m)
        assert torch.equal(kept(out), kept(hf(TopPLogitsWarper(1e-9, min_tokens_to_keep=m), logits)))
        assert torch.equal(kept(out).sum(-1), torch.tensor([min(m, 500), min(m, 250), 1, min(m, 500)]))


def test_top_p_at_one_keeps_tokens_whose_probability_underflows():
    # HF computes 1 - p = 0 and removes the tokens whose float32 probability is exactly 0.
    logits = torch.tensor([[0.0, -200.0, 1.0]])
    assert torch.equal(top_p(logits, 1.0), logits)
    assert torch.isneginf(hf(TopPLogitsWarper(1.0), logits)[0, 1])


def test_top_p_sorts_the_rows_where_the_last_bit_matters():
    # In this row the mass above one token is within float32 rounding of p: HF's softmax sum
    # (float32, in sorted order) and ours (float64, unsorted) round to opposite sides, so the
    # row must not be decided by the fast path but sorted and computed as HF does. Which side
    # HF's float32 sum lands on depends on the CPU's vector width (1790 tokens kept with
    # AVX-512, 1791 with AVX2, as the exact sum gives: both measured); ours must follow it.
    logits = 3 * torch.randn(64, 49152, generator=torch.Generator().manual_seed(250))[36:37]
    ours = top_p(logits, 0.9)
    assert kept(ours).sum() in (1790, 1791)
    assert torch.equal(kept(ours), kept(hf(TopPLogitsWarper(0.9), logits)))


def test_top_p_every_path_agrees_with_hugging_face(monkeypatch):
    """Peaky rows are decided among 256 candidates, flatter ones among 4096, the flattest by a
    full sort; a batch of mixed rows goes through all three."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(6, 49152, generator=gen) * torch.tensor([[20.0], [3.0], [0.5], [20.0], [3.0], [0.5]])
    sizes = []
    most_likely_first = processors._most_likely_first
    def spy(rows, size):
        sizes.append(size)
        return most_likely_first(rows, size)

    monkeypatch.setattr(processors, "_most_likely_first", spy)
    for p in (0.5, 0.9):
        sizes.clear()
        ours = top_p(logits, p)
        assert {256, 4096, 49152} <= set(sizes)
        assert torch.equal(kept(ours), kept(hf(TopPLogitsWarper(p), logits)))
    sizes.clear()
    top_p(logits[[0, 3]], 0.9)
    assert 49152 not in sizes and 4096 not in sizes  # peaky rows: no sort of the vocabulary
    # The first row sets where the others start: a flat first row sends them to 4096 at once.
    sizes.clear()
    flat_first = logits[[2, 0, 1, 3]]
    assert torch.equal(kept(top_p(flat_first, 0.9)), kept(hf(TopPLogitsWarper(0.9), flat_first)))
    assert 256 not in sizes[sizes.index(49152) + 1:]


def test_top_p_after_top_k_is_top_p_among_the_survivors():
    logits = random_logits(11, 8, 49152, 3.0)
    for k, p in [(50, 0.9), (256, 0.5), (300, 0.95), (1, 0.5)]:
        chained = top_p(top_k(logits, k), p)
        theirs = hf(LogitsProcessorList([TopKLogitsWarper(k), TopPLogitsWarper(p)]), logits)
        assert torch.equal(chained, theirs)


# ---------------------------------------------------------------- min_p and typical


@pytest.mark.parametrize("seed, batch, vocab, scale", RANDOM)
def test_min_p_is_hugging_faces(seed, batch, vocab, scale):
    logits = random_logits(seed, batch, vocab, scale)
    for p in (0.0, 1e-9, 0.01, 0.1, 0.5, 1.0):
        for m in (1, 3, vocab + 5):
            ours = min_p(logits, p, m)
            assert torch.equal(ours, hf(MinPLogitsWarper(p, min_tokens_to_keep=m), logits)), (p, m)
            assert_kept_values_unchanged(ours, logits)
    assert torch.equal(min_p(logits, 0.0), logits)


def test_min_p_small_case():
    logits = torch.tensor([0.5, 0.25, 0.15, 0.1]).log()
    assert torch.equal(kept(min_p(logits, 0.5)), torch.tensor([True, True, False, False]))
    assert torch.equal(kept(min_p(logits, 0.5, min_tokens_to_keep=3)), torch.tensor([True, True, True, False]))


@pytest.mark.parametrize("seed, batch, vocab, scale", RANDOM)
def test_typical_is_hugging_faces(seed, batch, vocab, scale):
    logits = random_logits(seed, batch, vocab, scale)
    for mass in (1e-9, 0.2, 0.5, 0.9, 0.99):
        for m in (1, 3):
            ours = typical(logits, mass, m)
            assert torch.equal(ours, hf(TypicalLogitsWarper(mass, min_tokens_to_keep=m), logits)), (mass, m)
            assert_kept_values_unchanged(ours, logits)
    assert torch.equal(typical(logits, 1.0), logits)


def test_typical_can_remove_the_most_likely_token():
    # One token of probability 0.3 and 999 of about 0.7 / 999: the entropy is 5.44 nats, the
    # surprisals 1.20 (the likely token) and about 7.26 (the others): the others are typical.
    noise = 0.01 * torch.randn(1, 1000, generator=torch.Generator().manual_seed(0))
    logits = math.log(0.7 / 999) + noise
    logits[0, 0] = math.log(0.3)
    out = typical(logits, 0.3)
    assert torch.isneginf(out[0, 0]) and 300 < kept(out).sum() < 600
    assert torch.equal(out, hf(TypicalLogitsWarper(0.3), logits))


@pytest.mark.parametrize("dtype", HALF)
def test_min_p_and_typical_half_precision(dtype):
    logits = random_logits(5, 4, 3000, 3.0, dtype)
    assert min_p(logits, 0.1).dtype == typical(logits, 0.9).dtype == dtype
    assert torch.equal(min_p(logits, 0.1, 2), hf(MinPLogitsWarper(0.1, min_tokens_to_keep=2), logits))
    assert torch.equal(typical(logits, 0.9, 2), hf(TypicalLogitsWarper(0.9, min_tokens_to_keep=2), logits))


@pytest.mark.parametrize("rule", [top_k, top_p, min_p, typical])
def test_truncation_accepts_any_leading_dims(rule):
    arg = {top_k: 7, top_p: 0.8, min_p: 0.05, typical: 0.8}[rule]
    logits = random_logits(2, 6, 300, 2.0)
    flat = rule(logits, arg)
    assert torch.equal(rule(logits.reshape(2, 3, 300), arg), flat.reshape(2, 3, 300))
    assert torch.equal(rule(logits[0], arg), flat[0])
    assert rule(logits[:0], arg).shape == (0, 300)


# ---------------------------------------------------------------- penalties


def test_presence_and_frequency_penalties_by_hand():
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    prev = torch.tensor([[1, 1, 3, -1, 4, 4, 4], [0, -1, -1, -1, -1, -1, -1]])
    presence = torch.tensor([[1.0, 1.5, 3.0, 3.5, 4.5], [0.5, 2.0, 3.0, 4.0, 5.0]])
    frequency = torch.tensor([[1.0, 1.0, 3.0, 3.5, 3.5], [0.5, 2.0, 3.0, 4.0, 5.0]])
    assert torch.equal(presence_penalty(logits, prev, 0.5), presence)
    assert torch.equal(frequency_penalty(logits, prev, 0.5), frequency)
    # pad_token_id is ignored as well; a negative penalty encourages repetition.
    assert torch.equal(frequency_penalty(logits, prev, 0.5, pad_token_id=4)[0], torch.tensor([1.0, 1.0, 3.0, 3.5, 5.0]))
    assert torch.equal(frequency_penalty(logits, prev, -1.0)[0], torch.tensor([1.0, 4.0, 3.0, 5.0, 8.0]))
    assert torch.equal(presence_penalty(logits, prev, -1.0)[0], torch.tensor([1.0, 3.0, 3.0, 5.0, 6.0]))
    # Nothing before, or penalty 0: nothing changes; -inf stays -inf.
    assert torch.equal(frequency_penalty(logits, prev[:, :0], 0.5), logits)
    assert torch.equal(presence_penalty(logits, prev, 0.0), logits)
    removed = logits.clone()
    removed[0, 4] = -INF
    assert torch.isneginf(frequency_penalty(removed, prev, -2.0)[0, 4])


def test_repetition_penalty_by_hand():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, 0.0]])
    prev = torch.tensor([[0, 1, 1, 1, -1, 4]])
    # Divided if positive, multiplied if negative, once however often it occurred.
    assert torch.equal(repetition_penalty(logits, prev, 2.0), torch.tensor([[1.0, -4.0, 1.0, 0.5, 0.0]]))
    assert torch.equal(repetition_penalty(logits, prev, 0.5), torch.tensor([[4.0, -1.0, 1.0, 0.5, 0.0]]))
    padded = repetition_penalty(logits, prev, 2.0, pad_token_id=0)
    assert torch.equal(padded, torch.tensor([[2.0, -4.0, 1.0, 0.5, 0.0]]))
    assert torch.equal(repetition_penalty(logits, prev, 1.0), logits)


def counting_reference(logits, prev, rule, penalty):
    """A loop over tokens, to check the vectorised code."""
    out = logits.clone()
    for row, ids in enumerate(prev.tolist()):
        counts = collections.Counter(i for i in ids if 0 <= i < logits.shape[-1])
        for token, count in counts.items():
            value = out[row, token]
            if rule is frequency_penalty:
                out[row, token] = value.item() - penalty * count
            elif rule is presence_penalty:
                out[row, token] = value.item() - penalty
            else:
                out[row, token] = value * penalty if value < 0 else value / penalty
    return out


@pytest.mark.parametrize("rule", [frequency_penalty, presence_penalty, repetition_penalty])
@pytest.mark.parametrize("seed", range(4))
def test_penalties_match_a_loop_over_tokens(rule, seed):
    gen = torch.Generator().manual_seed(seed)
    batch, vocab, seq = [(1, 2, 5), (3, 50, 40), (8, 1000, 200), (4, 50000, 300)][seed]
    logits = 4 * torch.randn(batch, vocab, generator=gen)
    prev = torch.randint(-1, min(vocab, 30), (batch, seq), generator=gen)  # many repeats, some padding
    prev[:, ::7] = torch.randint(0, vocab, prev[:, ::7].shape, generator=gen)
    for penalty in (0.5, 1.3, 2.0):
        assert torch.equal(rule(logits, prev, penalty), counting_reference(logits, prev, rule, penalty))


@pytest.mark.parametrize("dtype", [torch.float32, *HALF])
@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.2, 3.0])
def test_repetition_penalty_is_hugging_faces(dtype, penalty):
    gen = torch.Generator().manual_seed(3)
    logits = (3 * torch.randn(5, 1000, generator=gen)).to(dtype)
    prev = torch.randint(0, 1000, (5, 60), generator=gen)
    prev[:, 30:] = prev[:, :30]  # repeats
    ours = repetition_penalty(logits, prev, penalty)
    assert ours.dtype == dtype
    assert torch.equal(ours, hf(RepetitionPenaltyLogitsProcessor(penalty), logits, prev))
    assert torch.equal(RepetitionPenalty(penalty)(prev, logits), ours)


@pytest.mark.parametrize("dtype", HALF)
def test_additive_penalties_half_precision(dtype):
    logits = torch.tensor([[1.0, 2.0, 3.0]], dtype=dtype)
    prev = torch.tensor([[2] * 300 + [1]])  # 300 counts: more than bfloat16 counts exactly
    out = frequency_penalty(logits, prev, 0.01)
    assert out.dtype == dtype
    assert torch.equal(out, torch.tensor([[1.0, 2.0 - 0.01, 3.0 - 3.0]]).to(dtype))
    assert torch.equal(presence_penalty(logits, prev, 0.5), torch.tensor([[1.0, 1.5, 2.5]], dtype=dtype))


def test_penalties_ignore_ids_outside_the_vocabulary():
    logits = torch.tensor([[1.0, 1.0]])
    prev = torch.tensor([[1, 2, 7, -3]])
    assert torch.equal(frequency_penalty(logits, prev, 1.0), torch.tensor([[1.0, 0.0]]))
    theirs = hf(RepetitionPenaltyLogitsProcessor(2.0), logits, prev[:, :3])
    assert torch.equal(repetition_penalty(logits, prev, 2.0), theirs)


def test_penalty_classes_count_the_right_tokens():
    scores = torch.zeros(2, 6)
    input_ids = torch.tensor([[1, 2, 3, 3, 4], [5, 5, 5, 0, 0]])  # prompt of 2 tokens, then output
    def penalties(processor):
        return -processor(input_ids, scores).long()

    assert penalties(PresencePenalty(1.0, prompt_length=2)).tolist() == [[0, 0, 0, 1, 1, 0], [1, 0, 0, 0, 0, 1]]
    assert penalties(FrequencyPenalty(1.0, prompt_length=2)).tolist() == [[0, 0, 0, 2, 1, 0], [2, 0, 0, 0, 0, 1]]
    assert penalties(FrequencyPenalty(1.0)).tolist() == [[0, 1, 1, 2, 1, 0], [2, 0, 0, 0, 0, 3]]
    assert penalties(FrequencyPenalty(1.0, prompt_length=2, pad_token_id=0))[1].tolist() == [0, 0, 0, 0, 0, 1]
    # The repetition penalty counts the prompt too, as HF does.
    positive = torch.ones(2, 6)
    expected = hf(RepetitionPenaltyLogitsProcessor(2.0), positive, input_ids)
    assert torch.equal(RepetitionPenalty(2.0)(input_ids, positive), expected)
    assert expected[0, 1] == 0.5


# ---------------------------------------------------------------- Hugging Face processors


def test_classes_in_a_logits_processor_list_are_the_functions():
    logits = random_logits(4, 4, 2000, 3.0)
    input_ids = torch.randint(0, 2000, (4, 12), generator=torch.Generator().manual_seed(0))
    chain = LogitsProcessorList([
        RepetitionPenalty(1.3), PresencePenalty(0.4, prompt_length=5), FrequencyPenalty(0.2, prompt_length=5),
        TopK(300), Typical(0.95), MinP(0.01), TopP(0.9, min_tokens_to_keep=2),
    ])
    expected = repetition_penalty(logits, input_ids, 1.3)
    expected = frequency_penalty(presence_penalty(expected, input_ids[:, 5:], 0.4), input_ids[:, 5:], 0.2)
    expected = top_p(min_p(typical(top_k(expected, 300), 0.95), 0.01), 0.9, 2)
    before = logits.clone()
    assert torch.equal(chain(input_ids, logits), expected)
    assert torch.equal(logits, before)
    hf_chain = LogitsProcessorList([TopKLogitsWarper(50), TopPLogitsWarper(0.9)])
    ours = LogitsProcessorList([TopK(50), TopP(0.9)])(input_ids, logits)
    assert torch.equal(ours, hf_chain(input_ids, logits.clone()))
    assert repr(TopP(0.9)) == "TopP(p=0.9, min_tokens_to_keep=1)"


def test_generate_with_a_tiny_llama_uses_the_processor():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    model = LlamaForCausalLM(config).eval()
    prompt = torch.tensor([[1, 5, 9, 2]])
    out = model.generate(
        prompt, do_sample=True, max_new_tokens=6, logits_processor=LogitsProcessorList([TopK(5)]),
        top_k=None, top_p=None, temperature=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True,
    )
    assert out.sequences.shape == (1, 10)
    for step, logits in enumerate(out.logits):  # the model's raw logits at each step
        token = out.sequences[0, 4 + step]
        assert token in torch.topk(logits[0], 5).indices


# ---------------------------------------------------------------- validation and purity


BAD_ARGUMENTS = [
    (top_k, (0,), "k"), (top_k, (-1,), "k"), (top_k, (2.0,), "k"), (top_k, (True,), "k"), (top_k, ("3",), "k"),
    (top_p, (0.0,), "p"), (top_p, (-0.1,), "p"), (top_p, (1.5,), "p"), (top_p, (math.nan,), "p"), (top_p, (True,), "p"),
    (top_p, (None,), "p"), (top_p, (0.9, 0), "min_tokens_to_keep"), (top_p, (0.9, 1.0), "min_tokens_to_keep"),
    (top_p, (0.9, True), "min_tokens_to_keep"), (min_p, (-0.1,), "p"), (min_p, (1.01,), "p"), (min_p, (math.nan,), "p"),
    (min_p, (0.1, -2), "min_tokens_to_keep"), (typical, (0.0,), "mass"), (typical, (1.5,), "mass"),
    (typical, (math.inf,), "mass"), (typical, (0.9, 0), "min_tokens_to_keep"),
]


@pytest.mark.parametrize("rule, args, name", BAD_ARGUMENTS)
def test_bad_truncation_arguments_raise(rule, args, name):
    with pytest.raises(ValueError, match=rf"^{name} must"):
        rule(torch.zeros(2, 5), *args)


PREV = torch.zeros(2, 3, dtype=torch.long)
BAD_PENALTIES = [
    (repetition_penalty, (PREV, 0.0), "penalty"), (repetition_penalty, (PREV, -1.0), "penalty"),
    (repetition_penalty, (PREV, math.inf), "penalty"), (repetition_penalty, (PREV, math.nan), "penalty"),
    (repetition_penalty, (PREV, True), "penalty"), (presence_penalty, (PREV, math.inf), "penalty"),
    (presence_penalty, (PREV, -math.inf), "penalty"), (frequency_penalty, (PREV, math.nan), "penalty"),
    (frequency_penalty, (PREV, "0.5"), "penalty"), (frequency_penalty, (PREV.float(), 0.5), "prev_tokens"),
    (frequency_penalty, (PREV.int(), 0.5), "prev_tokens"), (presence_penalty, ([[0, 1]], 0.5), "prev_tokens"),
    (presence_penalty, (PREV[:1], 0.5), "prev_tokens"), (presence_penalty, (PREV[0], 0.5), "prev_tokens"),
    (repetition_penalty, (PREV, 1.2, 1.5), "pad_token_id"), (frequency_penalty, (PREV, 0.5, True), "pad_token_id"),
]


@pytest.mark.parametrize("rule, args, name", BAD_PENALTIES)
def test_bad_penalty_arguments_raise(rule, args, name):
    with pytest.raises(ValueError, match=rf"^{name} "):
        rule(torch.zeros(2, 5), *args)


@pytest.mark.parametrize("rule, args", [
    (top_k, (2,)), (top_p, (0.5,)), (min_p, (0.1,)), (typical, (0.5,)),
    (repetition_penalty, (PREV, 1.2)), (presence_penalty, (PREV, 0.5)), (frequency_penalty, (PREV, 0.5)),
])
@pytest.mark.parametrize("bad", ["nan", "+inf", "all -inf", "int", "list"])
def test_bad_logits_raise(rule, args, bad):
    logits = {"nan": torch.tensor([[0.0, math.nan]] * 2), "+inf": torch.tensor([[0.0, INF]] * 2),
              "all -inf": torch.tensor([[0.0, 1.0], [-INF, -INF]]), "int": torch.zeros(2, 2, dtype=torch.long),
              "list": [[0.0, 1.0]] * 2}[bad]
    with pytest.raises(ValueError, match="logits"):
        rule(logits, *args)


@pytest.mark.parametrize("make", [
    lambda: TopK(0), lambda: TopK(1.5), lambda: TopP(0.0), lambda: TopP(2), lambda: TopP(0.5, 0),
    lambda: MinP(-0.5), lambda: MinP(0.1, min_tokens_to_keep=0), lambda: Typical(0), lambda: Typical(1.1),
    lambda: RepetitionPenalty(0), lambda: RepetitionPenalty(math.inf), lambda: PresencePenalty(math.nan),
    lambda: PresencePenalty(0.5, prompt_length=-1), lambda: FrequencyPenalty(0.5, prompt_length=1.5),
    lambda: FrequencyPenalty(0.5, pad_token_id="0"),
])
def test_classes_validate_in_init(make):
    with pytest.raises(ValueError, match="must"):
        make()


@pytest.mark.parametrize("rule, args", [
    (top_k, (3,)), (top_p, (0.7,)), (top_p, (1.0,)), (min_p, (0.2,)), (typical, (0.7,)), (typical, (1.0,)),
    (repetition_penalty, (PREV, 1.5)), (presence_penalty, (PREV, 0.5)), (frequency_penalty, (PREV, 0.5)),
])
def test_inputs_are_not_modified(rule, args):
    logits = random_logits(8, 2, 2000, 3.0)
    before = logits.clone()
    prev_before = PREV.clone()
    out = rule(logits, *args)
    assert torch.equal(logits, before) and torch.equal(PREV, prev_before)
    assert out.data_ptr() != logits.data_ptr()
