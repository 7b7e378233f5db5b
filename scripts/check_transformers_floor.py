"""Do rove's Hugging Face folders load under another transformers? (run by
``scripts/check_transformers_floor.sh``, which says how).

``write DIR`` (the development environment): exports of every pos (stock GPT-2 and GPT-NeoX
forms and the RoVE modeling file), a Llama converted to RoVE and saved with ``save_pretrained``,
and the logits and token ids each must give. ``check DIR`` (the environment under test): loads
each folder with stock ``AutoModelForCausalLM`` / ``AutoTokenizer`` and compares them; it also
checks left padding and that a padded batch generates each row's own tokens.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

TEXTS = ["the cat sat", "a"]
EXPORTS = {  # name: GPTConfig fields beyond the shared ones
    "learned": {"pos": "learned"},
    "nope": {"pos": "nope"},
    "rope-partial-interleaved": {"pos": "rope", "rotary_dim": 4, "rope_convention": "interleaved"},
    "rove": {"pos": "rove", "n_kv_head": 2},
}


def write(root: Path) -> None:
    import transformers

    import rove.hf
    from rove.data import get_tokenizer
    from rove.hf.export import export_model
    from rove.model import GPT, GPTConfig

    byte = get_tokenizer("byte")
    ids = torch.tensor([byte.encode(TEXTS[0])])
    expected: dict[str, object] = {"ids": ids.tolist(), "writer": transformers.__version__}
    for name, fields in EXPORTS.items():
        torch.manual_seed(0)
        shared = {"vocab_size": 257, "block_size": 32, "n_layer": 2, "n_head": 4, "n_embd": 32}
        model = GPT(GPTConfig.from_dict({**shared, **fields})).eval()
        export_model(model, root / name, byte)
        with torch.no_grad():
            expected[name] = model(ids).tolist()
    kwargs = dict(vocab_size=257, hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    kwargs |= dict(num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    llama = transformers.AutoModelForCausalLM.from_config(
        transformers.LlamaConfig(**kwargs), attn_implementation="sdpa"
    ).eval()
    rove.hf.convert(llama).save_pretrained(root / "converted-llama")
    with torch.no_grad():
        expected["converted-llama"] = llama(ids).logits.tolist()
    (root / "expected.json").write_text(json.dumps(expected))


def check(root: Path) -> int:
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    expected = json.loads((root / "expected.json").read_text())
    ids = torch.tensor(expected["ids"])
    failures = []
    for name in [*EXPORTS, "converted-llama"]:
        folder = root / name
        try:
            model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
            with torch.no_grad():
                logits = model(ids).logits
            torch.testing.assert_close(logits, torch.tensor(expected[name]), atol=1e-4, rtol=0)
            if name in EXPORTS:
                tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
                assert tok(TEXTS[0])["input_ids"] == expected["ids"][0], "token ids differ"
                assert tok.padding_side == "left", f"pads {tok.padding_side}"
                batch = tok(TEXTS, padding=True, return_tensors="pt")
                gen = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False)
                out = model.generate(**batch, **gen)
                for row, text in enumerate(TEXTS):
                    alone = model.generate(tok(text, return_tensors="pt")["input_ids"], **gen)
                    assert torch.equal(out[row, -4:], alone[0, -4:]), f"padded row {row}"
            print(f"ok    {name}")
        except Exception as err:  # report every folder, not the first failure only
            failures.append(name)
            print(f"FAIL  {name}: {type(err).__name__}: {str(err)[:300]}")
    version = transformers.__version__
    print(f"written with transformers {expected['writer']}, loaded with {version}: ", end="")
    print(f"{len(failures)} of {len(EXPORTS) + 1} folders failed" if failures else "all agree")
    return 1 if failures else 0


if __name__ == "__main__":
    command, folder = sys.argv[1], Path(sys.argv[2])
    if command == "write":
        write(folder)
    else:
        sys.exit(check(folder))
