"""Bad (and unusual but legitimate) inputs to the public API of probs, sampling, processors,
penalties and best_of_n: each bad argument raises a ValueError naming the argument as the
caller typed it; nothing returns NaN or inf, or a stack trace from inside torch."""

import ast
import math
import pathlib
import re

import numpy as np
import pytest
import torch

import logitlab as ll
from logitlab.sampling import penalties, truncation as processors
from logitlab._validate import check_int, check_number, check_temperature
from logitlab.search.best_of_n import select_best
from logitlab.sampling.pipeline import SamplingConfig, next_token, process_logits

INF = float("inf")
LOGITS = torch.tensor([[1.0, 3.0, 2.0, -INF]])


def finite_or_neginf(t: torch.Tensor) -> bool:
    return not bool((torch.isnan(t) | (t == INF)).any())


# ---------------------------------------------------------------- numbers: one set of checkers


def test_checkers_accept_numpy_numbers_and_return_python_ones():
    unit = "a number in (0, 1]", lambda v: 0 < v <= 1
    for value in (np.float32(0.5), np.float64(0.5), np.float16(0.5), 0.5, 1):
        out = check_number(value, "p", *unit)
        assert type(out) is float and out == float(value)
    for value in (np.int64(3), np.int32(3), np.uint8(3), 3):
        out = check_int(value, "k", minimum=1)
        assert type(out) is int and out == 3


@pytest.mark.parametrize("value", [True, np.bool_(True), math.nan, np.float32("nan"), "0.5", None, 1j, torch.tensor(0.5)])
def test_check_number_refuses_what_is_not_a_real_number(value):
    with pytest.raises(ValueError, match=r"^p must be a number in \(0, 1\], got"):
        check_number(value, "p", "a number in (0, 1]", lambda v: 0 < v <= 1)


@pytest.mark.parametrize("value", [True, 2.0, np.float64(2.0), 0, "2", None])
def test_check_int_refuses_bools_floats_and_too_small(value):
    with pytest.raises(ValueError, match=r"^k must be an integer >= 1, got"):
        check_int(value, "k", minimum=1)


def test_an_int_too_large_for_a_float_is_out_of_range_not_an_overflow_error():
    with pytest.raises(ValueError, match="^temperature must be a finite number"):
        check_temperature(10**400)
    with pytest.raises(ValueError, match="^temperature"):
        ll.softmax(LOGITS, temperature=10**400)


@pytest.mark.parametrize("temperature", [np.float32(0.7), np.float64(0.7), np.int64(2), 2])
def test_numpy_and_int_temperatures_work_everywhere(temperature):
    t = float(temperature)
    assert torch.equal(ll.apply_temperature(LOGITS, temperature), ll.apply_temperature(LOGITS, t))
    assert torch.equal(ll.softmax(LOGITS, temperature), ll.softmax(LOGITS, t))
    assert torch.equal(ll.log_softmax(LOGITS, temperature), ll.log_softmax(LOGITS, t))
    for sampler in (ll.sample, ll.gumbel_max):
        a = sampler(LOGITS.expand(50, -1), temperature, torch.Generator().manual_seed(0))
        b = sampler(LOGITS.expand(50, -1), t, torch.Generator().manual_seed(0))
        assert torch.equal(a, b)


# ---------------------------------------------------------------- temperature overflow


@pytest.mark.parametrize("logits, temperature", [
    (torch.tensor([[1.0, 3.0, 2.0, -INF]]), 1e-39),  # 3 / 1e-39 is inf in float32
    (torch.tensor([[-1.0, -3.0, -2.0, -INF]]), 1e-39),  # the row's maximum overflows to -inf
    (torch.tensor([[1.0, 3.0, 2.0, -INF]]), 1e-46),  # T itself is 0 in float32: 0 / 0 was NaN
    (torch.tensor([[0.0, -3.0, -2.0, -INF]]), 5e-324),
    (torch.tensor([[1.0, 3.0, 2.0, -INF]], dtype=torch.float64), 5e-324),
    (torch.tensor([[10.0, 9.0, 8.0, -INF]]).half(), 1e-4),
    (torch.tensor([[60000.0, 1.0, 0.0, -INF]]).half(), 0.5),  # not even a small temperature
    (torch.tensor([[1.0, 3.0, 2.0, -INF]]).bfloat16(), 1e-39),
])
def test_a_temperature_that_overflows_the_division_tends_to_greedy(logits, temperature):
    one_hot = torch.zeros_like(logits)
    one_hot[0, logits[0].float().argmax()] = 1
    scaled = ll.apply_temperature(logits, temperature)
    assert finite_or_neginf(scaled) and scaled.max() == 0 and torch.isneginf(scaled[0, 3])
    assert torch.equal(ll.softmax(logits, temperature), one_hot)
    logp = ll.log_softmax(logits, temperature)
    assert finite_or_neginf(logp) and torch.equal(logp.exp(), one_hot)
    assert ll.entropy(ll.softmax(logits, temperature).float()).item() == 0
    assert ll.kl(one_hot.float(), ll.softmax(logits, temperature).float()).item() == 0
    assert ll.tv_distance(one_hot.float(), ll.softmax(logits, temperature).float()).item() == 0
    for sampler in (ll.sample, ll.gumbel_max):
        tokens = sampler(logits.expand(200, -1), temperature, torch.Generator().manual_seed(0))
        assert (tokens == logits[0].float().argmax()).all()


def test_tiny_temperature_splits_ties_evenly_as_the_limit_does():
    logits = torch.tensor([[5.0, 1.0, 5.0]])
    assert torch.equal(ll.softmax(logits, 1e-39), torch.tensor([[0.5, 0.0, 0.5]]))
    assert torch.equal(ll.softmax(logits - 5, 1e-46), torch.tensor([[0.5, 0.0, 0.5]]))  # 0 / 0 at the ties
    assert torch.equal(ll.softmax(torch.zeros(1, 1), 1e-46), torch.ones(1, 1))
    for sampler in (ll.sample, ll.gumbel_max):
        counts = sampler(logits.expand(4000, -1), 1e-39, torch.Generator().manual_seed(1)).bincount(minlength=3)
        assert counts[1] == 0 and 1800 < counts[0] < 2200


def test_temperature_without_overflow_is_still_a_plain_division():
    logits = torch.tensor([[2.0, 1.0, -INF], [-40.0, 0.5, 3.0]])
    for t in (1e-30, 0.01, 0.5, 3.0):
        assert torch.equal(ll.apply_temperature(logits, t), logits / t)


def test_distributions_on_different_devices_name_the_argument():
    p = torch.tensor([[0.5, 0.5]])
    elsewhere = torch.tensor([[0.25, 0.75]], device="meta")
    for distance in (ll.kl, ll.tv_distance):
        with pytest.raises(ValueError, match="^q is on meta but p is on cpu"):
            distance(p, elsewhere)
        with pytest.raises(ValueError, match="^q must be"):
            distance(p, [[0.5, 0.5]])


# ---------------------------------------------------------------- processors and penalties

PREV = torch.tensor([[1, 2, 2]])


def test_truncation_and_penalties_take_numpy_numbers():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert torch.equal(processors.top_k(logits, np.int64(2)), processors.top_k(logits, 2))
    assert torch.equal(processors.top_p(logits, np.float32(0.5), np.int32(2)), processors.top_p(logits, 0.5, 2))
    assert torch.equal(processors.min_p(logits, np.float64(0.2)), processors.min_p(logits, 0.2))
    assert torch.equal(processors.typical(logits, np.float32(0.5)), processors.typical(logits, float(np.float32(0.5))))
    assert repr(processors.TopK(np.int64(2))) == "TopK(k=2)"
    assert repr(processors.TopP(np.float64(0.5), np.int64(2))) == "TopP(p=0.5, min_tokens_to_keep=2)"
    for rule in (penalties.repetition_penalty, penalties.presence_penalty, penalties.frequency_penalty):
        assert torch.equal(rule(logits, PREV, np.float32(1.5), np.int64(3)), rule(logits, PREV, 1.5, 3))
    assert repr(penalties.PresencePenalty(np.float64(0.5), np.int64(1))) == (
        "PresencePenalty(penalty=0.5, prompt_length=1, pad_token_id=None)")


HF_CLASSES = [processors.TopK(2), processors.TopP(0.5), processors.MinP(0.1), processors.Typical(0.5),
              penalties.RepetitionPenalty(1.2), penalties.PresencePenalty(0.5, 1), penalties.FrequencyPenalty(0.5)]


@pytest.mark.parametrize("processor", HF_CLASSES, ids=lambda p: type(p).__name__)
@pytest.mark.parametrize("scores", [torch.zeros(1, 3, dtype=torch.long), torch.tensor([[0.0, math.nan, 1.0]]),
                                    torch.tensor([[-INF, -INF, -INF]]), [[0.0, 1.0, 2.0]]],
                         ids=["int", "nan", "all -inf", "list"])
def test_hugging_face_processors_name_scores(processor, scores):
    with pytest.raises(ValueError, match="^scores "):
        processor(torch.tensor([[0, 1]]), scores)


@pytest.mark.parametrize("processor", HF_CLASSES[4:], ids=lambda p: type(p).__name__)
@pytest.mark.parametrize("input_ids", [torch.tensor([[0.0, 1.0]]), torch.tensor([0, 1]), [[0, 1]],
                                       torch.tensor([[0, 1], [1, 2]])], ids=["float", "1-D", "list", "batch of 2"])
def test_hugging_face_penalties_name_input_ids(processor, input_ids):
    with pytest.raises(ValueError, match="^input_ids "):
        processor(input_ids, torch.zeros(1, 3))


@pytest.mark.parametrize("rule, penalty, logits", [
    (penalties.repetition_penalty, 1e-39, torch.tensor([[1.0, 3.0, 2.0]])),  # 3 / 1e-39 is inf
    (penalties.repetition_penalty, 1e38, torch.tensor([[1.0, -4.0, 2.0]])),  # -4e38 is -inf
    (penalties.repetition_penalty, 1e-5, torch.tensor([[1.0, 3.0, 2.0]]).half()),
    (penalties.presence_penalty, 1e5, torch.tensor([[1.0, 3.0, 2.0]]).half()),  # past -65504
    (penalties.presence_penalty, -1e5, torch.tensor([[1.0, 3.0, 2.0]]).half()),
    (penalties.frequency_penalty, 4e4, torch.tensor([[1.0, 3.0, 2.0]]).half()),  # 2 counts: -8e4
    (penalties.frequency_penalty, -1e308, torch.tensor([[1.0, 2.0, -INF]], dtype=torch.float64)),  # -inf + inf
])
def test_a_penalty_that_overflows_the_logits_raises(rule, penalty, logits):
    with pytest.raises(ValueError, match="^" + re.escape(f"penalty={penalty!r} pushes a penalised logit beyond the range")):
        rule(logits, PREV, penalty)


def test_large_penalties_that_fit_the_dtype_work():
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    assert torch.allclose(penalties.repetition_penalty(logits, PREV, 1e-30), torch.tensor([[1.0, 3e30, 2e30]]))
    assert torch.equal(penalties.presence_penalty(logits, PREV, 1e5), torch.tensor([[1.0, 3.0 - 1e5, 2.0 - 1e5]]))
    assert torch.equal(penalties.frequency_penalty(logits.half(), PREV, 2e4)[0, 1], torch.tensor(3.0 - 2e4).half())
    removed = torch.tensor([[1.0, -INF, -3.0]])  # a removed token stays removed
    assert torch.isneginf(penalties.repetition_penalty(removed, PREV, 1e-39)[0, 1])


def test_apply_penalties_is_the_three_in_order_and_names_samplingconfigs_fields():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 20, generator=gen)
    context = torch.randint(0, 20, (2, 12), generator=gen)
    output = context[:, 8:]
    expected = penalties.repetition_penalty(logits, context, 1.3)
    expected = penalties.frequency_penalty(penalties.presence_penalty(expected, output, 0.4), output, 0.2)
    got = penalties.apply_penalties(logits, context, output, repetition_penalty=1.3, presence_penalty=0.4,
                                    frequency_penalty=0.2)
    assert torch.equal(got, expected)
    assert torch.equal(penalties.apply_penalties(logits, context, output, repetition_penalty=1.0), logits)
    assert torch.equal(penalties.apply_penalties(logits, presence_penalty=0.5), logits)  # no tokens yet
    for kwargs, name in [
        (dict(repetition_penalty=0.0), "repetition_penalty"), (dict(presence_penalty=math.nan), "presence_penalty"),
        (dict(frequency_penalty=True), "frequency_penalty"), (dict(repetition_penalty=1e-39), "repetition_penalty"),
        (dict(context=context.float()), "context"), (dict(output=output[:1]), "output"),
        (dict(context=context[0]), "context"), (dict(output=output.to("meta")), "output"),
    ]:
        kwargs = {"context": context, "output": output, **kwargs}
        with pytest.raises(ValueError, match=f"^{name}"):
            penalties.apply_penalties(logits, **kwargs)


def test_penalties_tokens_on_another_device_name_the_argument():
    with pytest.raises(ValueError, match="^prev_tokens is on meta but logits is on cpu"):
        penalties.frequency_penalty(torch.zeros(1, 3), PREV.to("meta"), 0.5)


def test_no_module_here_imports_a_private_name_from_another():
    package = pathlib.Path(ll.__file__).parent
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.relative_to(package)} imports {private} from {node.module}"


# ---------------------------------------------------------------- sampling


def test_gumbel_max_keeps_its_noise_on_large_logits():
    # 1e8 + noise rounds to 1e8 in float32: without measuring from the row maximum every tie
    # went to token 0.
    for logits in (torch.tensor([[1e8, 1e8]]), torch.tensor([[1e39, 1e39]], dtype=torch.float64)):
        counts = ll.gumbel_max(logits.expand(4000, -1), generator=torch.Generator().manual_seed(2)).bincount()
        assert 1800 < counts[0] < 2200


def test_float64_logits_beyond_float32_are_sampled_not_refused():
    logits = torch.tensor([[1e39, 0.0, -1e39]], dtype=torch.float64)
    for sampler in (ll.sample, ll.gumbel_max):
        assert sampler(logits).item() == 0
        assert sampler(-logits).item() == 2


# ---------------------------------------------------------------- SamplingConfig and next_token


def test_sampling_config_takes_numpy_numbers_and_keeps_python_ones():
    config = SamplingConfig(temperature=np.float64(0.7), top_k=np.int64(50), top_p=np.float32(0.5),
                            min_p=np.float64(0.05), typical_p=np.float64(0.9), repetition_penalty=np.float64(1.2),
                            presence_penalty=np.int64(1), frequency_penalty=np.float16(0.5))
    assert config == SamplingConfig(temperature=0.7, top_k=50, top_p=float(np.float32(0.5)), min_p=0.05,
                                    typical_p=0.9, repetition_penalty=1.2, presence_penalty=1.0, frequency_penalty=0.5)
    assert type(config.top_k) is int and type(config.temperature) is float and type(config.presence_penalty) is float
    logits = torch.randn(3, 100, generator=torch.Generator().manual_seed(0))
    tokens, _ = next_token(logits, config, generator=torch.Generator().manual_seed(1))
    plain = SamplingConfig(temperature=0.7, top_k=50, top_p=float(np.float32(0.5)), min_p=0.05, typical_p=0.9,
                           repetition_penalty=1.2, presence_penalty=1, frequency_penalty=0.5)
    assert torch.equal(tokens, next_token(logits, plain, generator=torch.Generator().manual_seed(1))[0])
    out = ll.generate(ll.toy_bigram(), [[1]], max_new_tokens=3, temperature=np.float32(0.7), top_k=np.int64(3),
                      generator=torch.Generator().manual_seed(0))
    same = ll.generate(ll.toy_bigram(), [[1]], max_new_tokens=3, temperature=float(np.float32(0.7)), top_k=3,
                       generator=torch.Generator().manual_seed(0))
    assert torch.equal(out.sequences[0], same.sequences[0])


@pytest.mark.parametrize("field, value", [
    ("temperature", True), ("temperature", np.float32("nan")), ("top_k", True), ("top_k", 2.0), ("top_k", np.float64(2)),
    ("top_p", np.float64(1.5)), ("top_p", False), ("min_p", "0.1"), ("typical_p", 0), ("repetition_penalty", 0),
    ("presence_penalty", math.inf), ("frequency_penalty", True),
])
def test_sampling_config_names_the_bad_field(field, value):
    with pytest.raises(ValueError, match=f"^{field} must be"):
        SamplingConfig(**{field: value})


@pytest.mark.parametrize("config", [None, {"temperature": 0.7}, 0.7, "greedy"])
def test_next_token_and_process_logits_want_a_sampling_config(config):
    for function in (next_token, process_logits):
        with pytest.raises(ValueError, match="^config must be a SamplingConfig"):
            function(LOGITS, config)


def test_process_logits_names_context_and_output():
    logits = torch.randn(2, 10)
    config = SamplingConfig(repetition_penalty=1.2, presence_penalty=0.5)
    good = torch.zeros(2, 3, dtype=torch.long)
    for kwargs, name in [(dict(context=good.float()), "context"), (dict(context=good[:1]), "context"),
                         (dict(output=[[0, 1], [1, 2]]), "output"), (dict(output=good[0]), "output")]:
        for function in (next_token, process_logits):
            with pytest.raises(ValueError, match=f"^{name} "):
                function(logits, config, **kwargs)


def test_an_overflowing_penalty_in_a_config_is_named_as_the_config_names_it():
    with pytest.raises(ValueError, match="^repetition_penalty=1e-39 pushes"):
        next_token(torch.tensor([[1.0, 3.0, 2.0]]), SamplingConfig(repetition_penalty=1e-39), context=PREV)
    with pytest.raises(ValueError, match="^presence_penalty=100000.0 pushes"):
        process_logits(torch.tensor([[1.0, 3.0, 2.0]]).half(), SamplingConfig(presence_penalty=1e5), output=PREV)


@pytest.mark.parametrize("shape", [(7,), (2, 3, 7)])
def test_penalties_with_no_tokens_yet_work_for_any_leading_dims(shape):
    # Without context the penalties once made a [shape[0], 0] tensor: wrong unless 2-D.
    logits = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    config = SamplingConfig(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.5, top_k=3)
    tokens, processed = next_token(logits, config)
    assert tokens.shape == shape[:-1] and torch.equal(processed, process_logits(logits, config))


@pytest.mark.parametrize("logits, temperature", [(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 1e-39),
                                                 (torch.tensor([[10.0, 9.0, 8.0, 0.0]]).half(), 1e-4)])
def test_next_token_at_a_tiny_temperature_is_greedy(logits, temperature):
    for config in (SamplingConfig(temperature=temperature), SamplingConfig(temperature=temperature, top_p=0.9),
                   SamplingConfig(temperature=temperature, top_k=2, min_p=0.1, typical_p=0.9)):
        tokens, processed = next_token(logits.expand(100, -1), config, generator=torch.Generator().manual_seed(0))
        assert (tokens == logits[0].float().argmax()).all()
        assert finite_or_neginf(processed)


# ---------------------------------------------------------------- best-of-N


def run_best_of_n(**kwargs):
    return ll.best_of_n(ll.toy_bigram(vocab_size=5, seed=2), [[1]], max_new_tokens=3, eos_token_id=[],
                        generator=torch.Generator().manual_seed(0), **kwargs)


@pytest.mark.parametrize("nan_row", [0, 1, 2])
def test_best_of_n_never_picks_a_nan_score(nan_row):
    scores = torch.tensor([0.0, 1.0, 2.0])
    scores[nan_row] = math.nan
    with pytest.raises(ValueError, match=rf"^score\(result\) is NaN at rows \[{nan_row}\]"):
        run_best_of_n(n=3, score=lambda result: scores)
    result = run_best_of_n(n=3).result
    with pytest.raises(ValueError, match=rf"^scores is NaN at rows \[{nan_row}\]"):
        select_best(result, scores)


def test_minus_inf_ranks_a_sample_last():
    out = run_best_of_n(n=3, score=lambda result: torch.tensor([-INF, -5.0, -INF]))
    assert out.best_rows == [1]
    assert select_best(out.result, torch.tensor([-INF, -INF, -INF])) == [0]  # a tie: the first


@pytest.mark.parametrize("scores", [[0.0, 1.0, 2.0], torch.zeros(3, 1), torch.zeros(2), torch.zeros(3, dtype=torch.complex64)],
                         ids=["list", "[3, 1]", "[2]", "complex"])
def test_scores_must_be_one_real_number_per_row(scores):
    with pytest.raises(ValueError, match=r"^score\(result\) must be a real tensor of shape \[3\]"):
        run_best_of_n(n=3, score=lambda result: scores)


def test_best_of_n_takes_a_numpy_n_and_refuses_a_bool():
    assert len(run_best_of_n(n=np.int64(2)).result.new_tokens) == 2
    for n in (True, 2.0):
        with pytest.raises(ValueError, match="^n must be an integer >= 1"):
            run_best_of_n(n=n)
