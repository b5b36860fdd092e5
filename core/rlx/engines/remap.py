"""Device tensors whose addresses outlive their memory (CUDA's virtual memory management).

Under ``rollout.sleep`` the decode loop hands its cache back while the policy trains. Freed
through PyTorch's allocator, the cache comes back at other addresses, and the CUDA graphs
that read it must be captured again every rollout, once per batch-size bucket (on W1 the
allocation, warm-up step and capture took 44 ms a rollout: ``benchmarks/sleep_cost.py``).
Here the addresses are reserved once: ``unmap`` hands the physical memory behind them back to
the device and ``map`` puts new memory at the same addresses, so the graphs replay as they
were captured. What the tensors held is lost in between.

The driver is called through ``ctypes`` (``libcuda``), which PyTorch's CUDA build loads.
"""

from __future__ import annotations

import ctypes
import math

import torch

ALIGN = 256  # bytes between the tensors' starts, as PyTorch's allocator aligns them

# CUDA driver constants (cuda.h)
_PINNED, _ON_DEVICE, _READ_WRITE, _MINIMUM = 1, 1, 3, 0
_VMM_SUPPORTED = 102  # CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_driver = None
_mapped: dict[int, int] = {}  # bytes mapped now, by device index
_peak: dict[int, int] = {}  # the most mapped since ``reset_peak``


def mapped(device: torch.device) -> int:
    """Bytes mapped on ``device`` now: memory PyTorch's allocator does not count."""
    return _mapped.get(_index(device), 0)


def peak_mapped(device: torch.device) -> int:
    """The most bytes mapped at once on ``device`` since the last ``reset_peak``: memory
    PyTorch's allocator does not count."""
    return _peak.get(_index(device), 0)


def reset_peak(device: torch.device) -> None:
    index = _index(device)
    _peak[index] = _mapped.get(index, 0)


def _cuda():
    global _driver
    if _driver is None:
        _driver = ctypes.CDLL("libcuda.so.1")
    return _driver


def _check(result: int, call: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        _cuda().cuGetErrorName(result, ctypes.byref(name))
        raise RuntimeError(f"{call} failed: {(name.value or b'?').decode()} ({result})")


def supported(device: torch.device) -> bool:
    """Whether ``device`` is a CUDA device whose driver maps memory at reserved addresses."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        value = ctypes.c_int()
        torch.cuda.init()
        _check(_cuda().cuDeviceGetAttribute(ctypes.byref(value), _VMM_SUPPORTED, _index(device)),
               "cuDeviceGetAttribute")
        return value.value == 1
    except (OSError, AttributeError, RuntimeError):
        return False


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


class _Window:
    """``__cuda_array_interface__`` over a byte range, for ``torch.as_tensor``."""

    def __init__(self, address: int, size: int):
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (address, False),
                                         "version": 3, "strides": None}


def layout(specs: list[tuple[tuple[int, ...], torch.dtype]]) -> tuple[list[int], int]:
    """Each tensor's byte offset in one range, ``ALIGN``-aligned, and the bytes they take."""
    offsets, end = [], 0
    for shape, dtype in specs:
        offsets.append(end)
        end += -(-math.prod(shape) * dtype.itemsize // ALIGN) * ALIGN
    return offsets, end


class Remappable:
    """Tensors of ``specs`` (shape, dtype) in one reserved range of ``device``'s addresses,
    mapped (and zeroed) on creation. ``unmap`` hands their memory back; ``map`` gives them
    new, zeroed memory at the same addresses. ``close`` frees the addresses: the tensors
    must not be used after it."""

    def __init__(self, device: torch.device, specs: list[tuple[tuple[int, ...], torch.dtype]]):
        self.device = torch.device("cuda", _index(device))
        offsets, size = layout(specs)
        self._prop = _Prop(type=_PINNED, location=_Location(type=_ON_DEVICE, id=self.device.index))
        granularity = ctypes.c_size_t()
        _check(_cuda().cuMemGetAllocationGranularity(ctypes.byref(granularity), ctypes.byref(self._prop), _MINIMUM),
               "cuMemGetAllocationGranularity")
        self.size = -(-max(size, 1) // granularity.value) * granularity.value
        self.address = None
        address = ctypes.c_uint64()
        torch.cuda.synchronize(self.device)  # the device's context current in this thread
        _check(_cuda().cuMemAddressReserve(ctypes.byref(address), ctypes.c_size_t(self.size), ctypes.c_size_t(0),
                                           ctypes.c_uint64(0), ctypes.c_uint64(0)), "cuMemAddressReserve")
        self.address, self._handle, self._whole = address.value, None, None
        self.map()
        self._whole = torch.as_tensor(_Window(self.address, self.size), device=self.device)
        self._whole.zero_()
        self.tensors = [self._whole[o:o + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
                        for o, (shape, dtype) in zip(offsets, specs)]

    @property
    def mapped(self) -> bool:
        return self._handle is not None

    def map(self, zero: bool = True) -> bool:
        """Memory behind the addresses (zeroed unless ``zero`` is False); False if it was
        there already."""
        if self.mapped:
            return False
        handle = ctypes.c_uint64()
        size = ctypes.c_size_t(self.size)
        _check(_cuda().cuMemCreate(ctypes.byref(handle), size, ctypes.byref(self._prop), ctypes.c_uint64(0)),
               "cuMemCreate")
        try:
            _check(_cuda().cuMemMap(ctypes.c_uint64(self.address), size, ctypes.c_size_t(0), handle,
                                    ctypes.c_uint64(0)), "cuMemMap")
            access = _Access(location=_Location(type=_ON_DEVICE, id=self.device.index), flags=_READ_WRITE)
            _check(_cuda().cuMemSetAccess(ctypes.c_uint64(self.address), size, ctypes.byref(access),
                                          ctypes.c_size_t(1)), "cuMemSetAccess")
        except RuntimeError:
            _cuda().cuMemUnmap(ctypes.c_uint64(self.address), size)
            _cuda().cuMemRelease(handle)
            raise
        self._handle = handle
        index = self.device.index
        _mapped[index] = _mapped.get(index, 0) + self.size
        _peak[index] = max(_peak.get(index, 0), _mapped[index])
        if zero and self._whole is not None:
            self._whole.zero_()
        return True

    def unmap(self) -> None:
        """Hand the memory back (after the work queued on it), keeping the addresses."""
        if not self.mapped:
            return
        torch.cuda.synchronize(self.device)
        _check(_cuda().cuMemUnmap(ctypes.c_uint64(self.address), ctypes.c_size_t(self.size)), "cuMemUnmap")
        _check(_cuda().cuMemRelease(self._handle), "cuMemRelease")
        self._handle = None
        _mapped[self.device.index] -= self.size

    def close(self) -> None:
        if self.address is None:
            return
        self.unmap()
        self.tensors, self._whole = [], None
        _check(_cuda().cuMemAddressFree(ctypes.c_uint64(self.address), ctypes.c_size_t(self.size)),
               "cuMemAddressFree")
        self.address = None

    def __del__(self):  # an engine dropped without ``release``: its memory and addresses back
        try:
            self.close()
        except Exception:  # at interpreter exit the driver may be gone, and takes them anyway
            pass
