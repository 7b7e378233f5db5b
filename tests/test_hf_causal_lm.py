"""rove.hf.causal_lm: rove's model surface over a Hugging Face causal LM (``rove finetune``).

Tiny random models built from configs (no hub), as in test_hf_convert; float64 where values
are compared exactly.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import torch.nn.functional as F

from fresh_process import run_python

transformers = pytest.importorskip("transformers")

import rove  # noqa: E402
import rove.hf  # noqa: E402
from rove.checkpoint import load_checkpoint, restore_model, save_checkpoint  # noqa: E402
from rove.hf.causal_lm import HFCausalLM, HFModelConfig  # noqa: E402
from rove.rotary import SCALING_KINDS, Scaling, rotary_frequencies  # noqa: E402
from test_hf_convert import TRANSFORMERS_5, VOCAB, tiny_model  # noqa: E402

BLOCK = 16
POS = ("rope", "rove")


def wrapped(arch: str, pos: str, dtype: torch.dtype = torch.float64, **config: object):
    """An HFCausalLM over a tiny ``arch`` model in ``pos``; ``config`` overrides (a rebuild)."""
    model = tiny_model(arch, dtype=dtype)
    if config:
        cls = transformers.CONFIG_MAPPING[arch]
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(
            cls.from_dict({**model.config.to_dict(), **config})
        ).to(dtype)
    return HFCausalLM(rove.hf.convert(model, pos), BLOCK)  # type: ignore[arg-type]


def ids(batch: int = 2, seq: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("pos", POS)
@pytest.mark.parametrize("arch", ["llama", "gpt_neox", "qwen2", "granite", "gemma3_text"])
def test_forward_and_token_nll_are_the_hf_models(arch, pos):
    lm = wrapped(arch, pos)
    if arch == "granite":  # the one supported head that is not a plain linear map
        lm.hf.config.logits_scaling = 4.0
    assert lm.config.pos == pos and lm.config.model_type == arch
    x, y = ids(), ids(seed=1)
    y[0, 3] = y[1, -1] = -1
    with torch.no_grad():
        ref = lm.hf(x).logits
        assert torch.equal(lm(x), ref)
        want = F.cross_entropy(ref.transpose(1, 2), y, ignore_index=-1, reduction="none")
        nll = lm.token_nll(x, y, chunk_size=5)  # chunks that do not divide T
        loss = lm(x, y)
    assert nll.dtype == torch.float32 and nll.shape == y.shape
    torch.testing.assert_close(nll, want.float(), rtol=1e-6, atol=1e-6)
    assert nll[0, 3] == 0 and nll[1, -1] == 0
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, want[y != -1].mean().float(), rtol=1e-6, atol=1e-6)


def test_the_rove_arm_computes_another_function():
    x = ids()
    with torch.no_grad():
        assert not torch.allclose(wrapped("llama", "rope")(x), wrapped("llama", "rove")(x))


def test_from_folder_loads_as_saved_or_converted(tmp_path):
    stock = tiny_model("llama", dtype=torch.float32)
    stock.save_pretrained(tmp_path / "stock")
    x = ids()
    with torch.no_grad():
        want_rope = stock(x).logits
        fresh = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "stock")
        want_rove = rove.hf.convert(fresh, "rove")(x).logits
        for pos, want in ((None, want_rope), ("rope", want_rope), ("rove", want_rove)):
            lm = HFCausalLM.from_folder(tmp_path / "stock", pos=pos)
            assert lm.config.pos == (pos or "rope")
            assert torch.equal(lm(x), want)
        assert lm.config.block_size == stock.config.max_position_embeddings
        assert lm.hf.dtype == torch.float32
        lm.save_pretrained(tmp_path / "rove")  # a saved RoVE model stays RoVE ...
        again = HFCausalLM.from_folder(tmp_path / "rove", block_size=8)
        assert again.config.pos == "rove" and again.config.block_size == 8
        assert torch.equal(again(x), want_rove)
        back = HFCausalLM.from_folder(tmp_path / "rove", pos="rope")  # ... unless asked
        assert back.config.pos == "rope" and torch.equal(back(x), want_rope)


def test_from_folder_refusals(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        HFCausalLM.from_folder(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"no config\.json"):
        HFCausalLM.from_folder(tmp_path / "empty")
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2)
    )
    gpt2.save_pretrained(tmp_path / "gpt2")
    with pytest.raises(
        ValueError, match=r"model_type 'gpt2' is not one rove\.hf\.convert supports"
    ):
        HFCausalLM.from_folder(tmp_path / "gpt2")
    tiny_model("llama", dtype=torch.float32).save_pretrained(tmp_path / "llama")
    with pytest.raises(ValueError, match="unknown pos 'nope'"):
        HFCausalLM.from_folder(tmp_path / "llama", pos="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        HFCausalLM.from_folder(tmp_path / "llama", block_size=0)
    with pytest.raises(ValueError, match=r"not one rove\.hf\.convert supports"):
        HFCausalLM(gpt2, BLOCK)


def test_config_round_trips_through_json_and_names_bad_fields():
    lm = wrapped("qwen2", "rove")
    d = json.loads(json.dumps(lm.config.to_dict()))
    assert HFModelConfig.from_dict(d) == lm.config
    assert "rove" not in d["hf_config"] and d["hf_config"]["model_type"] == "qwen2"
    bad = [
        ({**d, "extra": 1}, r"unknown keys \['extra'\]"),
        ({k: v for k, v in d.items() if k != "pos"}, r"missing keys \['pos'\]"),
        ({**d, "pos": "alibi"}, "unknown pos 'alibi'"),
        ({**d, "block_size": True}, "block_size must be a positive int"),
        ({**d, "model_type": "gpt2"}, "model_type 'gpt2' is not one"),
        ({**d, "vocab_size": VOCAB + 1}, "vocab_size 64 does not match"),
        ({**d, "hf_config": []}, "hf_config must be a dict"),
    ]
    for spec, message in bad:
        with pytest.raises(ValueError, match=message):
            HFModelConfig.from_dict(spec)
    with pytest.raises(ValueError, match="must be a dict"):
        HFModelConfig.from_dict([])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arch", "tied"), [("llama", True), ("gpt_neox", False), ("gemma3_text", True)]
)
def test_from_config_and_rove_checkpoints_restore_the_model(tmp_path, arch, tied):
    lm = wrapped(arch, "rove", torch.float32, tie_word_embeddings=tied)
    head, embed = lm.hf.get_output_embeddings().weight, lm.hf.get_input_embeddings().weight
    assert (head is embed) == tied
    x = ids()
    with torch.no_grad():
        want = lm(x)
        rebuilt = HFCausalLM.from_config(lm.config)
        assert rebuilt.config.pos == "rove" and not torch.equal(rebuilt(x), want)
        rebuilt.load_state_dict(lm.state_dict())
        assert torch.equal(rebuilt(x), want)
    optimizer = torch.optim.AdamW(lm.parameters())
    folder = save_checkpoint(
        tmp_path, step=1, model=lm, optimizer=optimizer, tokens=0, train_config={}, tokenizer={}
    )
    ckpt = load_checkpoint(folder)
    assert bool(ckpt.meta["tied"]) == tied
    restored = HFCausalLM.from_config(HFModelConfig.from_dict(ckpt.meta["model_config"]))
    restore_model(restored, ckpt)
    out = restored.hf.get_output_embeddings().weight
    assert (out is restored.hf.get_input_embeddings().weight) == tied
    optimizer2 = torch.optim.AdamW(restored.parameters())
    optimizer2.load_state_dict(ckpt.optimizer_state)
    with torch.no_grad():
        assert torch.equal(restored(x), want)


@pytest.mark.parametrize("pos", POS)
def test_a_training_step_lowers_the_loss(pos):
    lm = wrapped("llama", pos, torch.float32).train()
    x, y = ids(4, 16), ids(4, 16, seed=1)
    optimizer = torch.optim.AdamW(lm.parameters(), lr=1e-2)
    losses = []
    for _ in range(4):
        loss = lm(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1, losses


def test_param_count_and_flops():
    for tied in (True, False):
        lm = wrapped("llama", "rove", torch.float32, tie_word_embeddings=tied)
        unique = {id(p): p.numel() for p in lm.hf.parameters()}
        embed = VOCAB * 32
        assert lm.num_params(non_embedding=False) == sum(unique.values())
        assert lm.num_params() == sum(unique.values()) - embed
        n = lm.num_params(non_embedding=False)
        assert lm.flops_per_token() == 6 * n + 12 * 2 * (4 * 8) * BLOCK
        assert lm.flops_per_token(64) == 6 * n + 12 * 2 * (4 * 8) * 64


@pytest.mark.parametrize("pos", POS)
def test_greedy_generate_is_the_argmax_rollout_and_never_stops(pos):
    lm = wrapped("llama", pos)
    x = ids(2, 5)
    rollout = x
    with torch.no_grad():
        for _ in range(7):
            nxt = lm(rollout)[:, -1].argmax(-1, keepdim=True)
            rollout = torch.cat((rollout, nxt), 1)
    lm.hf.generation_config.eos_token_id = int(rollout[0, 6])  # generated: must not stop there
    lm.hf.config.eos_token_id = int(rollout[0, 6])
    assert torch.equal(lm.generate(x, 7), rollout)
    assert torch.equal(lm.generate(x, 7, temperature=1.0, top_k=1), rollout)
    assert torch.equal(lm.generate(x, 0), x)
    g = [torch.Generator().manual_seed(3) for _ in range(2)]
    sampled = [lm.generate(x, 7, temperature=1.5, generator=gen) for gen in g]
    assert torch.equal(sampled[0], sampled[1]) and sampled[0].shape == (2, 12)
    with pytest.raises(ValueError, match="top_k must be >= 1"):
        lm.generate(x, 3, 1.0, top_k=0)


def test_generate_under_dynamic_ntk_pins_the_final_length():
    """Every generated token is the argmax of one forward over the final sequence, whose
    dynamic NTK length is the final length (rove's GPT pins it the same way)."""
    lm = wrapped("llama", "rove")
    x = ids(1, 14)
    with lm.rope_scaling("dynamic-ntk", 4.0):
        out = lm.generate(x, 10)
        with torch.no_grad():
            logits = lm(out)
    assert torch.equal(logits[:, 13:-1].argmax(-1), out[:, 14:])


def scaled_rotary(lm: HFCausalLM):
    (module,) = [m for m in lm.hf.modules() if hasattr(m, "inv_freq")]
    return module


@pytest.mark.parametrize("pos", POS)
def test_rope_scaling_changes_long_positions_inside_the_block_only(pos):
    lm = wrapped("llama", pos)
    x = ids(1, 4 * BLOCK)
    with torch.no_grad():
        plain = lm(x)
        for kind in SCALING_KINDS:
            with lm.rope_scaling(kind, 4.0):
                scaled = lm(x)
                assert lm.config.block_size == BLOCK
            assert not torch.allclose(scaled[:, BLOCK:], plain[:, BLOCK:]), kind
            assert torch.equal(lm(x), plain), kind  # restored
        for kind, factor in ((None, 4.0), ("yarn", 1.0), ("linear", 0.5)):
            with lm.rope_scaling(kind, factor):
                assert torch.equal(lm(x), plain)
    with (
        pytest.raises(ValueError, match="unknown rope scaling 'longrope'"),
        lm.rope_scaling("longrope", 2.0),
    ):
        pass


@pytest.mark.parametrize("kind", SCALING_KINDS)
def test_rope_scaling_frequencies_are_roves(kind):
    """Each kind's HF frequencies (and YaRN's attention factor) are rove.rotary's, relative to
    block_size: the same schedule as rove's GPT under ``rope_scaling``."""
    lm = wrapped("gpt_neox", "rove")  # partial rotary: 4 of 8 channels
    params: dict[str, object] = {"factor": 4.0}
    if kind in ("yarn", "dynamic-ntk"):
        params["original_max_position"] = BLOCK
    length = 3 * BLOCK
    with lm.rope_scaling(kind, 4.0), torch.no_grad():
        lm(ids(1, length))
        module = scaled_rotary(lm)
        want = rotary_frequencies(4, 10000.0, Scaling(kind, params), seq_len=length)
        torch.testing.assert_close(module.inv_freq.double(), want.inv_freq, rtol=1e-6, atol=0)
        assert module.attention_scaling == pytest.approx(want.attention_factor)


def test_yarn_equals_the_hf_model_built_with_yarn():
    for pos in POS:
        lm = wrapped("qwen2", pos)
        d = lm.hf.config.to_dict()
        d.pop("rove", None)
        yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": BLOCK}
        if TRANSFORMERS_5:
            d["rope_parameters"] = {**d["rope_parameters"], **yarn}
        else:
            d["rope_scaling"] = yarn
        hf = transformers.AutoModelForCausalLM.from_config(
            transformers.CONFIG_MAPPING["qwen2"].from_dict(d)
        ).to(torch.float64)
        hf.load_state_dict(lm.hf.state_dict())
        rove.hf.convert(hf, pos)
        x = ids(1, 4 * BLOCK)
        with torch.no_grad(), lm.rope_scaling("yarn", 4.0):
            assert torch.equal(lm(x), hf(x).logits), pos


def test_dynamic_ntk_follows_each_forwards_length():
    """HF's dynamic rope keeps the longest length seen; rove's rule is each forward's own."""
    lm = wrapped("llama", "rove")
    x = ids(1, 3 * BLOCK)
    with torch.no_grad(), lm.rope_scaling("dynamic-ntk", 4.0):
        first = lm(x)
        lm(ids(1, 5 * BLOCK))
        assert torch.equal(lm(x), first)


def test_scaling_a_model_with_a_table_per_layer_type_is_refused():
    """Gemma 3's sliding and global tables are not one table a scaled module replaces: refused,
    in training (set_scaling, trained_scaling) as at inference (rope_scaling)."""
    from rove.hf.causal_lm import trained_scaling
    from rove.rotary import Scaling

    lm = HFCausalLM(tiny_model("gemma3_text", "linear"), BLOCK)
    with (
        pytest.raises(ValueError, match="a rotary table per layer type"),
        lm.rope_scaling("yarn", 4),
    ):
        pass
    with pytest.raises(ValueError, match="a rotary table per layer type"):
        lm.set_scaling(Scaling("linear", {"factor": 2.0}))
    if TRANSFORMERS_5:  # transformers 4 keeps one flat rope_scaling beside rope_local_base_freq
        with pytest.raises(ValueError, match=r"rope parameters per layer type \(.*full_attention"):
            trained_scaling(lm.hf.config.to_dict())


def test_rope_scaling_refuses_another_kind_on_a_model_already_scaled():
    model = tiny_model("llama", rope="yarn")
    lm = HFCausalLM(model, BLOCK)
    with (
        pytest.raises(ValueError, match=r"trained with yarn rotary scaling .* not one exact"),
        lm.rope_scaling("linear", 2.0),
    ):
        pass


def test_save_pretrained_is_what_it_is_and_refuses_foreign_folders(tmp_path):
    x = ids()
    for pos in POS:
        lm = wrapped("gpt_neox", pos, torch.float32)
        folder = lm.save_pretrained(tmp_path / pos)
        config = json.loads((folder / "config.json").read_text())
        assert config["model_type"] == ("rove" if pos == "rove" else "gpt_neox")
        again = HFCausalLM.from_folder(folder, block_size=BLOCK)
        assert (again.config.pos, again.config.block_size) == (pos, BLOCK)
        with torch.no_grad():
            assert torch.equal(again(x), lm(x))
    wrapped("llama", "rope", torch.float32).save_pretrained(tmp_path / "rove")  # replaced whole
    assert not (tmp_path / "rove" / "modeling_rove.py").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match=r"notes\.txt"):
        lm.save_pretrained(tmp_path / "mine")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


FRESH_PROCESS = textwrap.dedent(
    """
    import sys, torch
    from rove.hf.causal_lm import HFCausalLM
    root, names = sys.argv[1], sys.argv[2:]
    ids = torch.load(f"{root}/ids.pt")
    for name in names:
        lm = HFCausalLM.from_folder(f"{root}/{name}")
        assert lm.config.pos == name, (name, lm.config.pos)
        with torch.no_grad():
            assert torch.equal(lm(ids), torch.load(f"{root}/{name}.pt")), name
        print(name, "ok")
    """
)


@pytest.mark.slow  # a second Python importing torch and transformers: ~20 s on 2 busy cores
def test_saved_models_reload_in_a_fresh_process(tmp_path):
    x = ids()
    torch.save(x, tmp_path / "ids.pt")
    for pos in POS:
        lm = wrapped("qwen3", pos, torch.float32)
        lm.save_pretrained(tmp_path / pos)
        with torch.no_grad():
            torch.save(lm(x), tmp_path / f"{pos}.pt")
    assert run_python(FRESH_PROCESS, tmp_path, *POS).split() == ["rope", "ok", "rove", "ok"]


def test_rove_evaluations_run_on_it():
    """The evaluation suite's protocol, end to end: perplexity vs length with scalings."""
    import numpy as np

    from rove.eval.perplexity import perplexity_vs_length
    from rove.eval.protocol import LanguageModel

    lm = wrapped("llama", "rove", torch.float32).eval()
    assert isinstance(lm, LanguageModel)
    tokens = np.random.default_rng(0).integers(1, VOCAB, 400)
    out = perplexity_vs_length(
        lm, tokens, [BLOCK, 2 * BLOCK], scalings=(None, "yarn", "dynamic-ntk"),
        max_tokens_per_length=64, batch_size=2, min_windows=2, progress=False,
    )  # fmt: skip
    assert out["block_size"] == BLOCK
    records = [r for per_length in out["results"].values() for r in per_length.values()]
    assert all(r["error"] is None and r["ppl"] > 1 for r in records)
    beyond = {kind: out["results"][kind][2 * BLOCK]["loss"] for kind in out["results"]}
    assert len(set(beyond.values())) == len(beyond)  # each scaling computes its own function
