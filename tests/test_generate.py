"""``rove generate``: the sampler's filters, and streamed generation from run and export folders."""

from __future__ import annotations

import io
import json

import pytest
import torch

from rove.data import get_tokenizer
from rove.generate import filter_logits, generate_samples, generate_text, main, sample_next
from rove.model import GPT, GPTConfig
from run_folders import save_byte_run


def test_top_k_and_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([0.05, 0.5, 0.3, 0.15]))
    kept = lambda out: torch.isfinite(out).nonzero().flatten().tolist()  # noqa: E731
    assert kept(filter_logits(logits, top_k=2)) == [1, 2]
    assert kept(filter_logits(logits, top_p=0.5)) == [1]  # 0.5 alone reaches 0.5
    assert kept(filter_logits(logits, top_p=0.6)) == [1, 2]
    assert kept(filter_logits(logits, top_p=0.96)) == [0, 1, 2, 3]
    assert kept(filter_logits(logits, top_k=3, top_p=0.84)) == [1, 2]  # renormalised: 0.842
    assert kept(filter_logits(logits, top_k=3, top_p=0.85)) == [1, 2, 3]
    gen = torch.Generator().manual_seed(0)
    draws = {sample_next(logits, 1.0, top_p=0.6, generator=gen) for _ in range(200)}
    assert draws == {1, 2}
    assert sample_next(logits, 0.0) == 1
    for bad in ({"top_k": 0}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ValueError):
            filter_logits(logits, **bad)
    with pytest.raises(ValueError, match="temperature"):
        sample_next(logits, -1.0)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    torch.manual_seed(0)
    # vocabulary padded past the byte tokenizer's 257, as the presets do
    cfg = GPTConfig(vocab_size=320, block_size=16, n_layer=2, n_head=2, n_embd=32, pos="rove")
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return save_byte_run(tmp_path_factory.mktemp("gen") / "run", model), model


class Chunks(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.chunks: list[str] = []

    def write(self, text: str) -> int:
        self.chunks.append(text)
        return super().write(text)


def test_greedy_run_and_export_stream_rove_generate(run_dir, tmp_path):
    run, model = run_dir
    byte = get_tokenizer("byte")
    ids, new = [byte.eot_token, *byte.encode("hello")], []
    with torch.no_grad():  # uncached greedy reference over the tokenizer's ids only
        for _ in range(20):
            token = int(model(torch.tensor([ids + new]))[0, -1, :257].argmax())
            if token == byte.eot_token:
                break
            new.append(token)
    expected = byte.decode(new)
    out = Chunks()
    text = generate_text(run, "hello", max_tokens=20, temperature=0, out=out)
    assert text == expected == out.getvalue()
    assert len(out.chunks) > 1  # streamed, not written once at the end
    pytest.importorskip("transformers")
    from rove.hf.export import export_run

    export_run(run, tmp_path / "export")
    assert generate_text(tmp_path / "export", "hello", max_tokens=20, temperature=0) == expected


def test_sampling_is_seeded_and_yarn_applies(run_dir, tmp_path, capsys):
    run, _ = run_dir
    kwargs = dict(max_tokens=30, temperature=1.0, top_k=50, top_p=0.9, seed=3)
    first = generate_text(run, "ab", **kwargs)
    assert first == generate_text(run, "ab", **kwargs)
    greedy = dict(max_tokens=8, temperature=0)
    long = generate_text(run, "x" * 40, scaling="yarn", scaling_factor=4.0, **greedy)
    assert long != generate_text(run, "x" * 40, **greedy)  # 48 > 16 tokens
    assert main([str(run), "--prompt", "ab", "--max-tokens", "5", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.strip() == generate_text(run, "ab", max_tokens=5, temperature=0)
    flags = ["--max-tokens", "8", "--temperature", "0"]
    assert main([str(run), "--prompt", "x" * 40, *flags, "--scaling", "yarn",
                 "--scaling-factor", "4"]) == 0  # fmt: skip
    captured = capsys.readouterr()
    assert captured.out.strip() == long.strip() and "deprecated" not in captured.err
    # the old spelling: the same sample, and one line naming the new one
    assert main([str(run), "--prompt", "x" * 40, *flags, "--yarn-factor", "4"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == long.strip()
    assert "rove generate: --yarn-factor is deprecated and will be removed; use --scaling yarn " \
        "--scaling-factor F" in captured.err  # fmt: skip
    assert main([str(run), "--prompt", "ab", "--scaling", "ntk", "--scaling-factor", "0.5"]) == 2
    assert "scaling_factor must be > 1" in capsys.readouterr().err
    assert main([str(run), "--prompt", "ab", "--scaling", "ntk"]) == 2
    assert "--scaling KIND and --scaling-factor F go together" in capsys.readouterr().err
    assert main([str(tmp_path / "missing"), "--prompt", "ab"]) == 2


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_under_dynamic_ntk_equals_one_forward_over_the_final_sequence(use_cache):
    """Dynamic NTK's frequencies follow the length; ``GPT.generate`` pins them to prompt + new
    tokens, the length of a plain forward over the final sequence. So every generated token is
    the argmax of that one uncached forward at the position before it. The prompt is already past
    the training length, so a pin at the prompt length alone gives other frequencies (and other
    tokens), cached or not."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=32, pos="rove")
    model = GPT(cfg).eval().double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    prompt = torch.randint(0, 64, (2, 12))
    with model.rope_scaling("dynamic-ntk", 4.0):
        out = model.generate(prompt, 12, use_cache=use_cache)  # final length 24 = 3 x 8
        with torch.no_grad():
            full = model(out)  # unpinned: the length of this forward, 24
    assert torch.equal(out[:, 12:], full[:, 11:-1].argmax(-1))


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--temperature", "nan"], "temperature must be a finite number >= 0, got nan"),
        (["--temperature", "inf"], "temperature must be a finite number >= 0, got inf"),
        (["--top-p", "nan"], "top_p must be in (0, 1], got nan"),
        (["--top-k", "0"], "top_k must be >= 1"),
        (["--max-tokens", "0"], "max_tokens must be >= 1"),
        (["--num-samples", "0"], "num_samples must be >= 1"),
        (["--device", "tpu"], "device 'tpu' cannot be used here"),
    ],
)
def test_bad_settings_are_one_line_before_loading(run_dir, capsys, flags, needle):
    run, _ = run_dir
    assert main([str(run), "--prompt", "ab", *flags]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [lines[-1]] and lines[-1].startswith("rove generate: error: "), err
    assert needle in lines[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_this_machine_lacks_is_one_line(run_dir, capsys):
    assert main([str(run_dir[0]), "--prompt", "ab", "--device", "cuda"]) == 2
    assert "device 'cuda' cannot be used here" in capsys.readouterr().err


def test_a_huge_budget_allocates_the_cache_as_it_goes(run_dir, monkeypatch):
    """``--max-tokens 1000000000`` once allocated a 256 GB cache up front: the cache now grows
    with the tokens (and growing keeps every cached entry: logits equal an uncached forward)."""
    import rove.generate as gen
    from rove.kv_cache import KVCache

    _, model = run_dir
    sizes: list[int] = []

    class Recording(KVCache):
        def __init__(self, *args, **kwargs):
            sizes.append(args[4])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr("rove.kv_cache.KVCache", Recording)
    monkeypatch.setattr(gen, "CACHE_CHUNK", 2)
    step = gen._rove_steps(model, 10**9)
    ids = torch.randint(0, 257, (1, 24))
    with torch.no_grad():
        logits = [step(ids[:, :3])] + [step(ids[:, t : t + 1]) for t in range(3, 24)]
        full = model(ids)[0]
    torch.testing.assert_close(torch.stack(logits), full[2:], rtol=1e-5, atol=1e-5)
    assert sizes == [5, 10, 20, 40]  # 3 + 2, then doubled as it filled


def test_learned_positions_refuse_a_budget_past_the_table(tmp_path, capsys):
    cfg = GPTConfig(vocab_size=257, block_size=16, n_layer=1, n_head=2, n_embd=16, pos="learned")
    run = save_byte_run(tmp_path / "run", GPT(cfg).eval())
    assert main([str(run), "--prompt", "ab", "--max-tokens", "1000000000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "1000000000 new tokens exceed this model's 16 learned positions" in err


def test_a_learned_export_refuses_a_budget_past_its_table(tmp_path, capsys):
    """``rove generate EXPORT`` of a learned (or NoPE) export, a GPT2LMHeadModel with
    ``n_positions`` rows: the default 200 new tokens past the table were an IndexError traceback
    from HF's ``generate``; now the run folder's one-line error."""
    pytest.importorskip("transformers")
    from rove.hf.export import export_run

    cfg = GPTConfig(vocab_size=257, block_size=16, n_layer=1, n_head=2, n_embd=16, pos="learned")
    export = export_run(save_byte_run(tmp_path / "run", GPT(cfg).eval()), tmp_path / "export")
    assert main([str(export), "--prompt", "ab", "--temperature", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("rove generate: error:")
    assert "200 new tokens exceed this model's 16 positions" in err
    assert main([str(export), "--prompt", "ab", "--max-tokens", "13"]) == 0  # 3 + 13 = 16 fit


@pytest.fixture
def transformers_warnings():
    """Messages transformers logs from here on (its ``warning_once`` forgotten first)."""
    pytest.importorskip("transformers")
    import logging

    from transformers.utils import logging as hf_logging

    messages: list[str] = []

    class Records(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    hf_logging.warning_once.cache_clear()
    handler = Records()
    logging.getLogger("transformers").addHandler(handler)
    yield messages
    logging.getLogger("transformers").removeHandler(handler)


@pytest.mark.parametrize(("pos", "remote_code"), [("rove", False), ("rope", False), ("nope", True)])
def test_an_export_generates_past_its_training_length_quietly(
    tmp_path, capsys, transformers_warnings, pos, remote_code
):
    """Rotary and NoPE exports compute their positions: past ``block_size`` (16) transformers
    said the call "has exceeded the model's predefined maximum length"; rove generate now keeps
    it quiet there, and only there (the model's own ``generate`` still says it)."""
    from rove.hf.export import export_run, load_exported

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=257, block_size=16, n_layer=1, n_head=2, n_embd=16, pos=pos)
    run = save_byte_run(tmp_path / "run", GPT(cfg).eval())
    export = export_run(run, tmp_path / "export", remote_code=remote_code)
    flags = ["--prompt", "ab", "--max-tokens", "30", "--temperature", "0"]
    assert main([str(export), *flags]) == 0
    assert "maximum length" not in " ".join(transformers_warnings)
    assert capsys.readouterr().err == ""  # nor transformers 5's "Loading weights" bar
    load_exported(export).generate(torch.zeros(1, 20, dtype=torch.long), max_new_tokens=2)
    assert "the model's predefined maximum length (16)" in " ".join(transformers_warnings)


def test_a_learned_remote_code_export_refuses_a_budget_past_its_table(tmp_path, capsys):
    """rove's modeling file has a position table for ``pos="learned"`` only: past it the
    forward raised mid-stream; now the one line before generating."""
    pytest.importorskip("transformers")
    from rove.hf.export import export_run

    cfg = GPTConfig(vocab_size=257, block_size=16, n_layer=1, n_head=2, n_embd=16, pos="learned")
    run = save_byte_run(tmp_path / "run", GPT(cfg).eval())
    export = export_run(run, tmp_path / "export", remote_code=True)
    assert main([str(export), "--prompt", "ab", "--max-tokens", "20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "20 new tokens exceed this model's 16 positions" in err
    assert main([str(export), "--prompt", "ab", "--max-tokens", "13", "--temperature", "0"]) == 0


def test_num_samples_and_prompts_from_a_file_or_stdin(run_dir, tmp_path, capsys, monkeypatch):
    run, _ = run_dir
    sample = ["--max-tokens", "6", "--temperature", "1", "--seed", "5"]
    assert main([str(run), "--prompt", "ab", "--num-samples", "3", *sample]) == 0
    out = capsys.readouterr().out
    expected = generate_samples(run, "ab", max_tokens=6, temperature=1, seed=5, num_samples=3)
    assert out == "\n---\n".join(expected) + "\n"
    assert len(set(expected)) > 1  # one seed, three different draws
    (tmp_path / "p.txt").write_text("ab\n")  # one final newline is not part of the prompt
    assert main([str(run), "--prompt-file", str(tmp_path / "p.txt"), *sample]) == 0
    assert capsys.readouterr().out == expected[0] + "\n"
    monkeypatch.setattr("sys.stdin", io.StringIO("ab"))
    assert main([str(run), "--prompt", "-", *sample]) == 0
    assert capsys.readouterr().out == expected[0] + "\n"
    with pytest.raises(SystemExit):  # one prompt source only
        main([str(run), "--prompt", "ab", "--prompt-file", str(tmp_path / "p.txt")])


def test_an_export_samples_with_hf_generate_and_its_generation_config(run_dir, tmp_path):
    pytest.importorskip("transformers")
    from rove.hf.export import export_run

    run, _ = run_dir
    export = tmp_path / "export"
    export_run(run, export)
    config = json.loads((export / "generation_config.json").read_text())
    (export / "generation_config.json").write_text(json.dumps({**config, "max_new_tokens": 3}))
    greedy3 = generate_text(run, "hello", max_tokens=3, temperature=0)
    assert generate_text(export, "hello") == greedy3  # greedy, 3 tokens: from the file
    assert generate_text(export, "hello", max_tokens=5, temperature=0) == generate_text(
        run, "hello", max_tokens=5, temperature=0
    )  # flags override it
    kwargs = dict(max_tokens=8, temperature=1.0, seed=1, num_samples=2)
    assert generate_samples(export, "hello", **kwargs) == generate_samples(
        export, "hello", **kwargs
    )
