"""The import rules: each module sits in a layer and imports only from its own layer or below.

Layers, bottom up (a module belongs to the longest prefix listed):

0. base: version, atomic files, locks, precision, terminal, the rotation math (the pure-torch
   oracle every backend is tested against)
1. kernels: torch and Triton rotations
2. rotary: frequency schedules, ``Rotary``/``NDRotary`` tables
3. attention: functional attention, KV cache, the layer, the explicit reference, group attention,
   token sampling
4. model: GPT and checkpoint I/O (usable without importing training)
5. data, train, eval, statistics, generation, Hugging Face
6. workflows: compare, demo and finetune, reports, analysis, vision
7. the ``rove`` command line

Every import counts, also one inside a function: a lazy import upward is still an arrow the wrong
way. Importing ``a.b.c`` also runs the packages ``a.b``, so their layers count too; the root
package is exempt because its public names load lazily (checked below).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS: dict[str, int] = {
    "rove._version": 0,
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
    "rove.group": 3,
    "rove.model": 4,
    "rove.checkpoint": 4,
    "rove.data": 5,
    "rove.train": 5,
    "rove.eval": 5,
    "rove.stats": 5,
    "rove.generate": 5,
    "rove.hf": 5,
    "rove.compare": 6,
    "rove.finetune": 6,
    "rove.demo": 6,
    "rove.report": 6,
    "rove.analysis": 6,
    "rove.vision": 6,
    "rove.cli": 7,
}


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


# the one circle left (issue 23): ``convert`` marks the config through ``pretrained``, which
# converts at load time; drop the names once it is broken
KNOWN_CYCLE = {"rove.hf.conversion", "rove.hf.pretrained"}


def test_no_import_cycles() -> None:
    """Imports run one way: no module reaches itself through others (a package importing its
    own submodules, and a submodule running its parent package, are not arrows here)."""
    known = _modules()
    arrows = {
        module: {
            name
            for name, _ in _imports(module, path, known)
            if name in known and not module.startswith(f"{name}.") and name != module
        }
        for module, path in known.items()
    }
    cycles = []
    for start in arrows.keys() - KNOWN_CYCLE:
        seen, todo = set(), list(arrows[start])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += arrows.get(name, ())
        if start in seen:
            cycles.append(start)
    assert not cycles, f"modules on an import cycle: {sorted(cycles)}"


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
