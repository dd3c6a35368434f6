"""What this machine's root may do: some test machines run root without every capability."""
from __future__ import annotations

CAP_SYS_RESOURCE = 24


def has_capability(bit: int) -> bool:
    with open("/proc/self/status", encoding="ascii") as handle:
        effective = next(int(line.split()[1], 16) for line in handle if line.startswith("CapEff:"))
    return bool(effective & (1 << bit))


def can_grow_ext4_online() -> bool:
    """EXT4_IOC_RESIZE_FS needs CAP_SYS_RESOURCE, which root lacks on some machines (this
    project's VMs among them); the driver then answers FAILED_PRECONDITION saying so. A node
    plugin container has no capability its host's root lacks."""
    return has_capability(CAP_SYS_RESOURCE)
