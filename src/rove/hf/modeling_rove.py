"""RoVE for a stock Hugging Face model saved after ``rove.hf.convert(model, "rove")``.

``save_pretrained`` copies this file beside ``config.json`` (model_type ``rove``, whose
``auto_map`` names the classes below), so ``AutoModelForCausalLM.from_pretrained(folder,
trust_remote_code=True)`` loads the model as RoVE. The code is rove's own (its ``hf`` extra);
see :mod:`rove.hf.pretrained`.

The import sits in a ``try`` block because transformers lists a remote file's packages from its
top-level imports, skipping ``try`` blocks, and tells the user to pip-install each missing one by
its import name: a package named ``rove`` on the index is not this project. Here a missing rove is
one line with the command that installs it (this file runs where rove is not installed, so the
command is written out; a test holds it equal to ``rove._extras.install_hint("hf")``).
"""

try:
    from rove.hf.conversion import RoveConfig, RoveForCausalLM
except ModuleNotFoundError as err:
    if err.name not in ("rove", "rove.hf", "rove.hf.conversion"):
        raise
    raise ImportError(
        "this model's code is rove's Hugging Face integration, which is not installed; "
        "in a clone of rove's repository: pip install -e '.[hf]'"
    ) from None

__all__ = ["RoveConfig", "RoveForCausalLM"]
