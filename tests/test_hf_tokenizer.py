"""``hf:PATH`` tokenizers: identity from content, uint32 shards above 65536 tokens, HF round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("tokenizers")
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import models, pre_tokenizers

from rove.data import get_tokenizer, load_split_tokens, prepare_dataset
from rove.data.prepare import default_data_dir
from rove.data.prepare import main as prepare_main
from rove.data.shards import read_shard, write_shard

EOT = "<|endoftext|>"


def word_tokenizer(folder, n_words: int, eos_config: bool = False) -> str:
    """A word-level ``tokenizer.json`` with ``n_words`` words ``w0 .. w{n-1}``, EOT last."""
    vocab = {f"w{i}": i for i in range(n_words)} | {"[UNK]": n_words, EOT: n_words + 1}
    raw = RawTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.add_special_tokens([EOT])
    folder.mkdir(parents=True, exist_ok=True)
    raw.save(str(folder / "tokenizer.json"))
    if eos_config:
        (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "[UNK]"}))
    return f"hf:{folder}"


def test_identity_follows_content_not_path(tmp_path):
    a = get_tokenizer(word_tokenizer(tmp_path / "a", 10))
    b = get_tokenizer(word_tokenizer(tmp_path / "b", 10))
    c = get_tokenizer(word_tokenizer(tmp_path / "c", 11))
    assert a.identity() == b.identity() != c.identity()
    assert a.name == f"hf:{a.fingerprint()[:12]}" and len(a.fingerprint()) == 64
    assert (a.vocab_size, a.eot_token) == (12, 11)
    assert a.encode("w3 w7 x w1") == [3, 7, 10, 1]  # unknown word: [UNK]
    assert a.decode([3, 7, 11]) == f"w3 w7 {EOT}"
    eos = get_tokenizer(word_tokenizer(tmp_path / "d", 10, eos_config=True))
    assert eos.eot_token == 10  # tokenizer_config.json's eos_token wins


def test_bad_hf_tokenizers_are_named(tmp_path):
    with pytest.raises(ValueError, match="not a file"):
        get_tokenizer(f"hf:{tmp_path / 'missing'}")
    raw = RawTokenizer(models.WordLevel({"x": 0, "[UNK]": 1}, unk_token="[UNK]"))
    (tmp_path / "e").mkdir()
    raw.save(str(tmp_path / "e" / "tokenizer.json"))
    with pytest.raises(ValueError, match="no end-of-text token"):
        get_tokenizer(f"hf:{tmp_path / 'e'}")


def test_uint32_shards_round_trip(tmp_path):
    tokens = np.array([0, 65535, 65536, 2**32 - 1], dtype=np.uint32)
    write_shard(tmp_path / "s.bin", tokens, np.dtype("<u4"))
    header = np.fromfile(tmp_path / "s.bin", dtype="<i4", count=3)
    assert header.tolist() == [20240520, 2, 4]
    out = read_shard(tmp_path / "s.bin", 4)
    assert out.dtype == np.uint32 and out.tolist() == tokens.tolist()
    with pytest.raises(ValueError, match="fit uint16"):
        write_shard(tmp_path / "t.bin", tokens)
    with pytest.raises(ValueError, match="uint16 or uint32"):
        write_shard(tmp_path / "t.bin", tokens, np.dtype("<i8"))


@pytest.mark.parametrize(("n_words", "dtype"), [(100, np.uint16), (70_000, np.uint32)])
def test_prepare_with_hf_tokenizer(tmp_path, n_words, dtype):
    name = word_tokenizer(tmp_path / "tok", n_words)
    tok = get_tokenizer(name)
    docs = [" ".join(f"w{(7 * d + 13 * i) % n_words}" for i in range(20)) for d in range(6)]
    src = tmp_path / "corpus.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    out = prepare_dataset(str(src), tmp_path / "data", name, val_fraction=0.5, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"] == tok.identity()
    val = load_split_tokens(out, "val")
    assert val.dtype == dtype
    expected = [t for d in docs[::2] for t in [tok.eot_token, *tok.encode(d)]]
    assert val.tolist() == expected
    version = np.fromfile(out / manifest["splits"]["val"][0]["file"], dtype="<i4", count=2)[1]
    assert version == (1 if dtype == np.uint16 else 2)  # llm.c's header where it fits


def test_prepare_cli_and_default_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROVE_DATA_DIR", str(tmp_path / "cache"))
    name = word_tokenizer(tmp_path / "tok", 70_000)
    src = tmp_path / "c.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("w1 w69999", "w3", "w5 w2")))
    argv = ["--source", str(src), "--tokenizer", name, "--val-fraction", "0.5", "--no-progress"]
    assert prepare_main(argv) == 0
    folder = default_data_dir(str(src), name, val_fraction=0.5)
    # named by the tokenizer's content hash (then the dataset fingerprint), not by its path
    assert f"-{get_tokenizer(name).name.replace(':', '-')}-" in folder.name
    assert f"tokenizer  {get_tokenizer(name).name} (vocab 70002" in capsys.readouterr().out
    assert (
        69999
        in load_split_tokens(folder, "train").tolist() + load_split_tokens(folder, "val").tolist()
    )


def test_hf_form_of_an_hf_tokenizer(tmp_path):
    pytest.importorskip("transformers")
    from transformers import AutoTokenizer

    from rove.hf.tokenizer import hf_tokenizer

    tok = get_tokenizer(word_tokenizer(tmp_path / "tok", 50))
    hf_tokenizer(tok).save_pretrained(tmp_path / "out")
    back = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert back("w1 w49 w3", add_special_tokens=False)["input_ids"] == tok.encode("w1 w49 w3")
    assert back.eos_token_id == tok.eot_token
