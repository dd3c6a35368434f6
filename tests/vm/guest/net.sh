#!/bin/sh
# The VM test node's network (installed as /usr/local/sbin/cephcsi-vm-net): a static address on
# the host-local bridge, no default route (the guest talks to the host and nothing else). The
# address and hostname come from the kernel command line (cephcsi.ip=, cephcsi.hostname=), so
# one image serves every node of a test session.
set -eu
ip=10.247.0.2/24
name=cephcsi-vm
for word in $(cat /proc/cmdline); do
  case "$word" in
    cephcsi.ip=*) ip=${word#cephcsi.ip=} ;;
    cephcsi.hostname=*) name=${word#cephcsi.hostname=} ;;
  esac
done
hostname "$name"
# Belt and braces beside the unit's device dependency: eth0 must exist before it is configured.
for _ in $(seq 100); do [ -e /sys/class/net/eth0 ] && break; sleep 0.1; done
ip link set lo up
ip addr add "$ip" dev eth0
ip link set eth0 up
