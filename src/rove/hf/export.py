"""``rove export RUN_DIR OUT_DIR``: a trained model as a standard Hugging Face model folder.

The folder holds ``config.json``, ``model.safetensors``, ``generation_config.json`` and the
tokenizer in HF form. Where a stock transformers architecture computes exactly what rove's GPT
computes, the export uses it, so ``AutoModelForCausalLM.from_pretrained(folder)`` needs no remote
code:

- ``learned`` -> ``GPT2LMHeadModel`` (GPT-2 *is* this model: pre-LayerNorm, tanh GELU, fused QKV);
- ``nope`` -> ``GPT2LMHeadModel`` with an all-zero position table of ``max_positions`` rows;
- ``rope`` -> ``GPTNeoXForCausalLM`` with sequential residuals, "half" rotary pairs on the
  leading ``rotary_dim`` channels (interleaved models get their Q/K channels permuted).

Missing biases become zero biases, and GQA / shared K = V heads are repeated to full multi-head
form, both of which leave the function unchanged. RoVE, a frequency scaling trained into the
model (``rove finetune --scaling``; dynamic NTK, whose frequencies follow the length, is
refused) and ``--remote-code`` for any ``pos`` use :mod:`rove.hf.modeling_rove_gpt`, copied
into the folder and loaded with ``trust_remote_code=True``, or without remote code through
:func:`rove.hf.load_exported`; a ``README.md`` model card there says so
(:mod:`rove.hf.model_card`).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from rove import run_files
from rove._version import __version__
from rove.atomic import (
    SAVE_MANIFEST,
    check_replaceable,
    recorded_files,
    save_folder,
    write_json_atomic,
)
from rove.hf.model_card import TrainingFacts, write_export_card
from rove.hf.tokenizer import TOKENIZER_FILES, portable_tokenizer_class
from rove.model import GPT, GPTConfig
from rove.rotary import convention_permutation
from rove.terminal import (
    DefaultsFormatter,
    DeprecatedFlag,
    command,
    no_progress_bars,
    signature_defaults,
)

__all__ = ["export_model", "export_run", "load_exported", "main"]

MODELING_FILE = Path(__file__).with_name("modeling_rove_gpt.py")
AUTO_MAP = {
    "AutoConfig": "modeling_rove_gpt.RoveGPTConfig",
    "AutoModelForCausalLM": "modeling_rove_gpt.RoveGPTForCausalLM",
}
EXPORT_MANIFEST = "rove_export.json"  # the files rove wrote: a new export may replace them
EXPORT_FORMAT = "rove-export"
EXPORT_KIND = "export"  # what rove.atomic.save_folder records an export as


def _full_heads(cfg: GPTConfig, weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Rows of rove's fused ``[q | k | v]`` tensor (weight or bias) as full multi-head q, k, v.

    Each is ``(n_head, head_dim, *rest)``; GQA and shared K = V heads are repeated, which
    computes the same attention as sharing them.
    """
    n_kv = cfg.n_kv_head or cfg.n_head
    heads = weight.view(-1, cfg.head_dim, *weight.shape[1:])  # (H_total, D, *rest)
    q, k = heads[: cfg.n_head], heads[cfg.n_head : cfg.n_head + n_kv]
    v = k if cfg.shared_kv else heads[cfg.n_head + n_kv :]
    group = cfg.n_head // n_kv
    return q, k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)


def _bias(module: torch.nn.Module, size: int) -> torch.Tensor:
    bias = getattr(module, "bias", None)
    return torch.zeros(size) if bias is None else bias.detach()


def _gpt2(model: GPT, max_positions: int) -> Any:
    """``GPT2LMHeadModel`` with rove's weights (learned positions, or zero ones for NoPE)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = model.config
    c = cfg.n_embd
    hf = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=cfg.vocab_size,
            n_positions=cfg.block_size if cfg.pos == "learned" else max_positions,
            n_embd=c,
            n_layer=cfg.n_layer,
            n_head=cfg.n_head,
            n_inner=cfg.mlp_ratio * c,
            activation_function="gelu_pytorch_tanh",
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            layer_norm_epsilon=model.ln_f.eps,
            tie_word_embeddings=cfg.tie_weights,
            bos_token_id=None,
            eos_token_id=None,
        )
    )
    sd: dict[str, torch.Tensor] = {"transformer.wte.weight": model.wte.weight}
    wpe = hf.transformer.wpe.weight
    sd["transformer.wpe.weight"] = model.wpe.weight if model.wpe is not None else wpe * 0
    for i, block in enumerate(model.iter_blocks()):
        p = f"transformer.h.{i}."
        q, k, v = _full_heads(cfg, block.attn.qkv.weight)
        qb, kb, vb = _full_heads(cfg, _bias(block.attn.qkv, block.attn.qkv.weight.shape[0]))
        sd[p + "attn.c_attn.weight"] = torch.cat((q, k, v)).flatten(0, 1).T  # Conv1D: (in, out)
        sd[p + "attn.c_attn.bias"] = torch.cat((qb, kb, vb)).flatten()
        for hf_name, mod in (
            ("attn.c_proj", block.attn.proj),
            ("mlp.c_fc", block.mlp.c_fc),
            ("mlp.c_proj", block.mlp.c_proj),
        ):
            sd[p + hf_name + ".weight"] = mod.weight.T
            sd[p + hf_name + ".bias"] = _bias(mod, mod.weight.shape[0])
        for name in ("ln_1", "ln_2"):
            ln = getattr(block, name)
            sd[p + name + ".weight"], sd[p + name + ".bias"] = ln.weight, _bias(ln, c)
    sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"] = (
        model.ln_f.weight,
        _bias(model.ln_f, c),
    )
    sd["lm_head.weight"] = model.lm_head.weight
    hf.load_state_dict({k: v.detach().contiguous() for k, v in sd.items()}, strict=True)
    return hf


def _neox_rotary_fits(cfg: GPTConfig) -> bool:
    """GPT-NeoX derives its rotated channel count as ``int(head_dim * fraction)``."""
    rot = cfg.rotary_dim or cfg.head_dim
    return int(cfg.head_dim * (rot / cfg.head_dim)) == rot


def _neox(model: GPT) -> Any:
    """``GPTNeoXForCausalLM`` with rove's RoPE weights (sequential residual, half pairs)."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = model.config
    c, rot = cfg.n_embd, cfg.rotary_dim or cfg.head_dim
    hf = GPTNeoXForCausalLM(
        GPTNeoXConfig(
            vocab_size=cfg.vocab_size,
            hidden_size=c,
            num_hidden_layers=cfg.n_layer,
            num_attention_heads=cfg.n_head,
            intermediate_size=cfg.mlp_ratio * c,
            hidden_act="gelu_pytorch_tanh",
            max_position_embeddings=cfg.block_size,
            layer_norm_eps=model.ln_f.eps,
            use_parallel_residual=False,
            attention_bias=True,
            tie_word_embeddings=cfg.tie_weights,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": cfg.rope_base,
                "partial_rotary_factor": rot / cfg.head_dim,
            },
            bos_token_id=None,
            eos_token_id=None,
        )
    )
    # transformers 4 reads the rotary settings under their old names (5 reads rope_parameters)
    hf.config.rotary_pct, hf.config.rotary_emb_base = rot / cfg.head_dim, cfg.rope_base
    # rove's rotated channels in NeoX's "half" pairing, then the pass-through channels
    perm = torch.cat(
        (
            convention_permutation(rot, cfg.rope_convention, "half"),  # type: ignore[arg-type]
            torch.arange(rot, cfg.head_dim),
        )
    )
    sd: dict[str, torch.Tensor] = {"gpt_neox.embed_in.weight": model.wte.weight}
    for i, block in enumerate(model.iter_blocks()):
        p = f"gpt_neox.layers.{i}."
        width = block.attn.qkv.weight.shape[0]
        for suffix, tensor in (
            ("weight", block.attn.qkv.weight),
            ("bias", _bias(block.attn.qkv, width)),
        ):
            q, k, v = _full_heads(cfg, tensor)
            # NeoX lays heads out as (H, [q | k | v], D)
            fused = torch.stack((q[:, perm], k[:, perm], v), dim=1)  # (H, 3, D, *rest)
            sd[p + "attention.query_key_value." + suffix] = fused.flatten(0, 2)
        modules: dict[str, torch.nn.Linear | torch.nn.LayerNorm] = {
            "attention.dense": block.attn.proj,
            "mlp.dense_h_to_4h": block.mlp.c_fc,
            "mlp.dense_4h_to_h": block.mlp.c_proj,
            "input_layernorm": block.ln_1,
            "post_attention_layernorm": block.ln_2,
        }
        for hf_name, mod in modules.items():
            sd[p + hf_name + ".weight"] = mod.weight
            sd[p + hf_name + ".bias"] = _bias(mod, mod.weight.shape[0])
    sd["gpt_neox.final_layer_norm.weight"] = model.ln_f.weight
    sd["gpt_neox.final_layer_norm.bias"] = _bias(model.ln_f, c)
    # the head is "lm_head" in transformers 5, "embed_out" in 4
    head = next(n for n, m in hf.named_modules() if m is hf.get_output_embeddings())
    sd[f"{head}.weight"] = model.lm_head.weight
    hf.load_state_dict({k: v.detach().contiguous() for k, v in sd.items()}, strict=True)
    return hf


def _remote(model: GPT) -> Any:
    """:class:`~rove.hf.modeling_rove_gpt.RoveGPTForCausalLM` with rove's state dict as is."""
    from rove.hf.modeling_rove_gpt import RoveGPTConfig, RoveGPTForCausalLM

    cfg = model.config
    skipped = ("dropout", "extra", "rope_scaling")  # a scaling goes as its result, below
    fields = {k: v for k, v in cfg.to_dict().items() if k not in skipped}
    if cfg.rope_scaling is not None:
        assert model.rotary is not None and not model.rotary.dynamic  # hf_model checked
        fields["rope_inv_freq"] = model.rotary.frequencies().inv_freq.tolist()
        fields["rope_logit_scale"] = model.rotary.logit_scale
    fields["tie_word_embeddings"] = fields.pop("tie_weights")
    hf = RoveGPTForCausalLM(RoveGPTConfig(**fields))
    hf.load_state_dict(model.state_dict(), strict=True)
    hf.config.auto_map = dict(AUTO_MAP)
    return hf


def hf_model(model: GPT, *, remote_code: bool = False, max_positions: int | None = None) -> Any:
    """The Hugging Face model computing what ``model`` computes (see the module docstring)."""
    cfg = model.config
    if model.rotary is not None and model.rotary.dynamic:
        raise ValueError(
            "the model was trained with dynamic-ntk rotary scaling, whose frequencies follow "
            "the length: no exported architecture computes rove's rule for it"
        )
    if cfg.pos == "rove" and model.rove_fraction != 1:  # taken mid-way through a smooth ramp
        raise ValueError(
            f"the model rotates V and O at a fraction {model.rove_fraction:g} of RoVE's angles "
            "(a checkpoint inside a smooth conversion's ramp): only plain RoVE is exported; "
            "continue its run past the end of the ramp and export a checkpoint from then"
        )
    scaled = cfg.rope_scaling is not None  # rove's modeling file computes it exactly
    if (
        remote_code
        or scaled
        or cfg.pos == "rove"
        or (cfg.pos == "rope" and not _neox_rotary_fits(cfg))
    ):
        hf = _remote(model)
    elif cfg.pos == "rope":
        hf = _neox(model)
    else:
        hf = _gpt2(model, max_positions or cfg.block_size)
    return hf.to(model.wte.weight.dtype).eval()


def export_model(
    model: GPT,
    out_dir: str | Path,
    tokenizer: Any | None = None,
    *,
    remote_code: bool = False,
    max_positions: int | None = None,
    facts: TrainingFacts | None = None,
) -> Path:
    """Write ``model`` (and a rove ``tokenizer``, when given) as a Hugging Face folder.

    ``remote_code`` forces the self-contained RoVE modeling file for any ``pos``;
    ``max_positions`` sizes the zero position table of a NoPE export (default ``block_size``);
    ``facts`` (tokens, data, final loss) go into the model card of a remote-code export.
    The folder is written like a checkpoint: complete in a temp folder beside ``out_dir``, then
    swapped in whole, so ``out_dir`` holds the old export or the new one, never half of one (a
    killed export's temp folder is removed by the next, under a lock beside ``out_dir`` that is
    gone afterwards; :func:`rove.atomic.save_folder`). It must be new, empty or a rove export
    (never a folder holding other files, never a run folder).
    """
    out = Path(out_dir)
    _check_target(out)  # before the work; save_folder checks again under the lock
    hf = hf_model(model, remote_code=remote_code, max_positions=max_positions)

    def write(tmp: Path) -> None:
        try:
            _write_export(hf, model.config.vocab_size, tokenizer, tmp, facts)
        except (OSError, SafetensorError) as err:
            raise OSError(
                f"cannot write the export {out} ({err}); nothing was written there"
                + (" (the export it holds is unchanged)" if out.exists() else "")
            ) from err

    return save_folder(out, write, EXPORT_KIND, owned=_export_files)


def _write_export(
    hf: Any, vocab_size: int, tokenizer: Any | None, folder: Path, facts: TrainingFacts | None
) -> None:
    """The export's files in ``folder``, with the manifest naming them last (the caller,
    :func:`rove.atomic.replace_folder`, fsyncs them)."""
    from transformers import GenerationConfig

    eot = getattr(tokenizer, "eot_token", None)
    hf.config.bos_token_id = hf.config.eos_token_id = hf.config.pad_token_id = eot
    hf.generation_config = GenerationConfig(
        bos_token_id=eot, eos_token_id=eot, pad_token_id=eot, do_sample=False
    )
    if tokenizer is not None and vocab_size > tokenizer.vocab_size:
        # ids of the padded vocabulary tail have no text: never generate them
        hf.generation_config.suppress_tokens = list(range(tokenizer.vocab_size, vocab_size))
    with no_progress_bars():
        hf.save_pretrained(folder)
    if getattr(hf.config, "auto_map", None):
        shutil.copyfile(MODELING_FILE, folder / MODELING_FILE.name)
        write_export_card(folder, hf.config, facts)
    if tokenizer is not None:
        from rove.hf.tokenizer import save_hf_tokenizer

        save_hf_tokenizer(tokenizer, folder)
    files = sorted(p.name for p in folder.iterdir() if p.name != SAVE_MANIFEST)
    manifest = {"format": EXPORT_FORMAT, "rove_version": __version__, "files": files}
    write_json_atomic(folder / EXPORT_MANIFEST, manifest)


def _export_files(folder: Path) -> set[str]:
    """Names of the files of the rove export in ``folder`` that its ``rove_export.json``
    lists (the record of exports older than :func:`rove.atomic.recorded_files`'), or none."""
    try:
        manifest = json.loads((folder / EXPORT_MANIFEST).read_text(encoding="utf-8"))
        if manifest["format"] == EXPORT_FORMAT:
            return {EXPORT_MANIFEST, *(str(name) for name in manifest["files"])}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return set()


def _check_target(out: Path) -> None:
    """Refuse to write ``out`` in or over a run folder, or over files rove did not write."""
    _check_outside_runs(out)
    check_replaceable(out, recorded_files(out, EXPORT_KIND) | _export_files(out), EXPORT_KIND)


def _check_outside_runs(out: Path) -> None:
    for folder in (out, *out.parents):  # what training writes, whatever the recipe's name
        if (folder / run_files.CHECKPOINTS / run_files.LATEST).exists() or any(
            (folder / name).is_file() for name in (run_files.METRICS, run_files.SUMMARY)
        ):
            where = "is" if folder == out else f"is inside {folder}, which is"
            raise ValueError(
                f"{out} {where} a run folder; rove export never writes into a run folder: "
                "choose a folder outside it"
            )


def export_run(
    run_dir: str | Path,
    out_dir: str | Path,
    *,
    remote_code: bool = False,
    max_positions: int | None = None,
) -> Path:
    """Export the latest checkpoint of a run folder (or a checkpoint folder) with its tokenizer.

    A finetuned Hugging Face model (``rove finetune``) is saved as its own architecture, RoVE
    marked as such (:meth:`~rove.hf.causal_lm.HFCausalLM.save_pretrained`), beside the files of
    the tokenizer it was trained with, copied as they are; ``remote_code`` and
    ``max_positions`` concern rove's GPT only.
    """
    from rove.data import checkpoint_tokenizer
    from rove.hf.any_model import load_any_model
    from rove.hf.causal_lm import HFCausalLM

    model, meta = load_any_model(run_dir)
    _check_past_ramp(meta)
    tokenizer = checkpoint_tokenizer(meta, f"checkpoint {run_dir}")
    facts = TrainingFacts.from_checkpoint(meta)
    if isinstance(model, HFCausalLM):
        _check_outside_runs(Path(out_dir))
        files = _TokenizerFiles(Path(getattr(tokenizer, "path", "")).parent)
        with no_progress_bars():
            return model.save_pretrained(out_dir, tokenizer=files, facts=facts)
    return export_model(
        model,
        out_dir,
        tokenizer,
        remote_code=remote_code,
        max_positions=max_positions,
        facts=facts,
    )


def _check_past_ramp(meta: dict) -> None:
    """Refuse, in a command-line user's words, a checkpoint taken inside a smooth conversion's
    ramp: neither RoPE nor RoVE, it has no exported form, and the run's latest checkpoint is
    such a one when the run stopped in its ramp."""
    from rove.checkpoint import ramp_fraction

    fraction = ramp_fraction(meta)
    if fraction < 1:
        ramp = meta["train_config"]["ramp_steps"]
        raise ValueError(
            f"{meta['checkpoint']}: taken at step {meta['step']} of a {ramp}-step ramp (the "
            f"smooth conversion; V and O at {fraction:.3g} of RoVE's angles), neither RoPE nor "
            "RoVE: only plain RoVE is exported. Resume the run (the command that started it, "
            f"with --resume) to the end of its ramp, step {ramp} or later, then export it"
        )


class _TokenizerFiles:
    """The files of a Hugging Face tokenizer's folder, saved by copying them: the model's own
    tokenizer (chat template and special tokens included) goes with it, under a class name
    every supported transformers knows."""

    def __init__(self, folder: Path) -> None:
        if not (folder / "tokenizer.json").is_file():
            raise ValueError(f"{folder}: no tokenizer.json to export with the model")
        self.folder = folder

    def save_pretrained(self, out: str | Path) -> None:
        for name in TOKENIZER_FILES:
            if (self.folder / name).is_file():
                shutil.copyfile(self.folder / name, Path(out) / name)
        portable_tokenizer_class(Path(out))  # loads under the floor transformers too


def load_exported(path: str | Path, **kwargs: Any) -> Any:
    """Any rove export as a transformers model, without remote code (``kwargs`` go to
    ``from_pretrained``).

    RoVE-form folders load with the installed :mod:`rove.hf.modeling_rove_gpt` classes; the
    Auto factories are left untouched, so ``trust_remote_code=True`` elsewhere in the process
    still runs the folder's own file.
    """
    from transformers import AutoModelForCausalLM

    from rove.hf.modeling_rove_gpt import RoveGPTForCausalLM

    config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") == RoveGPTForCausalLM.config_class.model_type:
        return RoveGPTForCausalLM.from_pretrained(path, **kwargs)
    return AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False, **kwargs)


@command("rove export")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rove export",
        description="Write a run's model and tokenizer as a Hugging Face model folder "
        "(stock GPT-2 / GPT-NeoX where exact, else a self-contained modeling file).",
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument("run_dir", help="run folder or checkpoint folder")
    parser.add_argument("--out", metavar="DIR", help="output folder (required)")
    parser.add_argument(
        "out_dir", nargs="?", action=DeprecatedFlag, replacement="--out DIR", metavar="OUT"
    )
    parser.add_argument(
        "--remote-code",
        action="store_true",
        help="use the self-contained modeling file (trust_remote_code=True) for any pos",
    )
    parser.add_argument(
        "--max-positions",
        type=int,
        help="NoPE exported as GPT-2: rows of the zero position table; default: block_size",
    )
    parser.set_defaults(**signature_defaults(export_run, "remote_code", "max_positions"))
    args = parser.parse_args(argv)
    if (args.out is None) == (args.out_dir is None):
        parser.error("give the output folder once, as --out DIR")
    if args.max_positions is not None and args.max_positions < 1:
        parser.error(f"--max-positions must be >= 1, got {args.max_positions}")
    out = export_run(
        args.run_dir,
        args.out or args.out_dir,
        remote_code=args.remote_code,
        max_positions=args.max_positions,
    )
    print(f"exported {args.run_dir} -> {out}")
    return 0
