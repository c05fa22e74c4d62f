"""The one place that asks the GPU about itself: arch, name, SM count, L2 and shared memory.

Everything that depends on the device at hand (the shared-memory limit of the validator, the
SM count a persistent module is launched with, the L2 size the timing harness spills, the
machine of the tuner's L2 model, whether the tutorials' GPU cells run) reads it here, through
torch, when the question is asked: nothing is cached, so a test can stand in for a GPU by
replacing ``torch.cuda`` functions.

Runtime-only: this module imports no TVM and imports torch only when a question is asked (a
build box without torch gets "no GPU").
"""

from __future__ import annotations

from dataclasses import dataclass

# compute capability -> the arch a module must be built for to run there
_ARCH_OF = {(9, 0): "sm_90a", (10, 0): "sm_100a"}


def arch_of_capability(major: int, minor: int) -> str:
    """The arch string a rung must be built for to run on a GPU of this compute capability."""
    return _ARCH_OF.get((major, minor), f"sm_{major}{minor}")


@dataclass(frozen=True)
class GPU:
    """What the project needs to know about one CUDA device."""

    index: int
    name: str
    arch: str
    sm_count: int
    l2_bytes: int
    smem_per_block_optin: int | None


def _torch_cuda():
    """``torch.cuda`` when torch is installed and sees a GPU, else None."""
    try:
        import torch  # pylint: disable=import-outside-toplevel  (optional, heavy: only when asked)
    except ImportError:
        return None
    try:
        return torch.cuda if torch.cuda.is_available() else None
    except Exception:  # pylint: disable=broad-except  (a broken driver is "no GPU" here)
        return None


def why_no_gpu(arch: str | None = None, index: int = 0) -> str | None:
    """None when GPU ``index`` is there (and of ``arch``, if given); else the reason, in words."""
    try:
        import torch  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError:
        return "torch is not installed"
    cuda = _torch_cuda()
    if cuda is None:
        return "torch sees no CUDA GPU"
    have = arch_of(index)
    if arch is not None and have != arch:
        return f"GPU {index} ({cuda.get_device_name(index)}) is {have}, not {arch}"
    return None


def present(arch: str | None = None) -> bool:
    """Whether torch sees a CUDA GPU (of ``arch``, if given)."""
    return why_no_gpu(arch) is None


def arch_of(index: int) -> str:
    """The arch of CUDA device ``index`` (torch must see a GPU)."""
    import torch  # pylint: disable=import-outside-toplevel

    return arch_of_capability(*torch.cuda.get_device_capability(index))


def name_of(index: int) -> str:
    import torch  # pylint: disable=import-outside-toplevel

    return torch.cuda.get_device_name(index)


def sm_count(index: int) -> int:
    """SMs of CUDA device ``index``: the grid of a persistent module launched there."""
    import torch  # pylint: disable=import-outside-toplevel

    return torch.cuda.get_device_properties(index).multi_processor_count


def probe(index: int = 0, arch: str | None = None) -> GPU | None:
    """GPU ``index`` as torch sees it; None without one (or when it is not of ``arch``)."""
    cuda = _torch_cuda()
    if cuda is None:
        return None
    try:
        props = cuda.get_device_properties(index)
        have = arch_of_capability(props.major, props.minor)
        if arch is not None and have != arch:
            return None
        optin = getattr(props, "shared_memory_per_block_optin", None)
        return GPU(index=index, name=cuda.get_device_name(index), arch=have,
                   sm_count=props.multi_processor_count, l2_bytes=props.L2_cache_size,
                   smem_per_block_optin=int(optin) if optin else None)
    except Exception:  # pylint: disable=broad-except  (a device that cannot answer is not there)
        return None
