"""The import rules: each module sits in a layer and imports only from its own layer or below.

Layers, bottom up (a module belongs to the longest prefix listed):

0. base: version, optional extras, atomic files, locks, precision, terminal, the rotation math
   (the pure-torch oracle every backend is tested against)
1. kernels: torch and Triton rotations
2. rotary: frequency schedules, ``Rotary``/``NDRotary`` tables
3. attention: functional attention, KV cache, the layer, the explicit reference, group attention,
   token sampling
4. model: GPT and checkpoint I/O (usable without importing training)

Layers 0-4 are the library: torch, numpy and safetensors, no extra (checked below). Above them
the toolkit, one package per layer, so no two of them import each other sideways:

5. data (corpora, tokenizers, shards), 6. statistics, 7. Hugging Face (conversion, export, either
   model class of a run), 8. training, 9. generation, 10. evaluation, 11. reports, 12. compare,
   13. demo, 14. finetune, 15. analysis, 16. vision
17. the ``rove`` command line

Every import counts, also one inside a function: a lazy import upward is still an arrow the wrong
way. Importing ``a.b.c`` also runs the packages ``a.b``, so their layers count too; the root
package is exempt because its public names load lazily (checked below).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS: dict[str, int] = {
    "rove._version": 0,
    "rove._extras": 0,
    "rove.architectures": 0,
    "rove.atomic": 0,
    "rove.lock": 0,
    "rove.precision": 0,
    "rove.terminal": 0,
    "rove.configs": 0,
    "rove.run_files": 0,
    "rove.rotation": 0,
    "rove.kernels": 1,
    "rove.rotary": 2,
    "rove": 3,  # the root package's public API (its names load on first use)
    "rove.functional": 3,
    "rove.kv_cache": 3,
    "rove.layer": 3,
    "rove.reference": 3,
    "rove.sampling": 3,
    "rove.loss": 3,
    "rove.group": 3,
    "rove.model": 4,
    "rove.checkpoint": 4,
    "rove.data": 5,
    "rove.gguf": 5,  # a GGUF file as a plain model folder: data (its tokenizer) and hf use it
    "rove.stats": 6,
    "rove.hf": 7,
    "rove.train": 8,
    "rove.generate": 9,
    "rove.eval": 10,
    "rove.report": 11,
    "rove.compare": 12,
    "rove.demo": 13,
    "rove.finetune": 14,
    "rove.analysis": 15,
    "rove.vision": 16,
    "rove.cli": 17,
}
LIBRARY = 4  # the top layer of the library


def layer_of(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            return LAYERS[prefix]
    raise KeyError(f"{module} has no layer: add it to LAYERS in {__file__}")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "rove").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported rove module, line) for every import in the file, top level or not."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from rove import checkpoint`` imports a module (and runs only the lazy root)
            subs = [f"{base}.{alias.name}" for alias in node.names]
            modules = [name for name in subs if name in known]
            found += [(name, node.lineno) for name in modules]
            if len(modules) < len(subs):  # names from the module itself
                found.append((base, node.lineno))
    return [(name, line) for name, line in found if name == "rove" or name.startswith("rove.")]


def _with_parents(name: str, known: dict[str, Path]) -> list[str]:
    """The modules that importing ``name`` runs (itself and its parent packages, root excluded)."""
    parts = name.split(".")
    chain = [".".join(parts[:n]) for n in range(2, len(parts) + 1)]
    return [m for m in chain if m in known] or (["rove"] if name == "rove" else [])


def test_every_module_has_a_layer() -> None:
    for module in _modules():
        layer_of(module)


def test_no_module_imports_from_a_higher_layer() -> None:
    known = _modules()
    wrong = []
    for module, path in known.items():
        mine = layer_of(module)
        for name, line in _imports(module, path, known):
            for target in _with_parents(name, known):
                if layer_of(target) > mine:
                    rel = path.relative_to(SRC.parent)
                    wrong.append(f"{rel}:{line}: {module} (layer {mine}) imports {target} "
                                 f"(layer {layer_of(target)})")  # fmt: skip
    assert not wrong, "imports against the layering:\n" + "\n".join(sorted(set(wrong)))


def _on_cycles(arrows: dict[str, set[str]]) -> list[str]:
    """The nodes that reach themselves along ``arrows``."""
    cycles = []
    for start in arrows:
        seen, todo = set(), list(arrows[start])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += arrows.get(name, ())
        if start in seen:
            cycles.append(start)
    return sorted(cycles)


def _module_arrows() -> dict[str, set[str]]:
    """Module -> the modules it imports (a package importing its own submodules, and a
    submodule running its parent package, are not arrows here)."""
    known = _modules()
    return {
        module: {
            name
            for name, _ in _imports(module, path, known)
            if name in known and not module.startswith(f"{name}.") and name != module
        }
        for module, path in known.items()
    }


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])  # rove.hf.export -> rove.hf


def test_no_import_cycles() -> None:
    """Imports run one way: no module reaches itself through others, with no exception."""
    cycles = _on_cycles(_module_arrows())
    assert not cycles, f"modules on an import cycle: {cycles}"


def test_no_package_cycles() -> None:
    """Nor does a package (``rove.hf``, ``rove.train``, ...) through its modules' imports: a
    package the others build on is read, tested and changed without them."""
    arrows: dict[str, set[str]] = {}
    for module, names in _module_arrows().items():
        arrows.setdefault(_package(module), set()).update(
            _package(name) for name in names if _package(name) != _package(module)
        )
    assert not _on_cycles(arrows), f"packages on an import cycle: {_on_cycles(arrows)}"


def test_the_cycle_check_finds_cycles() -> None:
    assert _on_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c"]
    assert _on_cycles({"a": {"b"}, "b": set()}) == []


def test_the_rule_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The checker itself: a function-level import and a relative one are both found."""
    pkg = tmp_path / "rove" / "data"
    pkg.mkdir(parents=True)
    path = pkg / "thing.py"
    path.write_text("def f():\n    from rove.compare import x\n\nfrom ..eval.suite import y\n")
    names = [name for name, _ in _imports("rove.data.thing", path, _modules())]
    assert "rove.compare" in names and "rove.eval.suite" in names


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize(
    ("statement", "absent"),
    [
        # tokenizing a corpus needs neither the attention core nor training
        ("import rove.data.prepare", {"rove.functional", "rove.layer", "rove.train.loop"}),
        # reading weights does not load the training loop (DDP, data loaders)
        ("import rove.checkpoint", {"rove.train", "rove.train.loop", "torch.distributed.fsdp"}),
        ("import rove", {"rove.functional", "torch"}),
        ("from rove import __version__", {"torch"}),
    ],
)
def test_importing_a_low_layer_loads_nothing_above_it(statement: str, absent: set[str]) -> None:
    assert not (_loaded_after(statement) & absent)


def test_root_names_load_on_first_use() -> None:
    import rove

    assert set(rove.__all__) == {*rove._HOME, "__version__"}  # the listed names are the lazy ones
    for name in rove.__all__:
        assert getattr(rove, name) is not None
    assert set(rove.__all__) <= set(dir(rove))
    with pytest.raises(AttributeError, match="no attribute 'atention'"):
        rove.atention  # noqa: B018


def test_version_has_one_source() -> None:
    from importlib.metadata import version

    from rove._version import __version__

    assert version("rove") == __version__
    assert "version =" not in (SRC.parent / "pyproject.toml").read_text().split("[tool.")[0]


# a subprocess in which the packages of the extras in $MISSING (default: all) are missing, but
# those in $KEEP, whatever this venv holds
WITHOUT_EXTRAS = """
import importlib, os, sys
from rove._extras import EXTRAS

missing = os.environ.get("MISSING", ",".join(EXTRAS.values())).split(",")
keep = os.environ.get("KEEP", "").split(",")
# None in sys.modules: an import fails as if not installed, find_spec finds nothing
sys.modules.update(
    dict.fromkeys(p for p, extra in EXTRAS.items() if extra in missing and p not in keep)
)
for name in sys.argv[1:]:
    importlib.import_module(name)
"""

README = SRC.parent / "README.md"


def _library_examples() -> list[str]:
    """The python blocks of README.md and docs/*.md that use only torch and the library (no
    extra), and run in seconds (not marked slow)."""
    from doc_blocks import blocks as doc_blocks

    known, blocks = _modules(), []
    for found in doc_blocks("python"):
        if found.slow:
            continue
        block = found.text
        tree = ast.parse(block)
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        if all(
            name == "torch" or name == "rove" or (name in known and layer_of(name) <= LIBRARY)
            for name in names
        ):
            blocks.append(block)
    return blocks


def test_the_library_needs_no_extra(tmp_path: Path) -> None:
    """Every module of layers 0-4 imports, and the docs' library examples run, with the
    packages of every extra missing: ``pip install`` with no extra is enough for them."""
    # the Triton kernels are the triton extra's, imported only where it is installed
    library = [m for m in _modules() if layer_of(m) <= LIBRARY and ".triton_" not in m]
    examples = _library_examples()
    assert len(examples) >= 4  # attention, Rotary, packed documents, the layer with a KV cache
    for i, block in enumerate(examples):
        (tmp_path / f"readme_{i}.py").write_text(block)
    code = WITHOUT_EXTRAS + (
        "import runpy\n"
        f"for i in range({len(examples)}):\n"
        f"    runpy.run_path({str(tmp_path)!r} + f'/readme_{{i}}.py')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *library], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.slow  # a Python importing transformers: ~25 s on 2 busy cores
def test_the_hugging_face_side_needs_only_its_extra() -> None:
    """``rove.hf`` (convert, from_pretrained, export) imports with the hf extra alone."""
    hf = [m for m in _modules() if m.startswith("rove.hf")]
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, *hf],
        capture_output=True,
        text=True,
        # transformers itself needs tqdm and pyyaml: the hf extra installs them
        env={**os.environ, "MISSING": "toolkit", "KEEP": "tqdm,yaml"},
    )
    assert out.returncode == 0, out.stderr[-3000:]


def test_a_missing_extra_is_one_line_naming_it() -> None:
    """A toolkit module without its extra: one ImportError line with the extra and the command
    (``rove._extras.install_command``), never a bare ``No module named ...``."""
    from rove._extras import install_command

    for module, extra in [("rove.stats", "toolkit"), ("rove.eval.lm_eval_model", "lm-eval")]:
        out = subprocess.run(
            [sys.executable, "-c", WITHOUT_EXTRAS, module],
            capture_output=True,
            text=True,
            env={**os.environ, "MISSING": extra},
        )
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith("ImportError: ") and f"'{extra}' extra" in last, last
        assert last.endswith(install_command(extra)), last


def test_no_message_names_an_index_package() -> None:
    """rove is not on a package index: no text in the package says ``pip install rove``."""
    hits = [
        str(path.relative_to(SRC.parent))
        for path in [*(SRC / "rove").rglob("*.py"), README, *(SRC.parent / "docs").glob("*.md")]
        if "pip install rove" in path.read_text() or 'pip install "rove' in path.read_text()
    ]
    assert not hits, hits
