#!/usr/bin/env bash
# The driver doing its main job, in one command (after ./scripts/setup.sh): a one-node Ceph
# cluster, the real single-node Kubernetes of the e2e tier with the image built from the
# Dockerfile and deploy/ applied as docs/quickstart.md says, then a StorageClass, a claim and a
# pod that writes, the claim grown under the pod, a snapshot and a restored claim read by a second
# pod — each step printed with its time and the kubectl command (tests/e2e/demo.py; the same steps
# are the e2e tests tests/e2e/test_demo.py and, on the VM node, tests/e2e/test_vm_node.py).
# Everything stays up afterwards.
#
#   scripts/demo.sh [--node=auto|host|vm]   start (or say how to reach the one already running)
#   scripts/demo.sh --down                  stop it (the VM node too) and remove what it made
#
# --node: where the pods run. vm: the real-kernel VM node (tests/vm; the plugin maps with krbd)
# joined to the cluster; host: the host node (rbd-fuse where its kernel has no rbd module); auto
# (the default): the VM node where the VM tier can run (qemu, root, the VM image built by
# ./scripts/setup.sh), else the host node. The first line of the transcript says which, and why.
#
# It runs `python -m tests.e2e.run --demo` in the background, in its own session, and follows
# its output until the demo is done. State: $CEPHCSI_DEMO_DIR (default /run/cephcsi-demo).
set -euo pipefail
cd "$(dirname "$0")/.."
state=${CEPHCSI_DEMO_DIR:-/run/cephcsi-demo}
pidfile=$state/pid log=$state/transcript.log ready=$state/ready

running() { [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

node=auto
case "${1:-}" in
    --node=auto|--node=host|--node=vm) node=${1#--node=} ;;
    --down)
        if ! running; then echo "no demo is running"; exit 0; fi
        pid=$(cat "$pidfile")
        echo "stopping the demo (pid $pid): the driver removes its volumes, then the nodes (the VM node too) and Ceph stop"
        kill -TERM "$pid"
        while kill -0 "$pid" 2>/dev/null; do sleep 1; done
        tail -n 3 "$log"
        rm -f "$pidfile" "$ready"
        exit 0 ;;
    "") ;;
    *) echo "usage: $0 [--node=auto|host|vm] | --down" >&2; exit 2 ;;
esac

if [[ $(id -u) != 0 ]]; then echo "run as root: the node changes mounts, links, iptables and sysctls" >&2; exit 2; fi
if [[ ! -x .venv/bin/python ]]; then echo "run ./scripts/setup.sh first" >&2; exit 2; fi
if running; then
    echo "a demo is already running (pid $(cat "$pidfile")); how to reach it:"
    sed -n '/is up (/,$p' "$log"
    exit 0
fi

mkdir -p "$state"
rm -f "$ready"
: > "$log"
setsid .venv/bin/python -u -m tests.e2e.run --demo --node="$node" --ready-file "$ready" >"$log" 2>&1 </dev/null &
pid=$!
echo "$pid" > "$pidfile"
echo "starting (builds what is not cached yet: the first run on a machine takes minutes); transcript: $log"
tail -s 0.3 -n +1 -f --pid="$pid" "$log" &
follower=$!
while [[ ! -e $ready ]] && kill -0 "$pid" 2>/dev/null; do sleep 1; done
sleep 1
kill "$follower" 2>/dev/null || true
wait "$follower" 2>/dev/null || true
if [[ ! -e $ready ]]; then
    wait "$pid" && rc=0 || rc=$?
    echo "the demo failed (exit $rc); the transcript above and $log say where" >&2
    rm -f "$pidfile"
    exit 1
fi
echo
echo "The demo keeps running: use the KUBECONFIG above; scripts/demo.sh --down stops it."
