"""Pre/postprocessing text logic: the light tokenizer equals transformers', UTF-8 checks, and streamed text that is
exact for multi-byte characters split across tokens and responses."""

from __future__ import annotations

import pytest

from trtspec.errors import GenerationError
from trtspec.triton_repo.text import Postprocessor, Preprocessor, decode_text, load_tokenizer

TEXTS = ["The quick brown fox", "Zürich, naïve café, 東京, emoji 🙂 and more", "def add(a, b):\n    return a + b"]


@pytest.fixture(scope="module")
def toks(tiny_tokenizer):
    from transformers import AutoTokenizer

    return load_tokenizer(tiny_tokenizer), AutoTokenizer.from_pretrained(tiny_tokenizer)


def test_light_tokenizer_matches_transformers(toks):
    light, hf = toks
    for text in TEXTS:
        ids = hf.encode(text)
        assert light.encode(text) == ids
        assert light.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert light.eos_token_id == hf.eos_token_id and light.pad_token_id == hf.pad_token_id


def test_streamed_deltas_concatenate_to_the_full_text_for_split_multibyte_characters(toks):
    light, _ = toks
    post = Postprocessor(light)
    text = "Zürich 東京 🙂 naïve"
    ids = light.encode(text)
    pieces = [light.decode([i]) for i in ids]
    assert any("\ufffd" in p for p in pieces)  # some characters are split across tokens
    for step, context in ((1, 32), (2, 32), (3, 3), (1, 3)):  # 3 tokens of context suffice (see _stable)
        # What the orchestrator sends: a window of recent tokens and how many of them earlier responses covered.
        out, sent = [], 0
        for end in range(step, len(ids) + step, step):
            end = min(end, len(ids))
            start = max(0, sent - context)
            out.append(post.delta(ids[start:end], sent - start, final=end == len(ids)))
            sent = end
        assert "".join(out) == text, (step, context, out)
        assert all("\ufffd" not in o for o in out)


def test_invalid_bytes_mid_stream_are_delivered_not_held_back(toks):
    light, _ = toks
    post = Postprocessor(light)
    partial = next(i for i in light.encode("Zürich 東京 🙂") if light.decode([i]).endswith("\ufffd"))
    stray = [partial, partial] + light.encode("ab")  # two broken characters, then text
    assert post.decode(stray).count("\ufffd") >= 2
    assert post.delta(stray, 0, final=False) == post.decode(stray)
    assert post.delta(stray[:2], 0, final=False) == post.decode(stray[:2])[:-1]  # only the last one may complete


def test_final_response_flushes_an_incomplete_character(toks):
    light, _ = toks
    post = Postprocessor(light)
    ids = light.encode("🙂")
    partial = ids[:-1]
    assert post.delta(partial, 0, final=False) == post.decode(partial).rstrip("\ufffd")
    assert post.delta(partial, 0, final=True) == post.decode(partial)


def test_preprocessor_rejects_invalid_utf8_and_tokenizes_word_lists(toks):
    light, hf = toks
    pre = Preprocessor(light)
    with pytest.raises(GenerationError, match="not valid UTF-8"):
        decode_text(b"\xff\xfe oops")
    assert pre.words([b"", b"fox", "the lazy".encode()], "stop_words") == [hf.encode("fox"), hf.encode("the lazy")]
    with pytest.raises(GenerationError, match="chat template"):
        pre.encode("hi", chat=True)  # the tiny tokenizer has none
    assert pre.end_id == hf.eos_token_id
