"""The benchmark sections, in the order they run. Adding figures = one new module exposing
`SECTION = Section(name, title, run)` and one line here (or replacing a pending slot's module).

Order matters where a later section reads what an earlier one left: `resources` reports the
controller's memory/CPU after `controller` has run its batches; `sidecars` compares against
the controller's RSS measured by then.
"""
from __future__ import annotations

from bench.sections import (
    controller_ops,
    go_sidecars,
    group_snapshots,
    kube_failover,
    kube_provisioning,
    node_ops,
    node_scale,
    node_vm,
    node_vm_crypt,
    resources,
    scale,
    snapshots,
)
from bench.sections.base import Section

SECTIONS: tuple[Section, ...] = (
    controller_ops.SECTION,
    node_ops.SECTION,
    node_scale.SECTION,
    node_vm.SECTION,
    node_vm_crypt.SECTION,
    resources.SECTION,
    go_sidecars.SECTION,
    kube_provisioning.SECTION,
    kube_failover.SECTION,
    snapshots.SECTION,
    group_snapshots.SECTION,
    scale.SECTION,
)


def by_name() -> dict[str, Section]:
    return {section.name: section for section in SECTIONS}
