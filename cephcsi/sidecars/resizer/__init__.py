"""The embedded resizer: external-resizer's job (PVC grown → ControllerExpandVolume → PV
capacity → PVC status for the kubelet) in the controller process, behind leader election."""
