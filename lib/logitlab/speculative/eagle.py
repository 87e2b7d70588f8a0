"""Feature-level drafting (EAGLE): a one-layer drafter that reads the target's own features.

Chapter 9 ("Drafting from the target's features") explains this module.

The target's last hidden state ``f_t`` at position t (its *feature*: the output layer turns it
into the distribution of token t + 1) already holds most of what the next features will be.
EAGLE (Li et al., 2024) drafts in that space. One decoder layer reads ``f_t`` together with the
embedding of the token ``x_{t+1}`` that was chosen from it, and predicts ``f_{t+1}``; the target's
own output layer turns the prediction into a guess of ``x_{t+2}``. Fed its own prediction and
that guess, it predicts the feature after, and so on. The token goes in with the feature because
a feature alone does not say which of its likely tokens was actually sampled.

* ``FeatureDrafter``: the trained module. ``fc`` maps ``[feature, token embedding]`` (2H) to H,
  then one Llama decoder layer and a norm give the predicted feature; the output layer is the
  target's, restricted to the tokens it uses most (``SubsetHead``). The embedding and the output
  layer are the target's, shared and frozen, so only the layer, ``fc`` and the norm are trained
  and shipped. ``python -m logitlab.training.eagle`` trains it.
* ``EagleDrafter``: the ``Drafter`` for ``ll.speculative_generate``. It keeps its own KV cache
  over the pairs (feature, next token) of the text so far: after every target pass it is handed
  the target's features at the positions the target kept (``observe_states``) and feeds them
  in at the next call, dropping what it had drafted. It proposes a **chain** (``gamma``
  tokens, each from its own previous prediction) or, with ``tree=``, **EAGLE-2's dynamic tree**
  (Li et al., 2024b): at every depth it expands the ``top_k`` nodes with the highest cumulative
  draft probability, gives each its ``top_k`` best children, and finally keeps the ``nodes``
  best of all candidates; or a **fixed tree** (``branching=(b1, b2, ...)``: every node of level
  i gets its ``b_i`` best children, as EAGLE's first version did). Tree children are chosen, not
  sampled, so verification treats each
  as a point mass; that keeps the output exact at every temperature
  (``logitlab.speculative.tree_verify``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .. import fast_cpu, fast_gpu
from .._validate import check_body_and_head, checking_values
from ..decoding.cache import crop_cache
from ..decoding.passes import forward, mask_positions, tree_forward
from ..decoding.tree_shape import cartesian_tree
from ..sampling.pipeline import draw, process_logits
from .drafter import Drafter, DraftTree
from .subset_head import SubsetHead

# Written by ``python -m logitlab.training.eagle``: the layer, fc and norm in float16 and the ids
# of the tokens the output layer scores (the embedding is the target's own).
PRETRAINED = Path(__file__).resolve().parents[1] / "data" / "eagle_smollm2_135m.safetensors"


class FeatureDrafter(torch.nn.Module):
    """EAGLE's drafter for ``target``: ``forward(features [B, L, H], tokens [B, L], ...)`` returns
    the predicted next features ``[B, L, H]``; ``logits(features)`` scores them on ``vocab``."""

    def __init__(self, target, vocab: torch.Tensor | None = None, layers=None):
        super().__init__()
        from transformers import LlamaConfig, LlamaModel

        check_body_and_head(target)
        # One decoder layer and no vocabulary of its own (inputs come from fc, outputs go through the
        # target's head): no token ids either, or the config warns they lie outside its vocabulary.
        config = LlamaConfig(**{**target.config.to_dict(), "num_hidden_layers": 1, "vocab_size": 1, "pad_token_id": None,
                                "bos_token_id": None, "eos_token_id": None})
        hidden, depth = config.hidden_size, target.config.num_hidden_layers
        if layers is not None and (not isinstance(layers, (tuple, list)) or not layers or layers[-1] != depth or any(
                isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= depth for i in layers)):
            raise ValueError(f"layers must be None (the top layer's feature) or target layers in [1, {depth}] "
                             f"ending with the top one, {depth}, got {layers!r}")
        # EAGLE-3's fused features: the outputs of several layers, mapped to one feature by ``fuse``.
        self.layers = None if layers is None else tuple(layers)
        self.fuse = None if layers is None else torch.nn.Linear(len(layers) * hidden, hidden, bias=False)
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=False)
        self.model = LlamaModel(config)  # its 1-token embedding is never used: inputs come from fc
        self.config = self.model.config  # where the attention implementation is read (ll.fast_cpu)
        output = target.lm_head.weight  # SmolLM2's is its embedding (tied); not every model's is
        self.vocab_size = output.shape[0]
        vocab = torch.arange(self.vocab_size, device=output.device) if vocab is None else vocab.long()
        self.lm_head = SubsetHead(output, vocab)
        # The target's embedding and output layer, shared (plain attributes: not parameters of this
        # module, not saved).
        object.__setattr__(self, "embed", target.model.embed_tokens)
        object.__setattr__(self, "full_output", output)
        with torch.no_grad():
            # Start as the target's first layer reading only the token's embedding (fc = [0, I]):
            # a small language model of its own from step one, which then learns to use the
            # feature. Measured on held-out rows after 300 steps: first guess right 0.316 of the
            # time, against 0.228 from the target's last layer with a random fc.
            self.model.layers[0].load_state_dict(target.model.layers[0].state_dict())
            self.model.norm.load_state_dict(target.model.norm.state_dict())
            self.fc.weight.zero_()
            self.fc.weight[:, hidden:] = torch.eye(hidden)
        self.to(device=output.device, dtype=output.dtype)

    def inputs(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The layer's inputs: ``fc([feature, embedding of the token chosen from it])``; the target's
        fused features (wider than one) are first mapped to one by ``fuse``, while the drafter's own
        predictions, fed back when it drafts on, already have one feature's width."""
        if features.shape[-1] != self.fc.in_features // 2:
            features = self.fuse(features)
        return self.fc(torch.cat([features, self.embed(tokens).to(features.dtype)], dim=-1))

    def forward(self, features, tokens, attention_mask=None, position_ids=None, cache=None):
        step = forward(self, inputs_embeds=self.inputs(features, tokens), attention_mask=attention_mask,
                       position_ids=position_ids, cache=cache, hidden=True, scores=False)
        return step.hidden, step.cache

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.lm_head(features).float()


def save_drafter(drafter: FeatureDrafter, path: str) -> None:
    from safetensors.torch import save_file

    state = {k: v.detach().half().contiguous() for k, v in drafter.state_dict().items() if not k.startswith("lm_head")}
    state["vocab"] = drafter.lm_head.vocab.int().contiguous()
    save_file(state, path, metadata={"layers": ",".join(map(str, drafter.layers or ()))})


def load_pretrained(target, path: str | Path | None = None) -> FeatureDrafter:
    """A drafter saved by ``save_drafter`` (the shipped one by default), built on ``target``."""
    from safetensors.torch import load_file

    check_body_and_head(target)
    from safetensors import safe_open

    path = str(PRETRAINED if path is None else path)
    with safe_open(path, "pt") as f:
        listed = (f.metadata() or {}).get("layers", "")
    layers = tuple(int(i) for i in listed.split(",")) if listed else None
    state = load_file(path)
    vocab = state.pop("vocab").long()
    fc = state.get("fc.weight")
    hidden = target.config.hidden_size
    if fc is None or tuple(fc.shape) != (hidden, 2 * hidden) or int(vocab.max()) >= target.config.vocab_size:
        raise ValueError(f"target: this drafter was trained for another model (fc {None if fc is None else tuple(fc.shape)}, "
                         f"token ids up to {int(vocab.max())}); the target has hidden size {hidden} and "
                         f"{target.config.vocab_size} tokens")
    drafter = FeatureDrafter(target, vocab, layers)
    missing = drafter.load_state_dict({k: v.to(drafter.fc.weight.dtype) for k, v in state.items()}, strict=False)
    if missing.unexpected_keys or [k for k in missing.missing_keys if not k.startswith("lm_head")]:
        raise ValueError(f"path: the file does not hold a FeatureDrafter's weights ({missing})")
    if getattr(target, "logitlab_fast_cpu", None):
        fast_cpu.enable(drafter)  # the drafter runs on the kernels its target runs on (ll.load's fast path)
    return fast_gpu.follow(drafter.eval(), target)  # and on its cache (ll.load's GPU fast path)


class EagleDrafter(Drafter):
    """Proposals from a ``FeatureDrafter``: a chain, EAGLE-2's dynamic tree with ``tree=dict(
    top_k=..., nodes=...)`` (depth: the loop's ``gamma``), or a fixed tree with ``tree=dict(
    branching=(b1, b2, ...))`` (no deeper than ``gamma``). See the module's text."""

    reads_hidden_state = True

    def __init__(self, drafter: FeatureDrafter, tree: dict | None = None):
        if not isinstance(drafter, FeatureDrafter):
            raise ValueError(f"drafter must be a FeatureDrafter (see ll.speculative.eagle.load_pretrained), got {type(drafter).__name__}")
        if tree is not None:
            dynamic = isinstance(tree, dict) and set(tree) == {"top_k", "nodes"} and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in tree.values())
            fixed = isinstance(tree, dict) and set(tree) == {"branching"} and isinstance(tree["branching"], (tuple, list)) \
                and len(tree["branching"]) >= 1 and cartesian_tree(tree["branching"])  # checks the widths
            if not (dynamic or fixed):
                raise ValueError("tree must be None (a chain), dict(top_k=..., nodes=...) with integers >= 1 (EAGLE-2's "
                                 f"dynamic tree) or dict(branching=(b1, b2, ...)) (a fixed tree), got {tree!r}")
            widest = tree["top_k"] if dynamic else max(tree["branching"])
            if widest > len(drafter.lm_head.vocab):
                raise ValueError(f"tree asks for {widest} children per node, more than the {len(drafter.lm_head.vocab)} "
                                 "tokens the drafter scores")
        self.drafter, self.tree = drafter, tree
        self.vocab_size, self.feature_layers = drafter.vocab_size, drafter.layers

    def start(self, input_ids, attention_mask, target=None, cache=None) -> None:
        self.cache, self.mask = None, attention_mask[:, :0]
        self.kept_length = 0  # the cache's entries before the latest drafts: the text's
        self.steps = 1  # the prompt's features, fed at the first call, count as one step

    def observe_states(self, states, tokens, kept) -> None:
        self.queue = (states, tokens, kept)

    @torch.inference_mode()
    def propose(self, next_tokens, gamma, config, generator=None):
        h = self.catch_up(next_tokens)  # [B, H]: the predicted feature after next_tokens
        if self.tree is not None:
            return self.propose_tree(h, gamma, config)
        tokens, qs = [], []
        for i in range(gamma):
            token, q = draw(self.constrained(self.drafter.logits(h)), config, generator)
            self.drafted(token)
            tokens.append(token)
            qs.append(q)
            if i < gamma - 1:  # the last proposal is not fed (it may be rejected anyway)
                h = self.feed(h[:, None], token[:, None], torch.ones_like(token)[:, None])[:, 0]
        return torch.stack(tokens, dim=1), torch.stack(qs, dim=1)

    def catch_up(self, next_tokens) -> torch.Tensor:
        """Drop what was drafted last time and feed the target's features of the positions it kept,
        each with the token that followed it (``next_tokens`` after the last one)."""
        if self.cache is not None:
            crop_cache(self.cache, self.kept_length)
        self.mask = self.mask[:, : self.kept_length]
        states, tokens, kept = self.queue
        rows = torch.arange(len(kept), device=kept.device)
        last = kept.shape[1] - 1 - kept.flip(1).argmax(dim=1)  # each row's last kept position
        after = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)  # the token after each position ...
        after[rows, last] = next_tokens  # ... and after the last one, the target's newest token
        out = self.feed(states, after, kept)
        self.kept_length = self.mask.shape[1]
        return out[rows, last]

    def feed(self, features, tokens, new_mask) -> torch.Tensor:
        """Run the layer on new entries after the cache (``new_mask``: which are real)."""
        self.mask = torch.cat([self.mask, new_mask.to(self.mask.dtype)], dim=1)
        positions = mask_positions(self.mask, last=features.shape[1])
        out, self.cache = self.drafter(features, tokens, self.mask, positions, self.cache)
        self.steps += 1
        return out

    def propose_tree(self, h, depth, config) -> DraftTree:
        """A tree of at most ``depth`` levels. EAGLE-2's: every level expands the ``top_k`` nodes of
        the level before with the highest cumulative score, ``top_k`` children each, and the best
        ``nodes`` of all candidates are kept. A fixed tree (``branching``): every node of level i
        gets its ``branching[i]`` best children, and every node is kept."""
        fixed = "branching" in self.tree
        widths = list(self.tree["branching"][:depth]) if fixed else [self.tree["top_k"]] * depth
        batch, device = len(h), h.device
        vocab = self.drafter.lm_head.vocab  # confidence scores these tokens only: topk gives indices into it
        scores, tokens = self.confidence(h, config).topk(widths[0], dim=-1)  # level 1: the root's best children
        tokens = vocab[tokens]
        all_tokens, all_scores, all_parents = [tokens], [scores], [torch.full_like(tokens, -1)]
        fed, fed_scores, fed_states = tokens, scores, h[:, None].expand(-1, widths[0], -1)  # parents' predicted features
        fed_index = torch.arange(widths[0], device=device).expand(batch, -1)  # the fed nodes' candidate indices
        seen = torch.zeros(batch, 0, 0, dtype=torch.bool, device=device)  # ancestors among fed entries
        parent_slot = torch.full((batch, widths[0]), -1, device=device)  # each fed node's parent among fed entries
        for width in widths[1:]:
            seen = self.tree_seen(seen, parent_slot)
            out = self.feed_tree(fed_states, fed, seen)  # [B, m, H], the m nodes of the last level
            m = fed.shape[1]
            child_scores, child_tokens = self.confidence(out, config).topk(width, dim=-1)  # [B, m, width]
            child_tokens = vocab[child_tokens]
            cumulative = (fed_scores[..., None] + child_scores).flatten(1)  # [B, m * width]
            first = sum(t.shape[1] for t in all_tokens)
            all_tokens.append(child_tokens.flatten(1))
            all_scores.append(cumulative)
            all_parents.append(fed_index.repeat_interleave(width, dim=1))
            if fixed:  # the next level grows under every node of this one
                best = torch.arange(m * width, device=device).expand(batch, -1)
            else:  # under the top_k of this level by cumulative score
                best = cumulative.topk(self.tree["top_k"], dim=-1).indices
            fed_scores = cumulative.gather(1, best)
            parent_slot = seen.shape[1] - m + torch.div(best, width, rounding_mode="floor")
            fed, fed_index = child_tokens.flatten(1).gather(1, best), first + best
            fed_states = out.gather(1, torch.div(best, width, rounding_mode="floor")[..., None].expand(-1, -1, out.shape[-1]))
        candidates = torch.cat(all_tokens, 1)
        budget = candidates.shape[1] if fixed else self.tree["nodes"]
        return rerank(candidates, torch.cat(all_scores, 1), torch.cat(all_parents, 1), budget)

    def confidence(self, h, config) -> torch.Tensor:
        """The drafter's log-probabilities used to rank nodes: at the sampling temperature and
        truncation (the drafter's own distribution at T = 0), over the tokens its output layer
        scores only (``lm_head.vocab``; index i is token ``vocab[i]``). The others are at -inf in
        ``logits`` and are never chosen; every truncation rule leaves -inf tokens out of its
        statistics, so dropping them changes no kept set, and it spares a write, a softmax and a
        top-k over the whole vocabulary for every node of every level."""
        logits = self.drafter.lm_head.scores(h).float()
        if config.temperature > 0:
            logits = process_logits(logits.reshape(-1, logits.shape[-1]), config).view(logits.shape)
        return torch.log_softmax(logits, dim=-1)

    @staticmethod
    def tree_seen(seen, parent_slot) -> torch.Tensor:
        """Ancestor sets of the fed entries, grown by a new level whose parents are ``parent_slot``
        (-1: the root, which is in the kept cache): each sees its parent's set and itself."""
        batch, old, k = seen.shape[0], seen.shape[1], parent_slot.shape[1]
        grown = torch.zeros(batch, old + k, old + k, dtype=torch.bool, device=seen.device)
        grown[:, :old, :old] = seen
        if old > 0:
            rows = torch.arange(batch, device=seen.device)[:, None]
            grown[:, old:, :old] = seen[rows, parent_slot.clamp_min(0)] & (parent_slot >= 0)[..., None]
        grown[:, old:, old:] = torch.eye(k, dtype=torch.bool, device=seen.device)
        return grown

    def feed_tree(self, parent_states, tokens, seen) -> torch.Tensor:
        """One pass of the layer over a new level of ``k`` tree nodes (their parents' predicted
        features and their tokens), each seeing the kept cache and its ancestors among the fed nodes."""
        batch, k = tokens.shape
        old = seen.shape[1] - k
        depth = seen[:, old:].sum(dim=-1)  # 1 + the node's fed ancestors
        positions = self.mask[:, : self.kept_length].sum(dim=-1, keepdim=True) - 1 + depth  # the root: the last kept entry
        visible = torch.cat([self.mask[:, None, : self.kept_length].expand(-1, k, -1).bool(),
                             seen[:, old:, :old]], dim=2)
        step = tree_forward(self.drafter, self.cache, visible, seen[:, old:, old:], positions,
                            inputs_embeds=self.drafter.inputs(parent_states, tokens), hidden=True, scores=False)
        self.cache = step.cache
        self.mask = torch.cat([self.mask, self.mask.new_ones(batch, k)], dim=1)
        self.steps += 1
        return step.hidden

    def select_rows(self, keep: torch.Tensor) -> None:
        if self.cache is not None:
            self.cache.batch_select_indices(keep)
        self.mask = self.mask[keep]
        states, tokens, kept = self.queue
        self.queue = (states[keep], tokens[keep], kept[keep])


def rerank(tokens, scores, parents, budget: int) -> DraftTree:
    """The ``budget`` candidates with the highest cumulative scores, as a ``DraftTree``. Scores
    never grow along a path, so a kept node's parent is kept too (ties go to the shallower)."""
    budget = min(budget, tokens.shape[1])
    order = torch.arange(tokens.shape[1], device=tokens.device).expand_as(scores)
    chosen = (scores - 1e-6 * order).topk(budget, dim=-1).indices.sort(dim=-1).values  # candidate order: parents first
    where = torch.full_like(tokens, -1).scatter(1, chosen, torch.arange(budget, device=tokens.device).expand_as(chosen))
    parent = parents.gather(1, chosen)
    new_parent = torch.where(parent >= 0, where.gather(1, parent.clamp_min(0)), parent)
    if checking_values() and (new_parent == -1).logical_and(parent >= 0).any():  # (not inside the loop: a read)
        raise RuntimeError("a kept draft's parent was not kept")  # cannot happen: scores decrease along paths
    return DraftTree(tokens.gather(1, chosen), new_parent)
