"""Prompt tokens: the ids a synthetic prompt is drawn from, and prompts spelled as text.

Prompts are token-id tuples; ids are uniform in ``[MIN_TOKEN_ID, vocab_size - MIN_TOKEN_ID)``
so they stay clear of the special tokens most tokenizers keep at either end of the
vocabulary. The chat API needs text: :func:`token_ids_to_text` spells ids as words, and
:func:`text_token_ids` reads a text prompt back as the simulated engine does.
"""

from __future__ import annotations

import zlib

__all__ = ["MIN_TOKEN_ID", "check_vocab", "text_token_ids", "token_ids_to_text"]

# Ids below this (and the last ``MIN_TOKEN_ID`` of the vocabulary) are never drawn.
MIN_TOKEN_ID = 10


def token_ids_to_text(ids) -> str:
    """Spell token ids as text for the chat API: id 123 becomes the word ``t123``.

    This is a WordLevel-style mapping (one word per id, joined by spaces). A real
    tokenizer splits these words into a different number of tokens, and the chat
    template adds its own, so the server's prompt length differs from
    ``len(ids)``; metrics use the server's ``usage.prompt_tokens``, never this count.
    """
    return " ".join([f"t{i}" for i in ids])


def text_token_ids(text: str, vocab_size: int) -> tuple[int, ...]:
    """The word-level encoding of a text prompt, as the simulated engine reads it.

    Word ``t123`` is id 123 (the inverse of :func:`token_ids_to_text`); any other word
    is its CRC-32 modulo the vocabulary size.
    """
    ids = []
    for w in text.split():
        if w[:1] == "t" and w[1:].isdigit():
            ids.append(int(w[1:]) % vocab_size)
        else:
            ids.append(zlib.crc32(w.encode()) % vocab_size)
    return tuple(ids) or (0,)


def check_vocab(vocab_size: int) -> None:
    if vocab_size < 2 * MIN_TOKEN_ID + 1:
        raise ValueError(f"vocab_size must be at least {2 * MIN_TOKEN_ID + 1}, got {vocab_size}")

