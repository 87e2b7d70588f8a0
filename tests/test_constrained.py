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
from logitlab.constrained import Constraint, vocabulary_bytes
from logitlab.regex_automaton import compile_regex, utf8_ranges

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
        assert dfa.matches(s.encode()) == bool(re.fullmatch(pattern, s)), (pattern, s)


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
    (r"\p{L}", "escape"), ("a{2000}", "counts above"), (r"[^\s\S]", "matches no string"), (3, "must be a str"),
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

@pytest.fixture(scope="module")
def smollm2():
    return ll.load("smollm2-135m", device="cpu")


def test_vocabulary_bytes_decode_like_the_tokenizer(smollm2):
    _, tokenizer = smollm2
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
def test_allowed_sets_equal_outlines_core(smollm2, pattern):
    """Along 12 random walks, our allowed set equals outlines-core's at every state, with one
    exception, checked token by token: outlines-core (0.2.14) leaves out every token whose
    walk passes an accepting state and then ends in a state that is not accepting, although a
    match can follow it ("." after "5" for a decimal number; a lead byte alone where any
    character may follow). Each such extra token of ours is shown completable: its bytes, then
    the shortest bytes our automaton finds to an accepting state, make a string that
    ``re.fullmatch`` accepts (checked for every seventh such token)."""
    outlines_core = pytest.importorskip("outlines_core")
    _, tokenizer = smollm2
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
                assert any(dfa.accepting[s] for s in visited[:-1]) and not dfa.accepting[visited[-1]], \
                    (pattern, text, vocab[extra])
                assert re.fullmatch(pattern, (text + vocab[extra] + tails[visited[-1]]).decode()), (text, extra)
            states += 1
            choices = sorted(mine - {tokenizer.eos_token_id} & their_set)
            if not choices:
                break
            token = rng.choice(choices)
            state, theirs, text = ours.next_state(state, token), oracle.get_next_state(theirs, token), text + vocab[token]
    assert states >= 12


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
def test_every_sampled_output_matches_its_pattern(smollm2):
    """200 samples per prompt at T = 1.5 (which wanders far from the pattern on its own),
    three prompts with three different constraints in one batch, 12 tokens at most: every
    output fullmatches its pattern, also those that the budget ended."""
    model, tokenizer = smollm2
    patterns = [r"(positive|negative|neutral)", r"[0-9]{4}-[0-9]{2}-[0-9]{2}", r"[A-Z][a-z]+( [a-z]+){0,3}\."]
    questions = ["Is 'I loved it' positive or negative?", "When did the Berlin Wall fall?", "Name a fruit."]
    out = ll.generate(model, [chat(tokenizer, q) for q in questions], tokenizer=tokenizer, max_new_tokens=12,
                      temperature=1.5, num_return_sequences=200, generator=ll.generator(model, seed=0),
                      constraint=[Constraint(p, tokenizer) for p in patterns])
    for prompt, tokens in zip(out.prompt_index, out.new_tokens):
        text = tokenizer.decode([t for t in tokens.tolist() if t != tokenizer.eos_token_id])
        assert re.fullmatch(patterns[prompt], text), (patterns[prompt], text)
    assert len(set(out.texts)) > 20  # sampled, not one answer repeated


def test_greedy_constrained_output_equals_hugging_face_with_the_processor(smollm2):
    model, tokenizer = smollm2
    pattern = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
    prompt = chat(tokenizer, "When did the Berlin Wall fall? Give the date.")
    ours = ll.generate(model, prompt, tokenizer=tokenizer, max_new_tokens=12, temperature=0,
                       constraint=Constraint(pattern, tokenizer))
    ids = tokenizer(prompt, return_tensors="pt")
    theirs = model.generate(**ids, max_new_tokens=12, do_sample=False,
                            logits_processor=LogitsProcessorList([Constraint(pattern, tokenizer)]))
    assert theirs[0, ids.input_ids.shape[1]:].tolist() == ours.new_tokens[0].tolist()
    assert re.fullmatch(pattern, ours.texts[0])


def test_the_constraint_arguments_of_generate(smollm2):
    model, tokenizer = smollm2
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
    from logitlab.constrained import mask_rows
    from logitlab.sampling import process_logits
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
    from logitlab.drafters import DraftModelDrafter
    from logitlab.sampling import SamplingConfig
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
def test_speculative_decoding_under_a_constraint_is_greedy_at_temperature_0(smollm2):
    model, tokenizer = smollm2
    from logitlab.drafters import DraftModelDrafter, PromptLookupDrafter, load_pretrained
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
def test_beam_search_under_a_constraint_equals_hugging_face(smollm2):
    """Where Hugging Face's beams end on EOS, both searches return the same hypotheses with the
    same scores; where its beams run out of tokens inside the pattern, ours still match it
    (they finish within the budget)."""
    model, tokenizer = smollm2
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
    from logitlab.json_schema import to_regex
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
    assert re.fullmatch(to_regex(PERSON, whitespace=r"\s*"), json.dumps(good, indent=2))


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
])
def test_schemas_outside_the_subset_raise(schema, match):
    from logitlab.json_schema import to_regex
    with pytest.raises(ValueError, match=match):
        to_regex(schema, max_depth=2)


@pytest.mark.slow
def test_every_sampled_json_document_parses_and_validates(smollm2):
    jsonschema = pytest.importorskip("jsonschema")
    from logitlab.json_schema import to_regex
    model, tokenizer = smollm2
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0},
        "city": {"enum": ["Paris", "Tokyo", "Lima"]}, "pets": {"type": "array", "items": {"type": "string", "maxLength": 8},
                                                                "maxItems": 2}},
        "required": ["name", "age", "city", "pets"]}
    out = ll.generate(model, chat(tokenizer, "Describe a person as JSON."), tokenizer=tokenizer, max_new_tokens=48,
                      temperature=1.0, num_return_sequences=200, generator=ll.generator(model, seed=0),
                      constraint=Constraint(to_regex(schema), tokenizer))
    for text in out.texts:
        jsonschema.validate(json.loads(text), schema)
    assert len(set(out.texts)) > 100


# -- Masking is not conditioning -------------------------------------------------------------

@pytest.mark.slow
def test_masking_and_conditioning_are_each_what_sampling_gives_and_they_differ():
    """On the toy model, for a pattern with 14 token sequences: constrained sampling follows
    ``path_probabilities``' masked distribution, rejection sampling of unconstrained outputs
    follows its conditional one (chi-square, 1e-4 each), and the two are far apart."""
    from scipy.stats import chisquare
    from logitlab.conditioning import path_probabilities, token_paths
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
