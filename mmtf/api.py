"""The notebook API, ``mmtf.load(ckpt_path) -> (model, tokenizer)``: see
:mod:`mmtf.predict.model`, where it lives beside the predict-time input handling it uses."""

from mmtf.predict.model import Model, load

__all__ = ["Model", "load"]
