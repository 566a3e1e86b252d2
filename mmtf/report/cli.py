"""`python -m mmtf.report run_dir=<run or multirun dir> [out_dir=...] [metric=...] [mode=max]`.

Writes ``learning_curves.png`` (a sweep: ``sweep.png``) and ``summary.md`` into
``<run_dir>/report/`` and prints the summary.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from mmtf.errors import UserError
from mmtf.report import write_report
from mmtf.utils.config import find_missing, run_cli
from mmtf.utils.config_dir import CONF_DIR


def report(cfg: DictConfig) -> list[Path]:
    """Write the report of ``cfg.run_dir``; print the summary and the files written."""
    if find_missing(cfg):
        raise UserError("run_dir is required: python -m mmtf.report "
                        "run_dir=outputs/<task>/runs/<time> (or a multirun dir).")
    if cfg.mode not in (None, "min", "max"):
        raise UserError(f"mode ({cfg.mode!r}) must be min or max, or null (the run's "
                          f"optimized_mode for its optimized_metric).")
    paths = write_report(cfg.run_dir, cfg.out_dir, metric=cfg.metric, mode=cfg.mode,
                         smoothing=cfg.smoothing)
    print(paths[-1].read_text())
    print("Wrote " + " and ".join(str(p) for p in paths))
    return paths


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="report")
def _hydra_main(cfg: DictConfig) -> None:
    run_cli(report, cfg)


def main() -> None:
    """Console entry point (``mmtf-report``)."""
    _hydra_main()


if __name__ == "__main__":
    main()
