"""mmtf: multimodal encoder-decoder transformers.

``mmtf.load(ckpt_path) -> (model, tokenizer)`` is the notebook API (:mod:`mmtf.api`). Importing
mmtf changes nothing in the process (no thread, no allocator or OpenMP setting, no warning
filter); the CLIs start :func:`mmtf.utils.cpu_sharing.share_cpu`, and a notebook may.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # Imported on first use: `import mmtf.data` etc. must not load Lightning and Hydra.
    if name == "load":
        from mmtf.api import load

        return load
    raise AttributeError(f"module 'mmtf' has no attribute {name!r}")
