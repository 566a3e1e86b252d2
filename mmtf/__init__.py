"""mmtf: multimodal encoder-decoder transformers.

``mmtf.load(ckpt_path) -> (model, tokenizer)`` is the notebook API (:mod:`mmtf.api`).
"""

from __future__ import annotations

from typing import Any

from mmtf.utils.allocator import keep_freed_memory as _keep_freed_memory
from mmtf.utils.threads import share_cpu as _share_cpu

# Before torch loads libgomp, which reads its wait policy once: see mmtf/utils/threads.py.
_share_cpu()
# A step's freed tensors stay with the process instead of faulting in again: mmtf/utils/allocator.py.
_keep_freed_memory()


def __getattr__(name: str) -> Any:
    # Imported on first use: `import mmtf.data` etc. must not load Lightning and Hydra.
    if name == "load":
        from mmtf.api import load

        return load
    raise AttributeError(f"module 'mmtf' has no attribute {name!r}")
