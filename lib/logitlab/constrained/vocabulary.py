"""A tokenizer's vocabulary as bytes: what a byte automaton walks (chapter 11).

Byte-level BPE tokenizers (SmolLM2's, GPT-2's) store each token as printable characters that
stand for bytes; these functions turn them back into the bytes the token writes.
"""

from __future__ import annotations


def byte_decoder() -> dict[str, int]:
    """Byte-level BPE writes each byte as one printable character (GPT-2's table): the bytes
    that are printable Latin-1 characters stand for themselves, the other 68 are shifted to
    the characters from U+0100 on. This is the inverse: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, shifted = {chr(b): b for b in printable}, 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


def vocabulary_bytes(tokenizer) -> list[bytes | None]:
    """The bytes of every token of a byte-level BPE tokenizer; ``None`` for special tokens
    (they are not text, so no pattern can contain them)."""
    decoder = byte_decoder()
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    vocab = []
    for token_id, piece in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        if token_id in special or piece is None:
            vocab.append(None)
        elif all(char in decoder for char in piece):
            vocab.append(bytes(decoder[char] for char in piece))
        else:
            raise ValueError(f"tokenizer must be a byte-level BPE tokenizer (token {token_id} is {piece!r}); "
                             "pass vocab= with the bytes of every token instead")
    return vocab
