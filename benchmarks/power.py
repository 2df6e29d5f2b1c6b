"""The GPU's energy counter, SM clock and temperature, read through NVML (ctypes: no
Python package needed). At the H200's 690 W cap a kernel's speed is its energy per call: two
kernels that draw the cap run at whatever clock their energy per cycle allows, so comparing
joules per call says which one the power limit favours and by how much.

`Gpu.open()` returns None where NVML or the device cannot be read (no driver library, a CPU-only
machine); callers then report times only.
"""

from __future__ import annotations

import ctypes
import threading
import time

import torch

NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0


class Gpu:
    def __init__(self, lib: ctypes.CDLL, handle: ctypes.c_void_p):
        self._lib, self._handle = lib, handle

    @classmethod
    def open(cls, device: int | None = None) -> Gpu | None:
        """NVML's handle on the torch device `device` (default: the current one), found by PCI
        bus id so that CUDA_VISIBLE_DEVICES cannot point it at another GPU."""
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return None
            props = torch.cuda.get_device_properties(torch.cuda.current_device() if device is None else device)
            bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0".encode()
            handle = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByPciBusId_v2(ctypes.c_char_p(bus_id), ctypes.byref(handle)) != 0:
                return None
            gpu = cls(lib, handle)
            gpu.energy_mj()  # fails (None) before Volta or without permission
            return gpu
        except (OSError, AttributeError, RuntimeError, AssertionError):
            return None

    def _read(self, function: str, *args, kind=ctypes.c_uint) -> int:
        value = kind()
        status = getattr(self._lib, function)(self._handle, *args, ctypes.byref(value))
        if status != 0:
            raise RuntimeError(f"{function}: NVML error {status}")
        return value.value

    def energy_mj(self) -> int:
        """Millijoules the GPU has used since the driver loaded."""
        return self._read("nvmlDeviceGetTotalEnergyConsumption", kind=ctypes.c_ulonglong)

    def sm_clock_mhz(self) -> int:
        return self._read("nvmlDeviceGetClockInfo", NVML_CLOCK_SM)

    def temperature_c(self) -> int:
        return self._read("nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU)


class Sampler:
    """SM clock and temperature sampled every `interval_s` on a thread, while in the `with`."""

    def __init__(self, gpu: Gpu, interval_s: float = 0.02):
        self.gpu, self.interval_s = gpu, interval_s
        self.clocks: list[int] = []
        self.temperatures: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.clocks.append(self.gpu.sm_clock_mhz())
            self.temperatures.append(self.gpu.temperature_c())
            time.sleep(self.interval_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
