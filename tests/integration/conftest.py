"""Tiny versions of the real experiments: the same YAML users run, shrunk to seconds."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from filelock import FileLock
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, open_dict

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
EXPERIMENTS = sorted(p.relative_to(CONF / "experiment").with_suffix("").as_posix()
                     for p in (CONF / "experiment").rglob("*.yaml"))

# The attention figure (on by default) is off: drawing it is ~1 s per validation, most of a
# tiny run's validation, and what it must not change is tested with it on in test_inspect.py.
NO_FIGURE = "++callbacks.attention_figure=null"
COMMON = [
    "trainer.max_epochs=1", "logger=csv", "callbacks.rich_progress_bar=null",
    "callbacks.model_summary=null", NO_FIGURE, "data.loader.num_workers=0",
    "data.loader.persistent_workers=false", "data.batches.batch_size=4", "trainer.log_every_n_steps=1",
]
AUDIO = ["model/encoder=audio_tiny", "data.synthetic.min_seconds=1.0",
         "data.synthetic.max_seconds=1.5", "data.synthetic.num_workers=0"]
CAPTION = ["model/decoder=text_tiny", "tokenizer.vocab_size=128",
           "model.test_metrics=[bleu,rouge_l,cider_d]", "model.generation.max_new_tokens=12"]
RETRIEVAL = ["model/text_encoder=text_tiny", "tokenizer.vocab_size=128", "model.embed_dim=16"]
# The from-scratch LLM (llm_tiny) shrunk; the chat tokens need a vocabulary over the BPE's own.
LLM = ["model.decoder.dim=32", "model.decoder.depth=1", "model.decoder.mlp_hidden=64",
       "tokenizer.vocab_size=160", "model.generation.max_new_tokens=12",
       "trainer.check_val_every_n_epoch=1"]
SMALL_SPLITS = ["data.synthetic.num_train=12", "data.synthetic.num_val=4",
                "data.synthetic.num_test=4"]
TINY = {
    # The default run validates every 2nd epoch; the tiny runs of one to three epochs, every epoch.
    "audio_captioning": [*AUDIO, *CAPTION, "data.synthetic.num_train=12",
                         "data.synthetic.num_val=4", "data.synthetic.num_test=4",
                         "trainer.check_val_every_n_epoch=1"],
    "image_captioning": ["model/encoder=vision_tiny", *CAPTION, "data.synthetic.num_train=12",
                         "data.synthetic.num_val=4", "data.synthetic.num_test=4",
                         "data.synthetic.num_workers=0"],
    "audio_classification": [*AUDIO, "data.synthetic.num_clips=30"],
    "audio_text_retrieval": [*AUDIO, *RETRIEVAL, "data.synthetic.num_train=12",
                             "data.synthetic.num_val=4", "data.synthetic.num_test=4"],
    "image_text_retrieval": ["model/encoder=vision_tiny", *RETRIEVAL,
                             "data.synthetic.num_train=12", "data.synthetic.num_val=4",
                             "data.synthetic.num_test=4", "data.synthetic.num_workers=0"],
    "audio_captioning_llm": [*AUDIO, *LLM, *SMALL_SPLITS],
    "audio_qa_llm": [*AUDIO, *LLM, *SMALL_SPLITS],
    "image_captioning_llm": ["model/encoder=vision_tiny", *LLM, *SMALL_SPLITS,
                             "data.synthetic.num_workers=0", "data.batches.eval_batch_size=4"],
    "image_classification": ["model/encoder=vision_tiny", "data.synthetic.num_train=16",
                             "data.synthetic.num_val=8", "data.synthetic.num_test=8",
                             "data.synthetic.num_workers=0"],
}


def tiny_overrides(experiment: str, data_dir: Path, *extra: str) -> list[str]:
    """Overrides that shrink ``experiment`` to a few tiny batches, data under ``data_dir``."""
    return [f"experiment={experiment}", f"paths.data_dir={data_dir}", *COMMON,
            *TINY[experiment], *extra]


def compose_train(overrides: list[str], output_dir: Path) -> DictConfig:
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
    return copy.deepcopy(cfg)


def evaluate_in_process(ckpt: Path, out_dir: Path, *overrides: str) -> dict[str, float]:
    """``mmtf.evaluate`` on ``ckpt`` (CPU) with eval.yaml ``overrides``; its metrics dict."""
    from mmtf.evaluate import evaluate

    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("eval", overrides=[f"ckpt_path={ckpt}", "accelerator=cpu", *overrides])
    with open_dict(cfg):
        cfg.paths.output_dir = str(out_dir)
    return evaluate(cfg)


def run_cli(module: str, args: list[str], cwd: Path, timeout: float = 300,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m module args`` as a user runs it; output captured for assertions. ``env``
    adds to the suite's environment; a key given None is removed from it."""
    full_env = {**os.environ, "HYDRA_FULL_ERROR": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env = {k: v for k, v in full_env.items() if v is not None}
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


# What ``python -m <module>`` runs: the console entry points of pyproject.toml.
ENTRY_POINTS = {"mmtf.train": "mmtf.train", "mmtf.evaluate": "mmtf.evaluate",
                "mmtf.predict": "mmtf.predict", "mmtf.export": "mmtf.export",
                "mmtf.zero_shot": "mmtf.zero_shot",
                "mmtf.inspect": "mmtf.inspect.__main__", "mmtf.report": "mmtf.report.cli",
                "mmtf.data.check": "mmtf.data.check", "mmtf.data.shard": "mmtf.data.shard",
                "mmtf.retrieve": "mmtf.retrieve"}


def cli_in_process(module: str, args: list[str], cwd: Path,
                   env: dict | None = None) -> subprocess.CompletedProcess:
    """:func:`run_cli` without a new interpreter: the entry point's ``main()`` under ``argv``.

    For the tests of what a command prints and its exit status (an interpreter start costs
    seconds; the console path itself is covered by one real :func:`run_cli` test per entry
    point). Everything the command sets for itself is undone afterwards: ``os.environ``, the
    working directory, ``sys.argv``, the root logger Hydra configures, Hydra's global state
    (``HydraConfig`` included) and the matmul precision ``mmtf.train`` sets. An exception that
    would end the interpreter is returned as status 1 with its traceback on stderr, as Python
    prints it.
    """
    import contextlib
    import importlib
    import io
    import logging
    import traceback

    import torch
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    main = importlib.import_module(ENTRY_POINTS[module]).main
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_env, saved_argv, saved_cwd = dict(os.environ), sys.argv, os.getcwd()
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    precision = torch.get_float32_matmul_precision()
    os.environ.update({"HYDRA_FULL_ERROR": "1", **(env or {})})
    sys.argv = [module, *args]
    os.chdir(cwd)
    code = 0
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                main()
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
                if isinstance(exit_.code, str):
                    print(exit_.code, file=sys.stderr)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = None       # train() reads "under the CLI" from it
        for handler in root.handlers:
            if handler not in saved_handlers:
                handler.close()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
        torch.set_float32_matmul_precision(precision)
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess([module, *args], code, stdout.getvalue(),
                                       stderr.getvalue())


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """One synthetic-data cache per test worker: each tiny set is generated once."""
    return tmp_path_factory.mktemp("data")


# ---------------------------------------------------------------- trained once per session
# The shared audio captioner's encoder takes 1.2 s, under the synthetic clips' 1-1.5 s: the
# long-audio paths of predict and evaluate run on it (tests/integration/test_inference_api.py).
AUDIO_CAPTIONER_MAX_SECONDS = 1.2


class TrainedRun(NamedTuple):
    """A finished tiny run: its run dir and the synthetic data it was trained on."""

    run_dir: Path
    data_dir: Path

    @property
    def ckpt(self) -> Path:
        return self.run_dir / "checkpoints" / "last.ckpt"


def session_dir(tmp_path_factory) -> Path:
    """A folder every xdist worker of this session sees: the parent of the workers' base
    temps (alone, the session's own base temp)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """``build(folder)`` once per session, by whichever worker asks first; the others wait
    on a file lock and reuse the folder. A failed build is retried by the next caller."""
    root = session_dir(tmp_path_factory) / "built_once"
    root.mkdir(exist_ok=True)
    folder, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def audio_captioner(tmp_path_factory) -> TrainedRun:
    """The tiny audio captioner every test that only needs *a* checkpoint uses (read-only).

    One real ``python -m mmtf.train`` run (logger=default, the attention figure on, tested at
    the end), so test_cli.py checks the run dir a user's command leaves with it.
    """
    def build(folder: Path) -> None:
        limit = AUDIO_CAPTIONER_MAX_SECONDS
        overrides = [o if o != "logger=csv" else "logger=default" for o in tiny_overrides(
            "audio_captioning", folder / "data", f"model.encoder.max_seconds={limit}",
            f"data.max_seconds={limit}", "data.crop.eval=start") if o != NO_FIGURE]
        out = run_cli("mmtf.train", [*overrides, f"hydra.run.dir={folder / 'run'}"], cwd=folder)
        assert out.returncode == 0, out.stderr[-3000:]

    folder = built_once(tmp_path_factory, "audio_captioner", build)
    return TrainedRun(folder / "run", folder / "data")


@pytest.fixture(scope="session")
def image_captioner(tmp_path_factory) -> TrainedRun:
    """The tiny image captioner (one epoch, no test), trained in-process once (read-only)."""
    from mmtf.train import train

    def build(folder: Path) -> None:
        train(compose_train(tiny_overrides("image_captioning", folder / "data", "test=false"),
                            folder / "run"))

    folder = built_once(tmp_path_factory, "image_captioner", build)
    return TrainedRun(folder / "run", folder / "data")
