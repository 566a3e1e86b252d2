"""The log-mel front end's power spectrum: torchaudio's ``MelSpectrogram`` (``|z|.pow(2)``, a
square root per bin, then its square), which ``LogMelFrontEnd`` runs, against the same STFT and
filters with the power as re² + im² (tried in commit 85cb168 and reverted: it changes the
rounding, and with it the default seeds' accuracy), on `experiment=audio_captioning`'s front end.

Batch 32 of 4 s (the default batch at its median clip length), random waveforms, no gradient (the
front end has no parameters). The two ways are interleaved over ``--repeats`` rounds of
``--calls`` calls; each reports the median of its per-round medians. Also prints the STFT alone
and the largest relative difference of the energies.

    python experiments/training_throughput/mel_power.py [--threads 2] [--repeats 5]

Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch
import torchaudio
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from mmtf.perf.device import cpu_flags, describe_cpu, median_call_ms, quantity_table
from mmtf.perf.results import append_result

CONF = Path(__file__).resolve().parents[2] / "conf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("train", overrides=["experiment=audio_captioning"])
    front_end = instantiate(cfg.model.encoder).frontend
    rate = front_end.sample_rate
    half = front_end.n_fft // 2
    # (b, n + n_fft): the clip plus the front end's own centring pad, as forward() hands it on.
    wave = torch.randn(args.batch, int(args.seconds * rate) + 2 * half)
    spec = front_end.mel.spectrogram

    def stft() -> torch.Tensor:
        return torchaudio.functional.spectrogram(
            wave, spec.pad, spec.window, spec.n_fft, spec.hop_length, spec.win_length, None,
            spec.normalized, spec.center, spec.pad_mode, spec.onesided)

    def squares() -> torch.Tensor:
        z = stft()                                                   # (b, n_fft/2+1, t)
        return front_end.mel.mel_scale(z.real.square() + z.imag.square())   # (b, f, t)

    ways = {"torchaudio MelSpectrogram (abs(z).pow(2))": lambda: front_end.mel(wave),
            "the same with re² + im²": squares,
            "the STFT alone": stft}
    rounds: dict[str, list[float]] = {name: [] for name in ways}
    load_start = os.getloadavg()[0]
    with torch.no_grad():
        for _ in range(args.repeats):
            for name, fn in ways.items():
                rounds[name].append(median_call_ms(fn, args.calls))
        reference, fast = front_end.mel(wave), squares()
    rel = float(((fast - reference).abs() / reference.abs().clamp_min(1e-12)).max())
    ms = {name: statistics.median(v) for name, v in rounds.items()}
    names = list(ways)
    speedup = ms[names[0]] / ms[names[1]]
    rows = [("cpu", describe_cpu()), ("threads", str(args.threads)),
            ("input", f"{args.batch} x {args.seconds:g} s at {rate} Hz, n_fft {front_end.n_fft}, "
                      f"hop {front_end.hop_length}, {front_end.n_mels} mels")]
    rows += [(f"{name}: ms (per round)", f"{ms[name]:.2f} ({', '.join(f'{t:.2f}' for t in v)})")
             for name, v in rounds.items()]
    rows += [("speed-up of re² + im²", f"{speedup:.2f}x"),
             ("largest relative difference of the energies", f"{rel:.1e}")]
    print(quantity_table(rows))
    print(json.dumps(append_result(__file__, {"torchaudio_ms": round(ms[names[0]], 3),
                      "squares_ms": round(ms[names[1]], 3),
                      "stft_ms": round(ms[names[2]], 3), "speedup": round(speedup, 3),
                      "max_rel_diff": rel, "threads": args.threads, "cpu_flags": cpu_flags(),
                      "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                      "load_avg_start_end": [round(load_start, 2),
                                             round(os.getloadavg()[0], 2)]})))


if __name__ == "__main__":
    main()
