"""The decoding loop: prefill once, then one token at a time with the model's KV cache.

Chapter 3 ("Repetition and stopping") explains this module; chapter 2 uses it for every
generation it shows.

``generate`` works with any Hugging Face causal LM and with the book's toy models:

1. **Prefill.** One forward pass over the whole prompt fills the KV cache (the keys and values
   of every layer at every position) and gives the logits of the first new token. With
   ``num_return_sequences=N`` the cache is then copied N times in the batch dimension: the N
   samples share one prefill instead of computing the prompt N times.
2. **Decode.** Each step chooses one token per sequence (``sampling.next_token``: penalties,
   temperature, truncation, then a draw) and feeds only that token to the model, which reads
   the past from the cache.
3. **Stop.** A sequence finishes on an end-of-sequence token (impossible before
   ``min_new_tokens``), on a stop string (also one that spans several tokens; its text is cut
   before the stop string), or after ``max_new_tokens``. Finished sequences are removed from
   the batch and from the cache, so they stop costing compute.

Several prompts of different lengths are left-padded: the padding is masked out of attention
and the position ids count only real tokens, so every row computes what it would alone.
"""

from __future__ import annotations

import torch

from .._validate import bad_logits, check_counts, check_generator, check_logits, check_model, check_processors, trusted
from ..constrained.constraint import advance_rows, constraint_rows, mask_rows
from ..devices import model_device, now
from ..sampling.pipeline import SamplingConfig, next_token
from .passes import forward, prefill
from .prompts import eos_ids, prompt_batch
from .result import GenerationResult, decode_texts, token_logprobs


@torch.inference_mode()
def generate(
    model,
    input_ids,
    *,
    max_new_tokens: int,
    min_new_tokens: int = 0,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    typical_p: float | None = None,
    repetition_penalty: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    top_h: float | None = None,
    top_n_sigma: float | None = None,
    epsilon_cutoff: float | None = None,
    eta_cutoff: float | None = None,
    eos_token_id=None,
    stop=None,
    tokenizer=None,
    num_return_sequences: int = 1,
    generator: torch.Generator | None = None,
    attention_mask: torch.Tensor | None = None,
    config: SamplingConfig | None = None,
    constraint=None,
    logits_processor=None,
) -> GenerationResult:
    """Generate up to ``max_new_tokens`` tokens after each prompt.

    ``input_ids`` is a LongTensor ``[batch, seq]`` (left-padded, with ``attention_mask``, when
    the prompts differ in length), a list of token-id lists of any lengths, or, with a
    ``tokenizer``, a string or a list of strings. The sampling settings are the keyword
    arguments or a ``SamplingConfig`` (``config=``), not both. ``eos_token_id`` is an id or a
    list of ids; ``None`` takes the model's ``generation_config`` (pass ``[]`` for none).
    ``stop`` is a string or a list of strings and needs ``tokenizer``. ``constraint`` is a
    ``logitlab.Constraint`` (every output must match its pattern) or a list with one per prompt
    (None for none); each output then matches its pattern when it ends on EOS, and within
    ``max_new_tokens`` in any case (tokens after which no match fits are masked too).
    ``logits_processor`` is a list of Hugging Face-style processors, each called as
    ``(tokens, logits)`` with every row's tokens so far (prompt first, padding as -1) before
    the sampling settings apply: ``ll.sampling.ngram_rules.DRY(0.8)``, ``ll.sampling.adaptive.Mirostat(5.0)``, ...
    """
    config = _merge_config(config, dict(
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
        repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty, top_h=top_h, top_n_sigma=top_n_sigma, epsilon_cutoff=epsilon_cutoff,
        eta_cutoff=eta_cutoff))
    max_new_tokens, min_new_tokens, n = check_counts(max_new_tokens, min_new_tokens, num_return_sequences)
    stops = _stop_strings(stop, tokenizer)
    check_model(model)
    eos = eos_ids(eos_token_id, model)
    ids, mask = prompt_batch(input_ids, attention_mask, tokenizer, model)
    device = model_device(model)
    check_generator(generator, device)
    began = now(device)
    state, cache, logits = _prefill(model, ids, mask, n, max_new_tokens)
    state.constraints = constraint_rows(constraint, len(ids), n, max_new_tokens)
    state.processors = check_processors(logits_processor)
    prefill_seconds = now(device) - began
    _decode(model, state, cache, logits, config, generator, eos, min_new_tokens, stops, tokenizer)
    return state.result(tokenizer, n, prefill_seconds, now(device) - began)


def _prefill(model, ids, mask, n: int, max_new_tokens: int):
    """1. One forward pass over the prompts (position ids skip the left padding), copied for
    ``n`` samples per prompt. Returns the rows' state, the KV cache and the next logits."""
    step = prefill(model, ids, mask)
    cache, logits = step.cache, step.logits[:, -1]
    # N samples per prompt share the prefill: copy the cache and the logits, not the computation.
    if n > 1:
        cache.batch_repeat_interleave(n)
        logits, ids, mask = (t.repeat_interleave(n, dim=0) for t in (logits, ids, mask))
    return _Rows(ids, mask, max_new_tokens), cache, logits


def _decode(model, state, cache, logits, config, generator, eos, min_new_tokens, stops, tokenizer) -> None:
    """2. One token per active row per step, until every row has finished."""
    device, max_new_tokens = logits.device, state.max_new_tokens
    eos_tensor = torch.tensor(eos, dtype=torch.long, device=device)
    for index in range(max_new_tokens):
        start = now(device)
        with trusted():  # `allowed` is checked once, by `finish`, in the step's one read
            allowed = logits
            if index < min_new_tokens and eos:
                allowed = logits.index_fill(-1, eos_tensor, float("-inf"))  # EOS impossible for now
            if state.constraints:
                allowed = state.constrain(allowed, max_new_tokens - index)
            for processor in state.processors:
                allowed = processor(state.tokens_so_far(), allowed)
            tokens = state.choose(logits, allowed, config, generator)
        all_done, keep = state.finish(tokens, allowed, eos_tensor, stops, tokenizer, last=index == max_new_tokens - 1)
        if all_done:
            state.step_seconds.append(now(device) - start)
            return
        if keep is not None:  # drop finished rows from the batch and the cache
            cache.batch_select_indices(keep)
            state.keep(keep)
            tokens = tokens[keep]
        mask = state.mask = torch.cat([state.mask, state.mask.new_ones(len(tokens), 1)], dim=1)
        step = forward(model, input_ids=tokens[:, None], attention_mask=mask, cache=cache, logits_to_keep=1,
                       position_ids=mask.sum(dim=-1, keepdim=True) - 1)
        cache, logits = step.cache, step.logits[:, -1]
        state.model_calls += 1
        state.step_seconds.append(now(device) - start)


def _merge_config(config, settings: dict) -> SamplingConfig:
    """The sampling settings as keyword arguments or as ``config=``, not both."""
    if config is None:
        return SamplingConfig(**settings)
    if not isinstance(config, SamplingConfig):
        raise ValueError(f"config must be a SamplingConfig or None, got {type(config).__name__}")
    if settings != SamplingConfig().__dict__:
        raise ValueError("pass the sampling settings either as keyword arguments or as config=, not both")
    return config


class _Rows:
    """The rows of one ``generate`` call: their tokens so far, log-probabilities and endings.

    ``active`` holds the original index of every row still in the batch; finished rows leave it.
    """

    def __init__(self, ids, mask, max_new_tokens):
        rows, self.max_new_tokens = ids.shape[0], max_new_tokens
        self.context = ids.masked_fill(mask == 0, -1)  # padding is -1, which the penalties ignore
        self.mask = mask
        # Tokens and log-probabilities, one column per step, in buffers that double when full
        # (not one of max_new_tokens columns: that may be far more than is ever generated).
        self.steps = 0
        self.output = ids.new_full((rows, min(max_new_tokens, 64)), -1)
        self.sampled_lp = torch.zeros(self.output.shape, device=ids.device)
        self.raw_lp = torch.zeros(self.output.shape, device=ids.device)
        self.lengths, self.reasons, self.texts = [max_new_tokens] * rows, ["length"] * rows, [None] * rows
        self.active = torch.arange(rows, device=ids.device)
        self.model_calls, self.step_seconds = 1, []
        self.constraints, self.automaton = None, [0] * rows  # each row's Constraint and its state
        self.processors = []

    def tokens_so_far(self) -> torch.Tensor:
        """``[active rows, seq]``: each active row's prompt (padding -1) and new tokens."""
        return torch.cat([self.context[self.active], self.output[self.active, : self.steps]], dim=1)

    def constrain(self, allowed, tokens_left: int):
        """Mask what each active row's constraint forbids in its current state."""
        rows = self.active.tolist()
        allowed = mask_rows([self.constraints[r] for r in rows], [self.automaton[r] for r in rows], allowed,
                            tokens_left)
        if bool(torch.isinf(allowed).all(dim=-1).any()):
            raise ValueError("the constraint leaves no token to choose: min_new_tokens forbids EOS where the "
                             "pattern allows nothing else")
        return allowed

    def choose(self, logits, allowed, config, generator):
        """Choose each active row's next token from ``allowed`` (the logits with the tokens that
        are not allowed yet at -inf) and record it with its log-probabilities: under the sampled
        distribution, and under the model's own (``logits``)."""
        if self.steps == self.output.shape[1]:
            self._grow()
        so_far = self.output[self.active, : self.steps]
        # The penalties' histories are built only when a penalty will read them.
        context = torch.cat([self.context[self.active], so_far], dim=1) if config.repetition_penalty else None
        output = so_far if config.presence_penalty or config.frequency_penalty else None
        tokens, processed = next_token(allowed, config, context, output, generator)
        self.output[self.active, self.steps] = tokens
        if self.constraints:
            rows = self.active.tolist()
            moved = advance_rows([self.constraints[r] for r in rows], [self.automaton[r] for r in rows], tokens)
            for r, automaton_state in zip(rows, moved):
                self.automaton[r] = automaton_state
        self.raw_lp[self.active, self.steps] = token_logprobs(logits, tokens)
        if config.temperature > 0:  # greedy picks its token with probability 1: log-prob 0
            self.sampled_lp[self.active, self.steps] = token_logprobs(processed, tokens)
        self.steps += 1
        return tokens

    def _grow(self):
        more = min(self.output.shape[1], self.max_new_tokens - self.output.shape[1])
        self.output = torch.cat([self.output, torch.full_like(self.output[:, :more], -1)], dim=1)
        self.raw_lp = torch.cat([self.raw_lp, torch.zeros_like(self.raw_lp[:, :more])], dim=1)
        self.sampled_lp = torch.cat([self.sampled_lp, torch.zeros_like(self.sampled_lp[:, :more])], dim=1)

    def finish(self, tokens, allowed, eos_tensor, stops, tokenizer, last: bool):
        """Which active rows end with this token (EOS or a stop string). Returns ``(all_done,
        keep)``: ``keep`` holds the positions of the rows that go on, None when every row does.
        ``allowed``, the logits the tokens were chosen from, is checked here, in the same read."""
        finished = torch.isin(tokens, eos_tensor)
        step = self.steps
        if stops:
            for i, row in enumerate(self.active.tolist()):
                # Decode all the new tokens, not just the last one: a stop string can span
                # several tokens, or begin in the middle of one.
                text = tokenizer.decode(self.output[row, :step].tolist(), skip_special_tokens=True)
                cut = find_stop(text, stops)
                if cut >= 0 and not finished[i]:
                    self.lengths[row], self.reasons[row], self.texts[row] = step, "stop", text[:cut]
                    finished[i] = True
        done, invalid = torch.stack([finished.any(), bad_logits(allowed)]).tolist()  # the step's one host read
        if invalid:
            check_logits(allowed)  # raises, saying what is wrong (NaN, +inf, a row of all -inf)
        if not last and not done:
            return False, None
        for row in self.active[finished & torch.isin(tokens, eos_tensor)].tolist():
            self.lengths[row], self.reasons[row] = step, "eos"
        keep = (~finished).nonzero().squeeze(-1)
        return last or len(keep) == 0, keep

    def keep(self, keep):
        self.active, self.mask = self.active[keep], self.mask[keep]

    def result(self, tokenizer, n, prefill_seconds, seconds) -> GenerationResult:
        rows = len(self.output)
        new = [self.output[r, : self.lengths[r]] for r in range(rows)]
        prompts = [row[row >= 0] for row in self.context]  # each prompt without its padding
        texts = decode_texts(tokenizer, new)
        if texts is not None:
            texts = [t if t is not None else d for t, d in zip(self.texts, texts)]
        return GenerationResult(
            sequences=[torch.cat([p, t]) for p, t in zip(prompts, new)], new_tokens=new,
            logprobs=[self.sampled_lp[r, : self.lengths[r]] for r in range(rows)],
            raw_logprobs=[self.raw_lp[r, : self.lengths[r]] for r in range(rows)],
            finish_reasons=self.reasons, texts=texts, prompt_index=[r // n for r in range(rows)],
            model_calls=self.model_calls, seconds=seconds, prefill_seconds=prefill_seconds,
            step_seconds=self.step_seconds)


def find_stop(text: str, stops: list[str]) -> int:
    """Where the earliest stop string starts in ``text``, or -1 if none occurs.

    The earliest start wins, whichever stop string it belongs to, so the text that is kept
    (``text[:index]``) contains no stop string at all.
    """
    starts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(starts, default=-1)


def _stop_strings(stop, tokenizer) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop) if isinstance(stop, (list, tuple)) else None
    if stops is None or not all(isinstance(s, str) and s for s in stops):
        raise ValueError("stop must be a non-empty string or a list of non-empty strings")
    if stops and tokenizer is None:
        raise ValueError("stop strings need tokenizer= to turn tokens into text")
    return stops
