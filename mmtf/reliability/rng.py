"""Random-number-generator state as plain, ``weights_only=True``-loadable data.

Python ``random``, numpy's global generator, torch CPU and every initialised CUDA generator, as
tensors, ints, floats, strs and ``None`` (Lightning's capture holds a numpy array). Worker-side
randomness comes from :func:`mmtf.data.sample_rng` instead.

Shapes: the MT19937 key is a ``(624,)`` int64 tensor; torch's states are byte tensors."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from mmtf.errors import CheckpointError

__all__ = ["capture_rng_state", "restore_rng_state"]


def capture_rng_state() -> dict[str, Any]:
    """The state of python ``random``, numpy, torch CPU and (initialised) CUDA generators.

    Returns:
        A dict of tensors / ints / floats / None that round-trips through
        ``torch.save`` + ``torch.load(weights_only=True)`` and :func:`restore_rng_state`.
    """
    version, internal, gauss_next = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": int(version),
                   "internal": torch.tensor(internal, dtype=torch.int64),   # (625,) key + pos
                   "gauss_next": None if gauss_next is None else float(gauss_next)},
        "numpy": {"kind": str(np_kind),
                  "keys": torch.from_numpy(np_keys.astype(np.int64)),       # (624,)
                  "pos": int(np_pos), "has_gauss": int(np_has_gauss),
                  "cached_gaussian": float(np_cached)},
        "torch": torch.get_rng_state(),
        "cuda": None,
    }
    # Only read CUDA when something already initialised it: a CPU run on a GPU host must not
    # create a CUDA context just to save a checkpoint.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Set every generator captured by :func:`capture_rng_state` back to that state.

    CUDA states are restored for ``min(saved, visible)`` devices (lazily if CUDA is not yet
    initialised); a checkpoint written on a CPU machine leaves CUDA generators alone.

    Raises:
        CheckpointError: ``state`` is not a dict written by :func:`capture_rng_state`.
    """
    missing = {"python", "numpy", "torch"} - set(state or {})
    if missing:
        raise CheckpointError(f"restore_rng_state: the RNG state lacks {sorted(missing)}; it was "
                              f"not written by mmtf.reliability.capture_rng_state.")
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["internal"].tolist()),
                     py["gauss_next"]))
    npst = state["numpy"]
    np.random.set_state((npst["kind"], npst["keys"].numpy().astype(np.uint32), npst["pos"],
                         npst["has_gauss"], npst["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if cuda and torch.cuda.is_available():
        for device, device_state in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state.cpu(), device)
