"""Constrained decoding: the byte automaton against Python's ``re``, exact token indexes on
hand-made vocabularies, ``outlines-core`` as an oracle on the real vocabulary, and every output
of the decoding loops checked with ``re.fullmatch``."""

import json
import random
import re

import pytest
import torch
from transformers import LogitsProcessorList

import logitlab as ll
from logitlab.constrained.constraint import Constraint
from logitlab.constrained.vocabulary import vocabulary_bytes
from logitlab.constrained.json_schema import JSON_WHITESPACE
from logitlab.constrained.regex import compile_regex, utf8_ranges

STRING = r'"([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"'
PATTERNS = [
    r"(ab|a)b?é", r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r"(yes|no|maybe)", STRING, r"a{,3}", r"x{2,}y",
    r"\d+(\.\d+)?", r".*", r"[^a]b", r"a{b", r"", r"(a|)+", r"(a|b)*abb", r"[\w.-]+@[a-z]+\.(com|org)",
    r"é{2}[^é\n]?", r"(?:ab|cd){1,3}", r"[-+]?[0-9]*\.?[0-9]+", r"\s*\S+",
]
ALPHABET = ["a", "b", "c", "d", "x", "y", "é", "0", "1", "9", "-", ".", "@", '"', "\\", "n", "u", " ", "\n",
            "{", "}", "+", "\U0001F600", "\x01", "o", "m"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_byte_automaton_accepts_what_python_re_fullmatches(pattern):
    dfa = compile_regex(pattern)
    rng = random.Random(0)
    strings = ["", "ab", "abé", "2024-01-02", "maybe", '"a\\"b"', '"\\u00e9"', "xxy", "3.14", "éé", "abbabb",
               "me@site.com", "ababcd", "+.5", "  word"]
    strings += ["".join(rng.choices(ALPHABET, k=rng.randint(0, 6))) for _ in range(3000)]
    for s in strings:
        assert dfa.matches(s.encode()) == bool(re.fullmatch(pattern, s, flags=re.ASCII)), (pattern, s)


# Characters on which re's Unicode classes (its default for str patterns) and its ASCII ones differ:
# digits of other scripts, letters, non-breaking and other spaces; and ASCII ones around them.
LOOKALIKES = ["\u0663", "\u0969", "\uff13", "\u00e9", "\u00df", "\u00a0", "\v", "\f", "\u2028", "\u216b",
              "\u3000", "_", "7", "a", "Z", " ", "\t", "\n", "\r", "-", "\U0001D7D9"]


@pytest.mark.parametrize("pattern", [r"\d", r"\w", r"\s", r"\D", r"\W", r"\S", r"[\d\s]+", r"[^\w]*", r"\d+\s?\w*",
                                     r"[\D]", r"[^\S]", r"\S\W\D", r"[\w-]{2}"])
def test_class_escapes_are_the_ascii_classes_of_re(pattern):
    """``\\d \\w \\s`` and their negations match what ``re`` matches with ``re.ASCII``; the
    strings include characters where ``re``'s default (Unicode) classes say otherwise, so an
    automaton with Unicode classes would fail here."""
    dfa = compile_regex(pattern)
    rng = random.Random(0)
    strings = LOOKALIKES + ["".join(rng.choices(LOOKALIKES, k=rng.randint(0, 4))) for _ in range(2000)]
    for s in strings:
        assert dfa.matches(s.encode()) == bool(re.fullmatch(pattern, s, flags=re.ASCII)), (pattern, s)
    assert any(bool(re.fullmatch(pattern, s)) != bool(re.fullmatch(pattern, s, flags=re.ASCII)) for s in strings)


def test_the_automaton_is_minimal_and_pruned():
    assert compile_regex(r"(a|b)*abb").num_states == 4  # the textbook's minimal DFA
    # Any character: a start state (also accepting) and the states inside a 2-, 3- or 4-byte
    # character, with E0, ED, F0 and F4 as lead bytes that narrow the next byte.
    assert compile_regex(r".*").num_states == 8
    dfa = compile_regex(r"ab|ac")
    assert (dfa.table[0] >= 0).sum() == 1 and dfa.table[0, ord("a")] >= 0  # no dead branches kept


@pytest.mark.parametrize("lo,hi", [(0, 0x7F), (0x80, 0x7FF), (0x41, 0x20AC), (0x7FE, 0x801), (0xFFF0, 0x10010),
                                   (0xE000, 0xFFFF), (0x10FF00, 0x10FFFF), (0x3B1, 0x3C9)])
def test_utf8_ranges_cover_exactly_the_code_points(lo, hi):
    sequences = utf8_ranges(lo, hi)

    def covered(code):
        data = chr(code).encode()
        return sum(len(seq) == len(data) and all(a <= b <= c for (a, c), b in zip(seq, data)) for seq in sequences)

    inside = [c for c in range(lo, hi + 1) if not 0xD800 <= c <= 0xDFFF]
    assert all(covered(c) == 1 for c in random.Random(0).sample(inside, min(len(inside), 3000)) + [lo, hi])
    assert all(covered(c) == 0 for c in (lo - 1, hi + 1) if 0 <= c <= 0x10FFFF and not 0xD800 <= c <= 0xDFFF)


@pytest.mark.parametrize("pattern,match", [
    ("(ab", "missing '\\)'"), ("ab)", "unbalanced"), ("*a", "nothing to repeat"), (r"(a)\1", "backreferences"),
    ("(?=a)b", "lookarounds"), ("^ab$", "anchors"), ("a{3,1}", "maximum below"), ("[z-a]", "bad character range"),
    (r"\p{L}", "escape"), (r"\01", "octal escapes"), ("a{2000}", "counts above"), (r"[^\s\S]", "matches no string"), (3, "must be a str"),
])
def test_bad_patterns_raise(pattern, match):
    with pytest.raises(ValueError, match=match):
        compile_regex(pattern)


def allowed(constraint, state):
    return sorted(constraint.allowed(state).tolist())


def test_a_token_may_span_two_transitions():
    vocab = [b"a", b"b", b"ab", None, b"abb", b"ba"]
    c = Constraint("ab", vocab=vocab, eos_token_id=3)
    assert allowed(c, 0) == [0, 2]          # "abb" and "ba" cannot lead to a match
    done = c.next_state(0, 2)
    assert allowed(c, done) == [3]          # after "ab", only EOS
    assert allowed(c, c.next_state(0, 0)) == [1]
    assert c.next_state(0, 4) == -1 and c.fewest_tokens == 1


def test_a_multi_byte_character_split_across_tokens():
    e_acute = "é".encode()
    vocab = [e_acute[:1], e_acute[1:], e_acute, b"e", None, b"\xc3\xa8"]  # é split, whole, e, and è
    c = Constraint("é+", vocab=vocab, eos_token_id=4)
    assert allowed(c, 0) == [0, 2]          # the lead byte alone is allowed: a match can follow
    middle = c.next_state(0, 0)
    assert allowed(c, middle) == [1]        # inside the character, only its second byte
    end = c.next_state(middle, 1)
    assert c.is_complete(end) and allowed(c, end) == [0, 2, 4]
    assert c.next_state(0, 5) == -1         # è shares é's lead byte but is not é


def test_the_empty_match_and_a_pattern_the_vocabulary_cannot_complete():
    vocab = [b"a", b"b", None]
    assert allowed(Constraint("", vocab=vocab, eos_token_id=2), 0) == [2]
    star = Constraint("a*", vocab=vocab, eos_token_id=2)
    assert allowed(star, 0) == [0, 2] and star.fewest_tokens == 0
    with pytest.raises(ValueError, match="no sequence of this vocabulary's tokens"):
        Constraint("ac", vocab=vocab, eos_token_id=2)


def test_fewest_tokens_and_the_budget():
    vocab = [b"a", b"aa", b"aaaa", b"b", None]
    c = Constraint("a{5}b", vocab=vocab, eos_token_id=4)
    assert c.fewest_tokens == 3                       # aaaa, a, b
    assert allowed(c, 0) == [0, 1, 2]
    # Within 3 tokens: "a" (then "aaaa", "b") or "aaaa" (then "a", "b"), not "aa" (3 more).
    assert sorted(c.allowed(0, tokens_left=3).tolist()) == [0, 2]
    with pytest.raises(ValueError, match="max_new_tokens=2 is too few"):
        c.check_budget(2)


@pytest.mark.parametrize("kwargs,match", [
    (dict(vocab=[b"a", None]), "eos_token_id is needed"),
    (dict(vocab=[b"a", None], eos_token_id=0), "ids of tokens without text"),
    (dict(vocab=[b"a", None], eos_token_id=5), "ids of tokens without text"),
    (dict(), "either tokenizer= or vocab="),
])
def test_bad_constraint_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Constraint("a", **kwargs)


# -- The real vocabulary --------------------------------------------------------------------


def test_vocabulary_bytes_decode_like_the_tokenizer(smollm):
    _, tokenizer = smollm
    vocab = vocabulary_bytes(tokenizer)
    assert len(vocab) == len(tokenizer) and vocab[tokenizer.eos_token_id] is None
    checked = 0
    for token_id in random.Random(0).sample(range(len(vocab)), 3000):
        if vocab[token_id] is None:
            continue
        try:
            text = vocab[token_id].decode()
        except UnicodeDecodeError:  # a token ending inside a character: the tokenizer shows U+FFFD
            continue
        assert text == tokenizer.decode([token_id]), token_id
        checked += 1
    assert checked > 2500


ORACLE_PATTERNS = [
    r"(positive|negative|neutral)", r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r"(true|false)",
    r"\{ ?\"name\": ?" + STRING + r", ?\"age\": ?(0|[1-9][0-9]*) ?\}", r"[a-z ]{1,30}\.", r"-?(0|[1-9][0-9]*)(\.[0-9]+)?",
    r"[A-Z][a-z]+( [A-Z][a-z]+)*", r"(é|ü|ß|[a-z])+", r".{0,12}", r"[^\"]*",
]


def walk(dfa, state, data: bytes) -> list[int]:
    """The states a walk over ``data`` visits, ``state`` first."""
    states = [state]
    for byte in data:
        states.append(int(dfa.table[states[-1], byte]))
    return states


@pytest.mark.slow
@pytest.mark.parametrize("pattern", ORACLE_PATTERNS)
def test_allowed_sets_equal_outlines_core(smollm, pattern):
    """Along 12 random walks, our allowed set equals outlines-core's at every state, with one
    exception, checked token by token: outlines-core (0.2.14) leaves out every token after which
    the output before the token's last byte matches and the output with it does not, although a
    match can follow it ("." after "5" for a decimal number; a lead byte alone where any
    character may follow). Each such extra token of ours is shown completable: its bytes, then
    the shortest bytes our automaton finds to an accepting state, make a string that
    ``re.fullmatch`` accepts (checked for every seventh such token)."""
    outlines_core = pytest.importorskip("outlines_core")
    _, tokenizer = smollm
    vocab = vocabulary_bytes(tokenizer)
    by_bytes = {}
    for token_id, data in enumerate(vocab):
        if data:
            by_bytes.setdefault(data, []).append(token_id)
    oracle = outlines_core.Index(pattern, outlines_core.Vocabulary(tokenizer.eos_token_id, by_bytes))
    ours = Constraint(pattern, tokenizer)
    dfa, tails = ours.dfa, shortest_tails(ours.dfa)
    rng = random.Random(0)
    states = 0
    for _ in range(12):
        state, theirs, text = 0, oracle.get_initial_state(), b""
        for _ in range(25):
            mine, their_set = set(ours.allowed(state).tolist()), set(oracle.get_allowed_tokens(theirs))
            assert their_set <= mine, (pattern, text, sorted(their_set - mine)[:5])
            for extra in sorted(mine - their_set)[::7]:  # every seventh, to keep the test short
                visited = walk(dfa, state, vocab[extra])
                assert dfa.accepting[visited[-2]] and not dfa.accepting[visited[-1]], (pattern, text, vocab[extra])
                assert re.fullmatch(pattern, (text + vocab[extra] + tails[visited[-1]]).decode()), (text, extra)
            states += 1
            choices = sorted(mine - {tokenizer.eos_token_id} & their_set)
            if not choices:
                break
            token = rng.choice(choices)
            state, theirs, text = ours.next_state(state, token), oracle.get_next_state(theirs, token), text + vocab[token]
    assert states >= 12


@pytest.mark.parametrize("pattern,alphabet", [
    (r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", ["-", "0", "5", ".", "5.", "55", ".5", "5.5", "0.", "-5."]),
    (r"a(bcd)?", ["a", "b", "c", "d", "ab", "abc", "abcd", "bc", "bcd", "cd"]),
    (r"(ab)*c?", ["a", "b", "c", "ab", "aba", "abab", "ba", "bc", "abc"]),
    ("(é|x)+", ["x", "xx", "é", "x\xc3", "\xc3", "\xa9", "\xa9x"]),
])
def test_what_outlines_core_leaves_out_on_a_small_vocabulary(pattern, alphabet):
    """Exactly the tokens after which the output before the token's last byte matches and the
    output with it does not: in every state reachable with these tokens, outlines-core allows our
    set less those. (``abc`` in ``a(bcd)?`` passes an accepting state, ends in one that is not,
    and is kept; ``ab`` is left out.)"""
    outlines_core = pytest.importorskip("outlines_core")
    vocab = [a.encode("latin-1") if "\xc3" in a or "\xa9" in a else a.encode() for a in alphabet] + [None]
    eos = len(vocab) - 1
    oracle = outlines_core.Index(pattern, outlines_core.Vocabulary(eos, {d: [i] for i, d in enumerate(vocab) if d}))
    ours = Constraint(pattern, vocab=vocab, eos_token_id=eos)
    seen, todo, left_out = set(), [(0, oracle.get_initial_state(), 0)], 0
    while todo:
        state, theirs, depth = todo.pop()
        if (state, theirs) in seen or depth > 4:
            continue
        seen.add((state, theirs))
        mine = set(ours.allowed(state).tolist())
        lost = set()
        for token in mine - {eos}:
            visited = walk(ours.dfa, state, vocab[token])
            if ours.dfa.accepting[visited[-2]] and not ours.dfa.accepting[visited[-1]]:
                lost.add(token)
        assert set(oracle.get_allowed_tokens(theirs) or []) == mine - lost, (pattern, state)
        left_out += len(lost)
        todo += [(ours.next_state(state, t), oracle.get_next_state(theirs, t), depth + 1) for t in mine - lost - {eos}]
    assert left_out > 0


def test_outlines_core_follows_the_order_of_alternatives():
    """Where an earlier alternative is a prefix of a later one, outlines-core ends the match with
    the earlier: ``x|xyz`` lets only ``x`` start, ``xyz|x`` both. The automaton here takes both."""
    outlines_core = pytest.importorskip("outlines_core")
    vocab = [b"x", b"y", b"z", b"xyz", None]
    for pattern, theirs in ((r"x|xyz", {0}), (r"xyz|x", {0, 3})):
        oracle = outlines_core.Index(pattern, outlines_core.Vocabulary(4, {d: [i] for i, d in enumerate(vocab) if d}))
        assert set(oracle.get_allowed_tokens(oracle.get_initial_state())) == theirs
        assert allowed(Constraint(pattern, vocab=vocab, eos_token_id=4), 0) == [0, 3]


def shortest_tails(dfa) -> dict[int, bytes]:
    """For every live state, the shortest bytes that lead to an accepting state (found by a
    breadth-first search backwards from the accepting states)."""
    tails = {s: b"" for s in range(dfa.num_states) if dfa.accepting[s]}
    frontier = list(tails)
    while frontier:
        reached = []
        for state in range(dfa.num_states):
            if state in tails:
                continue
            for byte in range(256):
                nxt = int(dfa.table[state, byte])
                if nxt in frontier:
                    tails[state] = bytes([byte]) + tails[nxt]
                    reached.append(state)
                    break
        frontier = reached
    return tails


def chat(tokenizer, question):
    return tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=False)


@pytest.mark.slow
def test_every_sampled_output_matches_its_pattern(smollm):
    """200 samples per prompt at T = 1.5 (which wanders far from the pattern on its own),
    three prompts with three different constraints in one batch, 12 tokens at most: every
    output fullmatches its pattern, also those that the budget ended."""
    model, tokenizer = smollm
    patterns = [r"(positive|negative|neutral)", r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r"[A-Z][a-z]+( [a-z]+){0,3}\."]
    questions = ["Is 'I loved it' positive or negative?", "When did the Berlin Wall fall?", "Name a fruit."]
    out = ll.generate(model, [chat(tokenizer, q) for q in questions], tokenizer=tokenizer, max_new_tokens=12,
                      temperature=1.5, num_return_sequences=200, generator=ll.generator(model, seed=0),
                      constraint=[Constraint(p, tokenizer) for p in patterns])
    for prompt, tokens in zip(out.prompt_index, out.new_tokens):
        text = tokenizer.decode([t for t in tokens.tolist() if t != tokenizer.eos_token_id])
        assert re.fullmatch(patterns[prompt], text), (patterns[prompt], text)
    assert len(set(out.texts)) > 20  # sampled, not one answer repeated


def test_greedy_constrained_output_equals_hugging_face_with_the_processor(smollm):
    model, tokenizer = smollm
    pattern = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
    prompt = chat(tokenizer, "When did the Berlin Wall fall? Give the date.")
    ours = ll.generate(model, prompt, tokenizer=tokenizer, max_new_tokens=12, temperature=0,
                       constraint=Constraint(pattern, tokenizer))
    ids = tokenizer(prompt, return_tensors="pt")
    theirs = model.generate(**ids, max_new_tokens=12, do_sample=False,
                            logits_processor=LogitsProcessorList([Constraint(pattern, tokenizer)]))
    assert theirs[0, ids.input_ids.shape[1]:].tolist() == ours.new_tokens[0].tolist()
    assert re.fullmatch(pattern, ours.texts[0])


def test_the_constraint_arguments_of_generate(smollm):
    model, tokenizer = smollm
    prompt = chat(tokenizer, "Say yes.")
    date = Constraint(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", tokenizer)
    with pytest.raises(ValueError, match="max_new_tokens=3 is too few"):
        ll.generate(model, prompt, tokenizer=tokenizer, max_new_tokens=3, constraint=date)
    with pytest.raises(ValueError, match="one per prompt"):
        ll.generate(model, [prompt, prompt], tokenizer=tokenizer, max_new_tokens=12, constraint=[date])
    with pytest.raises(ValueError, match="forbids EOS"):
        ll.generate(model, prompt, tokenizer=tokenizer, max_new_tokens=8, min_new_tokens=4, temperature=0,
                    constraint=Constraint("(yes|no)", tokenizer))
    # One prompt constrained, the other free: the free one is what it would be alone.
    both = ll.generate(model, [prompt, prompt], tokenizer=tokenizer, max_new_tokens=6, temperature=0,
                       constraint=[Constraint("(yes|no)", tokenizer), None])
    alone = ll.generate(model, prompt, tokenizer=tokenizer, max_new_tokens=6, temperature=0)
    assert both.texts[0] in ("yes", "no") and both.new_tokens[1].tolist() == alone.new_tokens[0].tolist()


# -- Every loop: beam search, speculative decoding -------------------------------------------

TOY_VOCAB = [b"a", b"b", b"ab", b"c", None]  # token 4 is EOS
TOY_PATTERN = r"(a|b)+c?"


def masked_sequence_probs(model, prompt, length, config, constraint, eos=4):
    """Every continuation of up to ``length`` tokens and its exact probability under the
    model masked by ``constraint`` (with the token budget), then processed by ``config``."""
    from logitlab.constrained.constraint import mask_rows
    from logitlab.sampling.pipeline import process_logits
    probs = {}

    def grow(seq, state, prob):
        if len(seq) == length or (seq and seq[-1] == eos):
            probs[tuple(seq)] = probs.get(tuple(seq), 0.0) + prob
            return
        logits = model(torch.tensor([list(prompt) + seq])).logits[0, -1]
        masked = mask_rows([constraint], [state], logits[None], length - len(seq))
        dist = torch.softmax(process_logits(masked, config)[0], dim=-1)
        for token in range(len(dist)):
            if dist[token] > 0:
                grow(seq + [token], constraint.next_state(state, token), prob * dist[token].item())

    grow([], 0, 1.0)
    return probs


@pytest.mark.slow
@pytest.mark.parametrize("settings", [dict(temperature=1.0), dict(temperature=0.8, top_k=2)], ids=["T=1", "T=0.8 top-k 2"])
def test_speculative_decoding_reproduces_the_masked_target(settings):
    """Constrained drafts and a masked target: the loop's output follows the masked target
    exactly (chi-square, false-positive rate 1e-4 per test), like ``ll.generate``'s; the same
    samples fail against the unmasked target (the test can tell the two apart)."""
    from scipy.stats import chisquare
    from logitlab.speculative.draft_model import DraftModelDrafter
    from logitlab.sampling.pipeline import SamplingConfig
    target = ll.toy_model(vocab_size=5, order=2, seed=0)
    drafter = DraftModelDrafter(ll.toy_model(vocab_size=5, order=3, seed=9))
    constraint = Constraint(TOY_PATTERN, vocab=TOY_VOCAB, eos_token_id=4)
    rows = 10_000
    probs = masked_sequence_probs(target, [1, 2], 3, SamplingConfig(**settings), constraint)

    def pvalue(samples, expected):
        counts = {}
        for s in samples:
            counts[tuple(s.tolist())] = counts.get(tuple(s.tolist()), 0) + 1
        assert set(counts) <= set(expected), "an output of probability 0"
        keys, total = sorted(expected), sum(expected.values())
        return chisquare([counts.get(k, 0) for k in keys], [rows * expected[k] / total for k in keys]).pvalue

    spec = ll.speculative_generate(target, drafter, [[1, 2]], gamma=2, max_new_tokens=3, eos_token_id=[4],
                                   num_return_sequences=rows, generator=torch.Generator().manual_seed(0),
                                   constraint=constraint, **settings)
    plain = ll.generate(target, [[1, 2]], max_new_tokens=3, eos_token_id=[4], num_return_sequences=rows,
                        generator=torch.Generator().manual_seed(1), constraint=constraint, **settings)
    assert pvalue(spec.new_tokens, probs) > 1e-4
    assert pvalue(plain.new_tokens, probs) > 1e-4
    assert 0 < spec.alpha < 1
    unmasked = ll.generate(target, [[1, 2]], max_new_tokens=3, eos_token_id=[4], num_return_sequences=rows,
                           generator=torch.Generator().manual_seed(2), **settings)
    outside = sum(tuple(t.tolist()) not in probs for t in unmasked.new_tokens)
    assert outside > 50  # without the mask, many outputs are ones the constraint forbids


@pytest.mark.slow
def test_speculative_decoding_under_a_constraint_is_greedy_at_temperature_0(smollm):
    model, tokenizer = smollm
    from logitlab.speculative.draft_model import DraftModelDrafter, load_pretrained
    from logitlab.speculative.prompt_lookup import PromptLookupDrafter
    pattern = r'\{"name": "[A-Za-z ]{1,20}", "age": [0-9]{1,3}\}'
    prompts = [chat(tokenizer, "Describe a person as JSON with name and age."), chat(tokenizer, "Say yes or no.")]
    constraints = [Constraint(pattern, tokenizer), Constraint("(yes|no)", tokenizer)]
    plain = ll.generate(model, prompts, tokenizer=tokenizer, max_new_tokens=30, temperature=0, constraint=constraints)
    for drafter in (DraftModelDrafter(load_pretrained(model)), PromptLookupDrafter(len(tokenizer))):
        spec = ll.speculative_generate(model, drafter, prompts, tokenizer=tokenizer, gamma=4, max_new_tokens=30,
                                       temperature=0, constraint=constraints)
        assert [t.tolist() for t in spec.new_tokens] == [t.tolist() for t in plain.new_tokens]
    assert re.fullmatch(pattern, plain.texts[0]) and plain.texts[1] in ("yes", "no")


@pytest.mark.slow
def test_beam_search_under_a_constraint_equals_hugging_face(smollm):
    """Where Hugging Face's beams end on EOS, both searches return the same hypotheses with the
    same scores; where its beams run out of tokens inside the pattern, ours still match it
    (they finish within the budget)."""
    model, tokenizer = smollm
    for pattern, question in [(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", "When did the Berlin Wall fall? Give the date."),
                              (r"(positive|negative|neutral)", "Is 'I loved it' positive or negative?")]:
        prompt = chat(tokenizer, question)
        ours = ll.beam_search(model, prompt, tokenizer=tokenizer, num_beams=4, max_new_tokens=12,
                              num_return_sequences=4, constraint=Constraint(pattern, tokenizer))
        ids = tokenizer(prompt, return_tensors="pt")
        theirs = model.generate(**ids, num_beams=4, max_new_tokens=12, do_sample=False, num_return_sequences=4,
                                output_scores=True, return_dict_in_generate=True,
                                logits_processor=LogitsProcessorList([Constraint(pattern, tokenizer)]))
        for hyp, seq, score in zip(ours.hypotheses[0], theirs.sequences, theirs.sequences_scores):
            assert hyp.tokens.tolist() == seq[ids.input_ids.shape[1]:][:len(hyp.tokens)].tolist()
            assert hyp.score == pytest.approx(float(score), abs=1e-3)
            assert re.fullmatch(pattern, hyp.text)
    tight = r"[A-Z][a-z]+( [a-z]+){0,3}\."
    short = ll.beam_search(model, chat(tokenizer, "Name a fruit."), tokenizer=tokenizer, num_beams=4,
                           max_new_tokens=8, num_return_sequences=4, constraint=Constraint(tight, tokenizer))
    assert len(short.hypotheses[0]) == 4 and all(re.fullmatch(tight, h.text) for h in short.hypotheses[0])


# -- JSON Schema ---------------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0},
        "city": {"enum": ["Paris", "Tokyo", "Lima"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "score": {"type": "number"},
        "member": {"type": "boolean"},
        "address": {"type": "object", "properties": {"zip": {"type": ["integer", "null"]}}, "required": ["zip"]},
    },
    "required": ["name", "age", "city", "tags", "score", "member", "address"],
}


def test_json_schema_regex_accepts_valid_documents_and_rejects_others():
    from logitlab.constrained.json_schema import to_regex
    pattern = to_regex(PERSON)
    good = {"name": "Ana", "age": 31, "city": "Lima", "tags": ["a", "bé"], "score": -2.5e3, "member": True,
            "address": {"zip": None}}
    for separators in ((",", ":"), (", ", ": ")):
        assert re.fullmatch(pattern, json.dumps(good, separators=separators, ensure_ascii=False))
    bad = [dict(good, age=-1), dict(good, city="Rome"), dict(good, tags=["a"] * 4), dict(good, name=""),
           dict(good, tags=["toolongtag"]), dict(good, member="yes"), {k: good[k] for k in list(good)[::-1]}]
    for document in bad:
        assert not re.fullmatch(pattern, json.dumps(document, ensure_ascii=False)), document
    assert not re.fullmatch(pattern, json.dumps(good, indent=2))  # newlines are not in the default whitespace
    loose = to_regex(PERSON, whitespace=JSON_WHITESPACE)
    for indent in (2, "\t", "\r\n "):  # every JSON whitespace character, in any amount
        assert re.fullmatch(loose, json.dumps(good, indent=indent, ensure_ascii=False))
    for other in ("\v", "\f", "\u00a0"):  # whitespace to Python's \s, not to JSON
        text = json.dumps(good, indent=2, ensure_ascii=False).replace("\n", "\n" + other)
        assert not re.fullmatch(loose, text)
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)


def test_the_whitespace_may_match_only_json_whitespace():
    from logitlab.constrained.json_schema import to_regex
    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 1}
    assert to_regex(schema, whitespace=r"[ \t]?") == r"\[[ \t]?(-?(0|[1-9][0-9]*)([ \t]?,[ \t]?-?(0|[1-9][0-9]*)){0,0})?[ \t]?\]"
    for whitespace in (r"\s*", r"[ \v]?", r"\s?", "[ ]|x", r"[^a]*"):
        with pytest.raises(ValueError, match="whitespace must match only JSON's whitespace"):
            to_regex(schema, whitespace=whitespace)
    with pytest.raises(ValueError, match=r"whitespace: pattern '\(': missing"):
        to_regex(schema, whitespace="(")
    with pytest.raises(ValueError, match="whitespace must be a regular expression"):
        to_regex(schema, whitespace=None)


@pytest.mark.parametrize("schema,match", [
    ({"type": "object", "properties": {"a": {"type": "string"}}}, "optional properties"),
    ({"$ref": "#"}, "'\\$ref' is not supported"),
    ({"type": "string", "pattern": "a+"}, "'pattern' is not supported"),
    ({"type": "integer", "minimum": 5}, "minimum 5"),
    ({"type": "string", "format": "email"}, "format 'email'"),
    ({"type": "tuple"}, "type 'tuple'"),
    ({"type": "array", "minItems": 3, "maxItems": 1}, "maxItems is below"),
    ({"type": "array", "items": {"type": "array", "items": {"type": "array"}}}, "max_depth"),
    ("string", "must be a dict"),
    # A keyword the type does not honour raises, whether JSON Schema applies it to the type or not.
    ({"type": "number", "minimum": 0}, "'minimum' is not supported for type 'number' \\(it applies to it but"),
    ({"type": ["integer", "number"], "minimum": 0}, "'minimum' is not supported for type 'number'"),
    ({"type": "integer", "maxLength": 3}, "'maxLength' is not supported for type 'integer' \\(it does not apply"),
    ({"type": "boolean", "items": {"type": "string"}}, "'items' is not supported for type 'boolean'"),
    ({"type": "string", "minItems": 1}, "'minItems' is not supported for type 'string'"),
    ({"type": ["string", "null"], "minimum": 1}, "'minimum' applies to none of the types"),
    ({"type": "string", "format": "date", "maxLength": 4}, "'maxLength' beside format"),
    ({"enum": ["a", "b"], "maxLength": 1}, "'maxLength' beside const or enum"),
    ({"const": 3, "minimum": 5}, "'minimum' beside const or enum"),
    ({"enum": [1, "a"], "type": "integer"}, "the value 'a' is not of type 'integer'"),
    ({"const": 1, "enum": [1]}, "const and enum together"),
    ({"enum": []}, "enum must be a non-empty list"),
    ({"anyOf": [{"type": "string"}], "maxLength": 2}, "'maxLength' beside anyOf"),
    ({"anyOf": []}, "anyOf must be a non-empty list"),
    ({"type": []}, "non-empty list"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"]},
     "required names 'b', which is not in properties"),
    ({"type": "object", "required": ["a"]}, "required names 'a'"),
    ({"type": "object", "properties": {}, "additionalProperties": {"type": "string"}}, "additionalProperties must be"),
    ({"type": "string", "minLength": -1}, "minLength must be a whole number >= 0"),
    ({"type": "string", "maxLength": 2.5}, "maxLength must be a whole number"),
    ({"type": "string", "minLength": 3, "maxLength": 2}, "maxLength is below minLength"),
    ({"type": "integer", "minimum": True}, "minimum True"),
    ({"const": float("nan")}, "is not JSON"),
])
def test_schemas_outside_the_subset_raise(schema, match):
    from logitlab.constrained.json_schema import to_regex
    with pytest.raises(ValueError, match=match):
        to_regex(schema, max_depth=2)


def test_max_depth_is_checked():
    from logitlab.constrained.json_schema import to_regex
    with pytest.raises(ValueError, match="max_depth must be an integer >= 0"):
        to_regex({"type": "string"}, max_depth=-1)


def test_keywords_go_to_the_types_they_apply_to():
    from logitlab.constrained.json_schema import to_regex
    assert to_regex({"type": ["integer", "null"], "minimum": 1}) == "([1-9][0-9]*|null)"
    assert to_regex({"type": ["string", "null"], "maxLength": 2, "title": "t"}) == \
        '("' + to_regex({"type": "string"})[1:-2] + '{0,2}"|null)'
    assert to_regex({"type": "boolean", "description": "annotations change nothing"}) == "(true|false)"
    assert to_regex({"enum": [1, 2.0], "type": "integer"}) == "(1|2\\.0)"
    assert to_regex({"type": "object", "properties": {}, "additionalProperties": False}) == r"\{[ ]?[ ]?\}"


def test_no_surrogate_escape_is_written():
    """A pair of surrogate escapes is one character to JSON (and to ``minLength``), a lone one
    is not a character at all (UTF-8 cannot encode it), so string patterns write characters past
    U+FFFF as themselves."""
    from logitlab.constrained.json_schema import to_regex
    pattern = to_regex({"type": "string", "minLength": 2})
    pair = '"\\ud83d\\ude00"'
    assert len(json.loads(pair)) == 1 and not re.fullmatch(pattern, pair)
    assert not re.fullmatch(pattern, '"\\ud800x"') and not re.fullmatch(pattern, '"x\\uDFFF"')
    for text in ('"\\u00e9\\uD7FF"', '"\\uE000\U0001F600"', '"\\ucafe\\n"'):
        assert re.fullmatch(pattern, text) and len(json.loads(text)) == 2, text


def test_the_date_format_has_the_days_of_each_month():
    """Every day of every month of years around the leap-year rules, against ``datetime``."""
    import datetime
    from logitlab.constrained.json_schema import to_regex
    pattern = to_regex({"type": "string", "format": "date"})
    for year in (1, 4, 10, 100, 400, 1000, 1900, 1996, 2000, 2023, 2024, 2100, 2400, 9996, 9999):
        for month in range(0, 14):
            for day in range(0, 33):
                try:
                    valid = datetime.date(year, month, day) is not None
                except ValueError:
                    valid = False
                text = f'"{year:04d}-{month:02d}-{day:02d}"'
                assert bool(re.fullmatch(pattern, text)) == valid, text
    assert not re.fullmatch(pattern, '"0000-01-01"')  # Python's dates start at year 1
    assert re.fullmatch(pattern, '"0001-01-01"') and re.fullmatch(pattern, '"0400-02-29"')
    assert not re.fullmatch(pattern, '"0300-02-29"') and not re.fullmatch(pattern, '"2024-1-01"')


def random_matches(pattern: str, count: int, seed: int = 0, stop: float = 0.15, max_bytes: int = 120) -> list[str]:
    """``count`` strings that the byte automaton of ``pattern`` accepts, by random walks: at each
    state a random next state, then a random byte that leads there; once ``max_bytes`` are out,
    only moves that bring an accepting state closer."""
    dfa = compile_regex(pattern)
    table = dfa.table.tolist()
    distance = [0 if a else None for a in dfa.accepting.tolist()]  # fewest bytes to an accepting state
    changed = True
    while changed:
        changed = False
        for state, row in enumerate(table):
            best = min((distance[n] + 1 for n in row if n >= 0 and distance[n] is not None), default=None)
            if best is not None and (distance[state] is None or best < distance[state]):
                distance[state], changed = best, True
    rng, out = random.Random(seed), []
    for _ in range(count):
        state, data = 0, bytearray()
        while True:
            moves = {}
            for byte, nxt in enumerate(table[state]):
                if nxt >= 0 and (len(data) < max_bytes or distance[nxt] < distance[state]):
                    moves.setdefault(nxt, []).append(byte)
            if distance[state] == 0 and (not moves or rng.random() < stop):
                break
            byte = rng.choice(moves[rng.choice(sorted(moves))])
            data.append(byte)
            state = table[state][byte]
        out.append(data.decode())
    return out


NESTED = {"type": "object", "properties": {
    "when": {"type": "string", "format": "date"},
    "id": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "minLength": 2, "maxLength": 4}]},
    "kind": {"enum": ["a\"b", 3, None, True, [1, "x"], {"k": "é"}]},
    "fixed": {"const": {"x": [1.5]}},
    "grid": {"type": "array", "minItems": 1, "maxItems": 2,
             "items": {"type": "array", "items": {"type": ["number", "null"]}, "maxItems": 3}},
    "note": {"type": ["string", "boolean"], "maxLength": 3}},
    "required": ["when", "id", "kind", "fixed", "grid", "note"], "additionalProperties": False}


@pytest.mark.parametrize("schema", [PERSON, NESTED], ids=["person", "nested"])
@pytest.mark.parametrize("whitespace", [r"[ ]?", JSON_WHITESPACE])
def test_every_string_the_pattern_matches_parses_and_validates(schema, whitespace):
    """An oracle without a model: random strings that the compiled pattern accepts are read by
    ``json.loads`` and pass ``jsonschema`` (formats checked too)."""
    import jsonschema
    from logitlab.constrained.json_schema import to_regex
    pattern = to_regex(schema, whitespace=whitespace)
    texts = random_matches(pattern, 150)
    checker = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    for text in texts:
        assert re.fullmatch(pattern, text)
        checker.validate(json.loads(text))
    assert len(set(texts)) > 140  # the walks reach many different documents
    if whitespace == JSON_WHITESPACE:  # and they use all four whitespace characters
        assert set(" \t\n\r") <= {c for text in texts for c in text if c.isspace()} - {"\xa0"}


@pytest.mark.slow
def test_every_sampled_json_document_parses_and_validates(smollm):
    jsonschema = pytest.importorskip("jsonschema")
    from logitlab.constrained.json_schema import to_regex
    model, tokenizer = smollm
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0},
        "city": {"enum": ["Paris", "Tokyo", "Lima"]}, "pets": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                                                "maxItems": 2}},
        "required": ["name", "age", "city", "pets"]}
    out = ll.generate(model, chat(tokenizer, "Describe a person as JSON."), tokenizer=tokenizer, max_new_tokens=48,
                      temperature=1.0, num_return_sequences=100, generator=ll.generator(model, seed=0),
                      constraint=Constraint(to_regex(schema), tokenizer))
    for text in out.texts:
        jsonschema.validate(json.loads(text), schema)
    assert len(set(out.texts)) > 50


# -- Masking is not conditioning -------------------------------------------------------------

def test_equal_z_i_at_every_step_do_not_make_masking_conditioning():
    """Chapter 11's counterexample, exactly: outputs A+EOS and AB+EOS, every Z_i = 1/2. The model
    gives them 1/8 and 1/16 (conditioned: 2/3 and 1/3), masking 1/2 each, and the ratio of the two
    is Z / prod Z_i along each output."""
    from logitlab.measure.conditioning import path_probabilities, token_paths
    from logitlab.toy import NGramLM
    probs = torch.zeros(5, 4)  # a bigram table: tokens A, B, C, EOS; row 4 is the empty history
    probs[3] = probs[4] = torch.tensor([1 / 2, 0, 1 / 2, 0])  # the start (after the prompt's EOS)
    probs[0] = torch.tensor([0, 1 / 4, 1 / 2, 1 / 4])          # after A
    probs[1] = torch.tensor([0, 0, 1 / 2, 1 / 2])              # after B
    probs[2] = torch.tensor([1 / 4, 1 / 4, 1 / 4, 1 / 4])      # after C
    model = NGramLM(probs.double().log())
    constraint = Constraint("AB?", vocab=[b"A", b"B", b"C", None], eos_token_id=3)
    paths = token_paths(constraint)
    assert paths == [(0,), (0, 1)]
    model_p, masked_p = path_probabilities(model, [3], constraint, paths)
    assert torch.allclose(model_p.double(), torch.tensor([1 / 8, 1 / 16], dtype=torch.float64), atol=1e-6)
    assert torch.allclose(masked_p.double(), torch.tensor([1 / 2, 1 / 2], dtype=torch.float64), atol=1e-6)
    z = model_p.sum()
    conditional = model_p / z
    assert torch.allclose(conditional.double(), torch.tensor([2 / 3, 1 / 3], dtype=torch.float64), atol=1e-6)
    products = torch.tensor([1 / 2 ** 2, 1 / 2 ** 3])  # prod Z_i along A+EOS and AB+EOS
    assert torch.allclose(masked_p / conditional, z / products, atol=1e-6)


@pytest.mark.slow
def test_masking_and_conditioning_are_each_what_sampling_gives_and_they_differ():
    """On the toy model, for a pattern with 14 token sequences: constrained sampling follows
    ``path_probabilities``' masked distribution, rejection sampling of unconstrained outputs
    follows its conditional one (chi-square, 1e-4 each), and the two are far apart."""
    from scipy.stats import chisquare
    from logitlab.measure.conditioning import path_probabilities, token_paths
    toy = ll.toy_model(vocab_size=5, order=2, seed=0)
    constraint = Constraint(r"(a|b){1,2}c?", vocab=TOY_VOCAB, eos_token_id=4)
    paths = token_paths(constraint, max_tokens=4)
    model_p, masked_p = path_probabilities(toy, [1, 2], constraint, paths)
    conditional = model_p / model_p.sum()
    index = {path + (4,): i for i, path in enumerate(paths)}

    def counts(samples):
        found = torch.zeros(len(paths))
        for s in samples:
            found[index[tuple(s.tolist())]] += 1
        return found

    masked = ll.generate(toy, [[1, 2]], max_new_tokens=5, eos_token_id=[4], num_return_sequences=20_000,
                         generator=torch.Generator().manual_seed(0), constraint=constraint)
    seen = counts(masked.new_tokens)
    assert chisquare(seen, seen.sum() * masked_p).pvalue > 1e-4
    free = ll.generate(toy, [[1, 2]], max_new_tokens=5, eos_token_id=[4], num_return_sequences=100_000,
                       generator=torch.Generator().manual_seed(1))
    kept = [s for s in free.new_tokens if tuple(s.tolist()) in index]  # rejection sampling: whole outputs
    seen = counts(kept)
    assert len(kept) > 3000 and chisquare(seen, seen.sum() * conditional).pvalue > 1e-4
    assert 0.5 * (masked_p - conditional).abs().sum() > 0.1


class _BytesTokenizer:
    """Just enough of a tokenizer for ll.viz.constraint_steps: each token is one entry of ``vocab``."""

    def __init__(self, vocab):
        self.vocab = vocab

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self.vocab.index(ch.encode()) for ch in text]}

    def decode(self, ids):
        return b"".join(self.vocab[i] or b"" for i in ids).decode()


def test_constraint_steps_walk_a_text_and_stop_at_the_first_forbidden_token():
    from logitlab.figures.viz import constraint_steps

    vocab = [b"a", b"b", b"ab", None, b"abb", b"ba"]
    c = Constraint("ab", vocab=vocab, eos_token_id=3)
    rows = constraint_steps(c, _BytesTokenizer(vocab), "ab").data.splitlines()[2:]
    assert rows[0].startswith("| 0 | (empty) | 2 | a ab | no |")  # nothing written yet: "a" or "ab"
    assert rows[1].startswith("| 1 | `a` | 1 | b | no |")
    assert rows[2].startswith("| 2 | `ab` | 1 |  | yes |")  # only EOS, which is not listed
    forbidden = constraint_steps(c, _BytesTokenizer(vocab), "b").data.splitlines()[2:]
    assert forbidden[-1].startswith("| 1 | `b` | 0 | b is not allowed here | no |")
