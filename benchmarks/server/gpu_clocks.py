"""The GPU's SM clock and utilisation while a section runs, sampled through NVML (``nvidia-ml-py``, there on
machines with NVIDIA's Python stack; without it, or without a GPU, nothing is sampled).

A launch-bound workload (small kernels, the CPU between them) keeps a GPU mostly idle, and a GPU that is
mostly idle may not raise its clocks: the samples say whether the figures were taken at full clock.
"""

from __future__ import annotations

import statistics
import threading
from typing import Any

INTERVAL_SECONDS = 0.25


class ClockSampler:
    """(SM clock in MHz, utilisation in %) every ``INTERVAL_SECONDS`` between ``start`` and ``stop``."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handle: Any = None
        try:
            import pynvml  # noqa: PLC0415

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
        except Exception:  # no NVML library, no driver, no GPU: nothing to sample
            self._nvml = None
        self._samples: list[tuple[int, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def start(self) -> None:
        self._samples = []
        if not self.available:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-clock-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, Any] | None:
        """min/median/max SM clock and median utilisation since ``start``; None when nothing was sampled."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
        if not self._samples:
            return None
        clocks = [c for c, _ in self._samples]
        return {
            "samples": len(self._samples),
            "sm_mhz_min": min(clocks),
            "sm_mhz_median": statistics.median(clocks),
            "sm_mhz_max": max(clocks),
            "utilisation_median_percent": statistics.median(u for _, u in self._samples),
        }

    def _run(self) -> None:
        nvml = self._nvml
        while not self._stop.wait(INTERVAL_SECONDS):
            try:
                clock = nvml.nvmlDeviceGetClockInfo(self._handle, nvml.NVML_CLOCK_SM)
                busy = nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
            except Exception:  # a failed read is a missing sample, not a failed measurement
                continue
            self._samples.append((int(clock), int(busy)))
