"""ROSE's exceptions. Hosts map them to their own error codes once."""


class RoseError(Exception):
    """Base class for every error ROSE raises on purpose."""


class ModelLoadError(RoseError):
    """The model directory is missing, malformed, or not supported."""


class InvalidBatchError(RoseError, ValueError):
    """A batch the engine cannot run (bad ids, lengths, or output kind)."""


class AdapterError(RoseError):
    """A LoRA adapter that cannot be loaded (malformed, a PEFT option ROSE
    does not apply, trained for another base, over a bound) or unloaded
    (no adapter by that name). The engine is unchanged when this is raised."""


class DeviceError(RoseError):
    """The device failed in a way that outlives the step (a sticky CUDA
    error such as an illegal address, or a step that never completed): the
    process's CUDA context is unusable, so every later step would fail too.
    A host should stop serving and exit rather than retry."""


def is_sticky_cuda_error(e: BaseException) -> bool:
    """Whether ``e`` is CUDA reporting a context-corrupting error."""
    text = str(e)
    return "CUDA error" in text and any(m in text for m in _STICKY)


# torch's messages for the CUDA errors after which the context is lost.
_STICKY = ("illegal memory access", "illegal address", "unspecified launch failure", "device-side assert",
           "illegal instruction", "misaligned address", "invalid program counter", "hardware stack error",
           "uncorrectable ECC", "the launch timed out")
