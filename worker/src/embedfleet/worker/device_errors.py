"""Which engine errors mean the device is lost (pure).

Most CUDA errors fail one call and leave the context usable: running out of memory, a bad
argument. A few are sticky: the context is corrupted, and every later kernel launch, copy or
synchronisation of the process fails the same way until it exits. A worker that kept serving
after one would answer every request with an error while its health said SERVING; it has to stop
being ready and exit, so that the kubelet restarts it with a fresh context.
"""

from __future__ import annotations

#: The sticky errors, as torch words them ("CUDA error: " + cudaGetErrorString), lower case.
STICKY_CUDA_ERRORS = (
    "illegal memory access",  # cudaErrorIllegalAddress
    "device-side assert",  # cudaErrorAssert
    "unspecified launch failure",  # cudaErrorLaunchFailure
    "misaligned address",  # cudaErrorMisalignedAddress
    "illegal instruction",  # cudaErrorIllegalInstruction
    "invalid program counter",  # cudaErrorInvalidPc
    "hardware stack error",  # cudaErrorHardwareStackError
    "uncorrectable ecc error",  # cudaErrorECCUncorrectable
    "uncorrectable nvlink error",  # cudaErrorNvlinkUncorrectable
    "the launch timed out",  # cudaErrorLaunchTimeout
    "context is destroyed",  # cudaErrorContextIsDestroyed
    "unknown error",  # cudaErrorUnknown: what a GPU fallen off the bus (Xid 79) reports
)


def device_lost(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, is a sticky CUDA error."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current).lower()
        if "cuda" in text and any(sticky in text for sticky in STICKY_CUDA_ERRORS):
            return True
        current = current.__cause__ or current.__context__
    return False
