"""RoVE for a stock Hugging Face model saved after ``rove.hf.convert(model, "rove")``.

``save_pretrained`` copies this file beside ``config.json`` (model_type ``rove``, whose
``auto_map`` names the classes below), so ``AutoModelForCausalLM.from_pretrained(folder,
trust_remote_code=True)`` loads the model as RoVE. The code is rove's own: ``pip install
rove[hf]``. See :mod:`rove.hf.pretrained`.
"""

from rove.hf.pretrained import RoveConfig, RoveForCausalLM

__all__ = ["RoveConfig", "RoveForCausalLM"]
