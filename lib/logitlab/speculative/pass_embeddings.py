"""PaSS: the target drafts for itself, with a few learned look-ahead embeddings.

Chapter 8 ("Parallel speculative sampling") explains this module.

PaSS (Monea et al., 2023) needs neither a second model (chapter 6) nor extra heads (chapter 7).
It adds ``k`` vectors of the model's embedding size, the *look-ahead embeddings*
``l_1 .. l_k``, and feeds them after the real tokens as if they were tokens:

    input     x_0  x_1 ... x_t   l_1      l_2      ...  l_k
    position  0    1   ... t     t+1      t+2      ...  t+k
    predicts  x_1  x_2 ... x_t+1 x_t+2    x_t+3    ...  x_t+k+1

The last real position predicts ``x_{t+1}`` as always (an exact sample of the target); the
output at ``l_i`` is a guess of ``x_{t+1+i}``, made without knowing the tokens in between. The
look-ahead inputs are causal like any token: ``l_i`` sees the context and ``l_1 .. l_{i-1}``,
never a later one. So one forward pass gives one exact token and ``k`` drafts, and only
``k x d_emb`` numbers are trained (576 each for SmolLM2-135M): the model itself is frozen.

Two ways to use them, both here:

* ``LookaheadEmbeddings`` is a drafter for ``ll.speculative_generate``: the paper's algorithm.
  Each iteration makes a *drafting* call (the target on the new tokens and the look-ahead
  embeddings; the real position's token is drawn from the target's own distribution, so it is
  always accepted) and the loop's *validation* call, with the usual rejection rule.
* ``pass_generate``: our single-call variant. One pass verifies the previous drafts **and**
  drafts the next ones: the look-ahead embeddings go after every prefix of the drafts that
  verification might keep (a small tree, scored with ``decoding.tree_shape``'s attention mask), or
  only after the prefix most likely to be kept. Exactness is unchanged (chapter 8 proves it).

Training (``logitlab.training.lookahead``) distils the target into the embeddings: the output
at ``l_i`` after context ``x_0..x_t`` learns the target's own distribution of ``x_{t+1+i}``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from .._validate import (bad_logits, check_body_and_head, check_counts, check_generator, check_int, check_logits,
                         check_smollm2, trusted)
from ..decoding.cache import crop_cache
from ..decoding.passes import forward, mask_positions, masked_forward
from ..decoding.prompts import eos_ids, one_prompt
from ..decoding.tree_shape import tree_attention_mask, tree_position_ids
from ..devices import model_device, now
from ..sampling.pipeline import SamplingConfig, draw, target_probs
from .acceptance import RejectionSampling, read_kept
from .drafter import Drafter, host_counts
from .result import CallLog, Outputs, SpeculativeResult
from .theory import call_counts

# Written by ``python -m logitlab.training.lookahead``: 8 look-ahead embeddings for SmolLM2-135M.
PRETRAINED_LOOKAHEAD = Path(__file__).resolve().parents[1] / "data" / "lookahead_smollm2_135m.safetensors"


class LookaheadEmbeddings(torch.nn.Module, Drafter):
    """``k`` learned input vectors that make ``model`` guess ``k`` tokens beyond the next one.

    The only parameters are ``vectors`` ``[k, d_emb]``; ``model`` is frozen and not a submodule
    (``parameters()`` is just the vectors). Freshly made, the vectors are the mean token
    embedding plus a little noise (seeded), so every slot starts as a vague "some token".
    Also a drafter for ``ll.speculative_generate`` (the two-call algorithm of the paper).
    """

    def __init__(self, model, k: int, seed: int = 0):
        super().__init__()
        check_body_and_head(model, "model")
        k = check_int(k, "k (the number of look-ahead embeddings)", 1)
        embedding = model.model.embed_tokens.weight.detach().float()
        # Seeded on the CPU, so that a seed gives the same vectors on every device.
        noise = torch.randn(k, embedding.shape[1], generator=torch.Generator(device="cpu").manual_seed(seed))
        init = embedding.mean(0) + 0.1 * embedding.std() * noise.to(embedding.device)
        self.vectors = torch.nn.Parameter(init)
        self.__dict__["model"] = model  # a plain attribute: the model is not part of this module
        self.k = k
        self.vocab_size = int(model.config.vocab_size)
        self.steps = 0  # drafting calls (forward passes of the target made by this drafter)
        self.cache, self.mask, self.unfed = None, None, []  # the drafter's state, set by start()

    def inputs(self, n: int | None = None) -> torch.Tensor:
        """The first ``n`` (default all) vectors in the model's dtype, ready to go after token embeddings."""
        n = self.k if n is None else n
        return self.vectors[:n].to(self.model.model.embed_tokens.weight.dtype)

    # --- The drafter protocol of ll.speculative_generate (see logitlab.speculative.drafter) ---------------

    def start(self, input_ids, attention_mask, target=None, cache=None) -> None:
        """After the loop's prefill: keep a copy of the target's cache (no second prefill)."""
        import copy

        if target is not self.model:
            raise ValueError("drafter: these look-ahead embeddings were made for another model than the target; "
                             "PaSS drafts with the target itself")
        self.mask, self.cache = attention_mask, copy.deepcopy(cache)
        # Drafts the target accepted but this drafter's cache has not seen yet, per row.
        self.unfed = [[] for _ in range(input_ids.shape[0])]
        self.steps = 1  # the shared prefill counts as the drafter's first step, as for other drafters

    @torch.inference_mode()
    def propose(self, next_tokens, gamma, config: SamplingConfig, generator=None):
        """The drafting call: the tokens this drafter has not seen (accepted drafts and the pending
        token) and ``min(gamma, k + 1) - 1`` look-ahead embeddings, in one pass of the target.
        Draft 1 is drawn from the target's distribution at the pending token (so ``q_1 = p_1``: the
        validation pass accepts it, up to rounding between the two passes), drafts 2.. from the
        look-ahead outputs."""
        if self.cache is None:
            raise ValueError("LookaheadEmbeddings needs the target's prefill: use it in ll.speculative_generate")
        g = min(gamma, self.k + 1)
        width = max(len(u) for u in self.unfed) + 1
        feed = torch.zeros(len(self.unfed), width, dtype=torch.long, device=next_tokens.device)
        new_mask = torch.zeros_like(feed)
        for b, (u, t) in enumerate(zip(self.unfed, next_tokens.tolist())):
            # Accepted drafts first, then padding (masked out), then the pending token last.
            feed[b, : len(u)], new_mask[b, : len(u)] = torch.tensor(u, dtype=torch.long, device=feed.device), 1
            feed[b, -1], new_mask[b, -1] = t, 1
        embeds = self.model.model.embed_tokens(feed)
        looks = self.inputs(g - 1)[None].expand(len(feed), -1, -1)
        mask = torch.cat([self.mask, new_mask, new_mask.new_ones(len(feed), g - 1)], dim=1)
        positions = mask_positions(mask, last=width + g - 1)
        step = forward(self.model, inputs_embeds=torch.cat([embeds, looks], dim=1), attention_mask=mask,
                       position_ids=positions, cache=self.cache, logits_to_keep=g)
        self.steps += 1
        self.cache = step.cache  # the look-ahead entries never stay in the cache:
        crop_cache(self.cache, self.cache.get_seq_length() - (g - 1))
        self.mask = mask[:, : mask.shape[1] - (g - 1)]
        self.proposed, q = draw(step.logits, config, generator)
        return self.proposed, q

    def rollback(self, num_accepted: torch.Tensor, kept: list[int] | None = None) -> None:
        proposed = self.proposed.tolist()
        self.unfed = [proposed[b][:n] for b, n in enumerate(host_counts(num_accepted, kept))]

    def select_rows(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.mask = self.mask[keep]
        self.unfed = [self.unfed[i] for i in keep.tolist()]


def check_lookahead(lookahead, model):
    if not isinstance(lookahead, LookaheadEmbeddings):
        raise ValueError(f"lookahead must be LookaheadEmbeddings, got {type(lookahead).__name__}")
    if lookahead.model is not model:
        raise ValueError("lookahead was made for another model: build or load it with this target")


# --- Saving and loading ------------------------------------------------------------------------


def save_lookahead(lookahead: LookaheadEmbeddings, path: str | Path, losses=None) -> None:
    """The vectors in float32 (8 x 576 x 4 bytes = 18 KB for SmolLM2), and the training curve
    (``logitlab.training.lookahead.train_lookahead``'s losses, ``[steps, k]``) if given, so that it travels with them."""
    from safetensors.torch import save_file

    state = {"vectors": lookahead.vectors.detach().float().cpu().contiguous()}
    if losses is not None:
        state["losses"] = torch.tensor(losses, dtype=torch.float32, device="cpu").contiguous()
    save_file(state, str(path))


def training_curve(path: str | Path | None = None) -> torch.Tensor | None:
    """The KL per step and slot ``[steps, k]`` saved with the embeddings (the shipped ones by
    default), or None if none was saved."""
    from safetensors.torch import load_file

    return load_file(str(PRETRAINED_LOOKAHEAD if path is None else path)).get("losses")


def load_pretrained(model, path: str | Path | None = None, k: int | None = None) -> LookaheadEmbeddings:
    """Embeddings saved by ``save_lookahead`` (the book's trained set of eight for SmolLM2-135M
    by default), for ``model``; the first ``k`` of them if given.

    Keeping the first ``k`` of a trained set is a valid smaller set: ``l_i`` only ever sees
    ``l_1 .. l_{i-1}``, so the later vectors never change what the earlier ones predict."""
    from safetensors.torch import load_file

    if path is None:
        check_smollm2(model, "model", "the shipped embeddings were")
    check_body_and_head(model, "model")
    vectors = load_file(str(PRETRAINED_LOOKAHEAD if path is None else path))["vectors"]
    size = model.model.embed_tokens.weight.shape[1]
    if vectors.dim() != 2 or vectors.shape[1] != size:
        raise ValueError(f"model: these embeddings have size {tuple(vectors.shape)[1:]}, the model's embedding "
                         f"size is {size}; they were trained for another model")
    k = vectors.shape[0] if k is None else k
    k = check_int(k, "k", 1, f"an integer in [1, {vectors.shape[0]}] (the saved embeddings)", vectors.shape[0])
    lookahead = LookaheadEmbeddings(model, k)
    with torch.no_grad():
        lookahead.vectors.copy_(vectors[:k].to(lookahead.vectors.device))
    return lookahead


# --- The single-call variant -------------------------------------------------------------------


def training_layout(length: int, starts: list[int], k: int) -> list[int]:
    """Parents for training on one sequence of ``length`` tokens: the tokens as a chain, then a
    chain of ``k`` look-ahead slots after each context end ``t`` in ``starts`` (slot 1's parent is
    token t). One pass then trains every context in ``starts`` at once, each group seeing only
    its own context, exactly as at generation time."""
    parents = [-1] + list(range(length - 1))
    for t in starts:
        for i in range(k):
            parents.append(t if i == 0 else len(parents) - 1)
    return parents


def single_call_layout(num_drafts: int, groups: dict[int, int]) -> list[int]:
    """Parents of one pass of ``pass_generate``: the pending token (node 0), the drafts as a chain
    (nodes 1..m), then for each prefix length ``j`` in ``groups`` a chain of ``groups[j]``
    look-ahead slots hanging from node ``j`` (the pending token for j = 0, else draft j)."""
    parents = [-1] + list(range(num_drafts))
    for j, size in sorted(groups.items()):
        if not 0 <= j <= num_drafts:
            raise ValueError(f"groups: prefix length {j} is not in [0, {num_drafts}]")
        for i in range(size):
            parents.append(j if i == 0 else len(parents) - 1)
    return parents


def single_call_forward(target, lookahead: LookaheadEmbeddings, cache, pending, drafts, groups: dict[int, int]):
    """One pass of the single-call variant after the cached sequence: the pending token, the
    drafts, and ``groups[j]`` slots after each prefix length j (``single_call_layout``), with the
    tree mask, so that each input sees the cache and its own ancestors only. Returns the cache
    (holding every input now) and the last hidden states ``[n, H]`` in layout order."""
    parents = single_call_layout(len(drafts), groups)
    chain = target.model.embed_tokens(torch.cat([pending.reshape(1), drafts]))
    looks = [lookahead.inputs(size) for _, size in sorted(groups.items())]
    step = masked_forward(target, cache, tree_attention_mask(parents),
                          tree_position_ids(parents, cache.get_seq_length()),
                          inputs_embeds=torch.cat([chain, *looks]), hidden=True, scores=False)
    return step.cache, step.hidden


@torch.inference_mode()
def pass_generate(target, lookahead: LookaheadEmbeddings, input_ids, *, max_new_tokens: int,
                  temperature: float = 0.0, prefixes: str = "all", eos_token_id=None, tokenizer=None,
                  generator: torch.Generator | None = None) -> SpeculativeResult:
    """Generate one sequence with PaSS in **one** target call per iteration.

    A call holds the pending token, the current drafts ``d_1 .. d_m`` and look-ahead slots: after
    every prefix ``d_1 .. d_j`` (``prefixes="all"``: j = 0 .. m, a tree) or after one prefix only
    (``"likely"``: the prefix the drafts' own probabilities make the most likely place for
    verification to stop). The drafts are verified with ``logitlab.speculative.loop``'s rule
    (rejection sampling; greedy matching at T = 0); the slots after the kept prefix give the next
    drafts, if that prefix had slots, else the next call has none. Returns a
    ``SpeculativeResult`` (one row; ``model_calls`` counts every pass, the prefill included).
    """
    check_body_and_head(target)
    check_lookahead(lookahead, target)
    if prefixes not in ("all", "likely"):
        raise ValueError(f"prefixes must be 'all' or 'likely', got {prefixes!r}")
    max_new_tokens = check_counts(max_new_tokens)[0]
    config = SamplingConfig(temperature=temperature)
    eos = eos_ids(eos_token_id, target)
    device = model_device(target)
    check_generator(generator, device)
    ids = one_prompt(input_ids, tokenizer, target)
    began, out = now(device), Outputs(1, eos, max_new_tokens)
    state = _SingleCall(target, lookahead, config, generator, prefixes)
    state.prefill(ids, min(lookahead.k, max_new_tokens - 1), out)
    log = CallLog(prefill_seconds=now(device) - began)
    while not out.finished([0])[0]:
        t0, before = now(device), len(out.tokens[0])
        num, m = state.call(max_new_tokens - before, out)
        end = now(device)  # one pass drafts and verifies: its time counts as verification
        log.record([call_counts(num, out.kept_since([0], [before])[0], m)], m, t0, t0, end)
    return out.result([ids[0]], [0], tokenizer, device, log, seconds=now(device) - began)


class _SingleCall:
    """The state of ``pass_generate`` between calls: the target's cache, the pending token, the
    current drafts with the distributions they came from, and the drafts' own probabilities."""

    def __init__(self, target, lookahead, config, generator, prefixes):
        self.target, self.lookahead, self.config, self.generator = target, lookahead, config, generator
        self.prefixes, self.rule = prefixes, RejectionSampling()  # logitlab.speculative.loop's rule

    def prefill(self, ids, slots: int, out: Outputs) -> None:
        """The prompt and ``slots`` look-ahead slots in one pass: the prompt's last position gives
        the first token, the slots the first drafts."""
        embed = self.target.model.embed_tokens
        step = forward(self.target, inputs_embeds=torch.cat([embed(ids[0]), self.lookahead.inputs(slots)])[None],
                       logits_to_keep=1 + slots)
        self.cache, logits = step.cache, step.logits[0]  # [1 + slots, V]
        self.pending = self.rule.first_token(logits[:1], self.config, self.generator)[0]
        out.add([0], self.pending.reshape(1, 1), logits[None, :1], target_probs(logits[None, :1], self.config), [1])
        self._new_drafts(logits[1:])
        crop_cache(self.cache, ids.shape[1])

    def call(self, left: int, out: Outputs) -> tuple[int, int]:
        """One pass: verify the drafts and draft after the kept prefix. Returns (drafts kept, drafts)."""
        m = min(len(self.drafts), left - 1)  # a call yields its accepted drafts and one more token
        drafts, q, conf = self.drafts[:m], self.q[:m], self.conf[:m]
        # Slots after prefix j: the next call's drafts, no more than it could still use.
        wanted = range(m + 1) if self.prefixes == "all" else [_likely_stop(conf)]
        groups = {j: min(self.lookahead.k, left - j - 2) for j in wanted if left - j - 2 > 0}
        length = self.cache.get_seq_length()
        self.cache, hidden = single_call_forward(self.target, self.lookahead, self.cache, self.pending, drafts, groups)
        # Verify with the loop's rule; only the chain and the kept prefix's slots need logits.
        chain = self.target.lm_head(hidden[: m + 1]).float()
        with trusted():  # the chain's logits and q are checked once, in the read of the kept count
            p = target_probs(chain, self.config)
            if m == 0:
                num, nxt = torch.zeros(1, dtype=torch.long, device=chain.device), \
                    self.rule.first_token(chain[:1], self.config, self.generator)
            else:
                num, nxt = self.rule(drafts[None], q[None], None if p is None else p[None], chain[None],
                                     self.config, self.generator)
        num, nxt = read_kept(num, chain, q)[0], nxt[0]
        emitted = torch.cat([drafts[:num], nxt.reshape(1)])
        out.add([0], emitted[None], chain[None, : num + 1], None if p is None else p[None, : num + 1],
                [num + 1])
        crop_cache(self.cache, length + num + 1)  # the chain comes first: keep the pending token and the kept drafts
        start = m + 1 + sum(size for j, size in groups.items() if j < num)
        # Verification stopped where no slots were placed: the next call drafts only.
        self._new_drafts(self.target.lm_head(hidden[start: start + groups.get(num, 0)]).float())
        self.pending = nxt
        return num, m

    def _new_drafts(self, logits) -> None:
        """Drafts from the slots' logits ``[s, V]`` (none when s = 0), with their q and confidence."""
        if len(logits) == 0:
            self.drafts = torch.zeros(0, dtype=torch.long, device=logits.device)
            self.q, self.conf = logits[:, :0], []
            return
        with trusted():  # the slots' logits are checked below, in the read of the confidences
            self.drafts, self.q = draw(logits, self.config, self.generator)
        # The drafter's own probability of each draft (at T = 0 under its T = 1 distribution): a
        # guess of how likely each is to be kept, used only to place the slots.
        probs = self.q if self.config.temperature > 0 else torch.softmax(logits, dim=-1)
        conf = probs.gather(-1, self.drafts[:, None]).squeeze(-1)
        *self.conf, invalid = torch.cat([conf, bad_logits(logits).to(conf.dtype)[None]]).tolist()
        if invalid:
            check_logits(logits, "the target's logits")  # raises, saying what is wrong

def _likely_stop(conf: list[float]) -> int:
    """The prefix length j most likely to be kept if draft i passes with probability ``conf[i]``,
    independently: P(keep exactly j) = conf_1 ... conf_j (1 - conf_{j+1})."""
    best, best_p, run = 0, -1.0, 1.0
    for j in range(len(conf) + 1):
        stop = 1.0 - float(conf[j]) if j < len(conf) else 1.0
        if run * stop > best_p:
            best, best_p = j, run * stop
        if j < len(conf):
            run *= float(conf[j])
    return best
