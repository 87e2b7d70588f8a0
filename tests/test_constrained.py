"""Constrained decoding: the byte automaton against Python's ``re``, exact token indexes on
hand-made vocabularies, ``outlines-core`` as an oracle on the real vocabulary, and every output
of the decoding loops checked with ``re.fullmatch``."""

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
