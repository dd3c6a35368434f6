"""CSI Identity service."""
from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import wrappers_pb2

from cephcsi import __version__
from cephcsi._generated import csi_pb2, csi_pb2_grpc
from cephcsi.csi.rpc import ServicerBase, rpc

_Service = csi_pb2.PluginCapability.Service
_Expansion = csi_pb2.PluginCapability.VolumeExpansion


@dataclass
class IdentityOptions:
    driver_name: str
    controller: bool
    """Advertise CONTROLLER_SERVICE (controller and all modes)."""
    topology: bool
    """Advertise VOLUME_ACCESSIBILITY_CONSTRAINTS (a node plugin run with --domainlabels, or a controller
    run with --feature-gates=Topology=true: cephcsi.cli.wiring.advertises_topology)."""
    online_expansion: bool = False
    group_controller: bool = False
    """Advertise GROUP_CONTROLLER_SERVICE (volume group snapshots; served with the controller)."""


class IdentityServicer(ServicerBase, csi_pb2_grpc.IdentityServicer):
    service_name = "Identity"

    def __init__(self, options: IdentityOptions) -> None:
        self.options = options
        self.driver_name = options.driver_name

    @rpc
    def GetPluginInfo(self, request: csi_pb2.GetPluginInfoRequest, context: object) -> csi_pb2.GetPluginInfoResponse:
        return csi_pb2.GetPluginInfoResponse(name=self.options.driver_name, vendor_version=__version__)

    @rpc
    def GetPluginCapabilities(
        self, request: csi_pb2.GetPluginCapabilitiesRequest, context: object
    ) -> csi_pb2.GetPluginCapabilitiesResponse:
        caps = []
        if self.options.controller:
            caps.append(csi_pb2.PluginCapability(service=_Service(type=_Service.CONTROLLER_SERVICE)))
        if self.options.group_controller:
            caps.append(csi_pb2.PluginCapability(service=_Service(type=_Service.GROUP_CONTROLLER_SERVICE)))
        if self.options.topology:
            caps.append(csi_pb2.PluginCapability(service=_Service(type=_Service.VOLUME_ACCESSIBILITY_CONSTRAINTS)))
        if self.options.online_expansion:
            caps.append(csi_pb2.PluginCapability(volume_expansion=_Expansion(type=_Expansion.ONLINE)))
        return csi_pb2.GetPluginCapabilitiesResponse(capabilities=caps)

    @rpc
    def Probe(self, request: csi_pb2.ProbeRequest, context: object) -> csi_pb2.ProbeResponse:
        # Cheap by design: the kubelet and livenessprobe call it often; Ceph health is not ours to judge.
        # Identity calls run on threads reserved for them (cephcsi.csi.server), so anything that can
        # block here would bring back the starvation those threads exist to prevent.
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=True))
