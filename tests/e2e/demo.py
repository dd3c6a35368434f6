"""The demo (scripts/demo.sh): the driver doing its main job on the e2e node, one step at a time,
each printed with the `kubectl` command a user would type and the seconds it took.

A StorageClass from deploy/examples/storageclass.yaml, the claim and pod of
deploy/examples/pvc-pod.yaml (the pod writes a file, the demo reads it back), the claim grown
while the pod runs, a VolumeSnapshot of it and a claim restored from that snapshot, read by a
second pod. The manifests are the shipped examples with only what a user fills in changed
(clusterID, pool, namespace, and the image: no registry is reachable, so pods run the project's
own image, which has a shell). The pods run on `node` when one is given (a nodeSelector, as a
user pins them; scripts/demo.sh --node=vm: the real-kernel VM node), and the transcript names the
mapper that node's plugin chose and the device the pod's filesystem is on. The same steps are
the e2e tests tests/e2e/test_demo.py (host node) and test_vm_node.py (VM node).
"""
from __future__ import annotations

import copy
import json
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

import yaml

from tests.capabilities import can_grow_ext4_online
from tests.e2e.env import DEPLOY, IMAGE, E2EEnv, storage_class
from tests.e2e.kube import DEPLOY_NAMESPACE, NODE_LABELS, wait_for

CLASS = "cephcsi-demo"
CLAIM = "cephcsi-demo"
POD = "cephcsi-demo"
SNAPSHOT = "data-snapshot"
RESTORED = "data-restored"
READER = "cephcsi-demo-restored"
FIRST_SIZE, GROWN_SIZE = "1Gi", "2Gi"
GIB = 1 << 30


@dataclass
class DemoResult:
    """What the demo saw, for its test to check."""

    mounter: str = ""
    fstype: str = ""
    device: str = ""
    """The device the first pod's /data is on (as `df` shows it in the pod)."""
    written: str = ""
    size_before: int = 0
    size_after: int = 0
    restored: str = ""
    steps: dict[str, float] = field(default_factory=dict)


def _examples() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """deploy/examples/pvc-pod.yaml's claim and pod, and the snapshot example's restore claim."""
    claim, pod = yaml.safe_load_all((DEPLOY / "examples" / "pvc-pod.yaml").read_text())
    restored = next(d for d in yaml.safe_load_all((DEPLOY / "examples" / "snapshots" / "snapshotclass.yaml").read_text())
                    if d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == RESTORED)
    return claim, pod, restored


class Demo:
    """Runs the steps against a running e2e environment, printing the transcript to `out`."""

    def __init__(self, env: E2EEnv, out: TextIO, namespace: str = "default", snapshot_class: str = "",
                 node: str = "", fstype: str = "", patience: float = 1.0) -> None:
        """`node`: where the pods run ('' = where the scheduler puts them: the one host node);
        `fstype`: the class's ('' = ext4 where this machine grows it online, else xfs);
        `patience`: how many times the host node's timeouts the node needs (a TCG VM: more)."""
        self.env = env
        self.out = out
        self.namespace = namespace
        self.snapshot_class = snapshot_class
        self.node = node
        self.fstype = fstype
        self.patience = patience
        self.result = DemoResult()

    # ---- printing and kubectl ---------------------------------------------------------------

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def kubectl(self, *args: str, manifest: list[dict[str, Any]] | None = None, shown: str = "",
                quiet: bool = False, timeout: float = 120.0) -> str:
        """Runs kubectl (the node's binary and kubeconfig) and prints the command as a user would
        type it (`shown` replaces it where the user would pipe a file through sed)."""
        self.say("  $ " + (shown or "kubectl " + shlex.join(args)))
        text = yaml.safe_dump_all(manifest) if manifest is not None else None
        output = self.env.kube.kubectl(*args, input_text=text, timeout=timeout)
        if output.strip() and not quiet:
            self.say("    " + output.rstrip().replace("\n", "\n    "))
        return output

    def step(self, title: str, action: Callable[[], None]) -> None:
        self.say(f"\n== {title}")
        started = time.monotonic()
        action()
        seconds = round(time.monotonic() - started, 1)
        self.result.steps[title] = seconds
        self.say(f"   ({seconds} s)")

    def _ns(self, *args: str) -> tuple[str, ...]:
        return ("-n", self.namespace, *args)

    def _wait(self, seconds: int) -> tuple[str, float]:
        """A `kubectl wait` timeout flag and the timeout of the kubectl call around it."""
        scaled = round(seconds * self.patience)
        return f"--timeout={scaled}s", scaled + 20.0

    # ---- the steps --------------------------------------------------------------------------

    def run(self) -> DemoResult:
        self.step("The driver: two controller replicas (one process each, sidecars inside) and the node plugin",
                  self.show_driver)
        self.step("A StorageClass (deploy/examples/storageclass.yaml with clusterID and pool filled in)",
                  self.create_class)
        self.step("A claim and a pod that writes to it (deploy/examples/pvc-pod.yaml)", self.claim_and_pod)
        self.step(f"The claim grown from {FIRST_SIZE} to {GROWN_SIZE} while the pod runs", self.expand)
        if self.snapshot_class:
            self.step("A VolumeSnapshot of the claim", self.snapshot)
            self.step("A claim restored from the snapshot, read by a second pod", self.restore)
        else:
            self.say("\n(snapshot steps skipped: the snapshot CRDs and snapshot-controller are not installed)")
        return self.result

    def show_driver(self) -> None:
        self.kubectl("-n", DEPLOY_NAMESPACE, "get", "pods", "-o", "wide")
        node = self.node or self.env.node.name
        # A plugin is Ready once its container runs; it logs its choice a moment later (seconds
        # of Python start-up under an emulated CPU).
        chosen = wait_for(f"the node plugin on {node} logging its mapper", lambda: self._mapper_line(node),
                          timeout=60 * self.patience, interval=1.0)
        found = re.search(r'mounter"?[=:] ?"?([\w-]+)', chosen)
        self.result.mounter = found.group(1) if found else "unknown"
        self.say(f"  node {node}: the node plugin maps volumes with {self.result.mounter} "
                 "(--mounter=auto: krbd where the kernel has rbd, else rbd-nbd, else rbd-fuse)")

    def _mapper_line(self, node: str) -> str | None:
        """The plugin on `node`'s log line naming its default mapper, once written."""
        plugins = [pod["metadata"]["name"] for pod in self.env.kube.pods(DEPLOY_NAMESPACE, NODE_LABELS)
                   if pod["spec"].get("nodeName") == node]
        logs = self.env.kube.logs(plugins[0]) if plugins else ""
        return next((line for line in logs.splitlines() if "default mapper" in line), None)

    def create_class(self) -> None:
        fstype = self.fstype or ("ext4" if can_grow_ext4_online() else "xfs")
        self.result.fstype = fstype
        if fstype == "xfs" and not self.fstype:
            self.say("  (xfs: ext4 cannot grow online on this machine, whose root lacks CAP_SYS_RESOURCE)")
        doc = storage_class(self.env.ceph, CLASS, fstype)
        shown = (f"sed -e 's/name: csi-rbd-sc/name: {CLASS}/' -e 's/REPLACE-WITH-CEPH-FSID/{self.env.ceph.cluster_id}/' "
                 f"-e 's/pool: kubernetes/pool: {self.env.ceph.pool}/' -e 's/fstype: ext4/fstype: {fstype}/' "
                 "deploy/examples/storageclass.yaml | kubectl apply -f -")
        self.kubectl("apply", "-f", "-", manifest=[doc], shown=shown)

    def _pod(self, template: dict[str, Any], name: str, claim: str, script: str) -> dict[str, Any]:
        pod = copy.deepcopy(template)
        pod["metadata"] = {"name": name, "namespace": self.namespace}
        container = pod["spec"]["containers"][0]
        container["image"], container["imagePullPolicy"] = IMAGE, "Never"
        container["args"] = [f"trap 'exit 0' TERM\n{script}\nsleep infinity &\nwait\n"]
        pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] = claim
        pod["spec"]["terminationGracePeriodSeconds"] = 5
        if self.node:
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": self.node}
        return pod

    def _placement(self) -> str:
        return f", nodeSelector kubernetes.io/hostname: {self.node}" if self.node else ""

    def claim_and_pod(self) -> None:
        claim, pod, _ = _examples()
        claim = copy.deepcopy(claim)
        claim["metadata"]["namespace"] = self.namespace
        claim["spec"]["storageClassName"] = CLASS
        writer = self._pod(pod, POD, CLAIM, "date > /data/hello && sync && echo written || exit 1")
        self.kubectl("apply", "-f", "-", manifest=[claim, writer],
                     shown=f"kubectl apply -f deploy/examples/pvc-pod.yaml   # storageClassName: {CLASS}"
                           + self._placement())
        flag, timeout = self._wait(120)
        self.kubectl(*self._ns("wait", "--for=jsonpath={.status.phase}=Bound", f"pvc/{CLAIM}", flag), timeout=timeout)
        flag, timeout = self._wait(180)
        self.kubectl(*self._ns("wait", "--for=condition=Ready", f"pod/{POD}", flag), timeout=timeout)
        self.result.written = wait_for("the pod's file", lambda: self.env.kube.exec_in(
            self.namespace, POD, "cat /data/hello 2>/dev/null || true").strip(), timeout=60 * self.patience)
        self.kubectl(*self._ns("exec", POD, "--", "cat", "/data/hello"))
        output = self.kubectl(*self._ns("exec", POD, "--", "df", "-B1", "--output=source,size,target", "/data"))
        self.result.device, size, _ = output.split()[-3:]
        self.result.size_before = int(size)
        self.say(f"  the pod's /data is on {self.result.device}, mapped by the node plugin on "
                 f"{self.node or self.env.node.name}")

    def expand(self) -> None:
        patch = json.dumps({"spec": {"resources": {"requests": {"storage": GROWN_SIZE}}}})
        self.kubectl(*self._ns("patch", "pvc", CLAIM, "-p", patch))
        flag, timeout = self._wait(180)
        self.kubectl(*self._ns("wait", f"--for=jsonpath={{.status.capacity.storage}}={GROWN_SIZE}", f"pvc/{CLAIM}",
                               flag), timeout=timeout)
        grown = wait_for("the pod's filesystem grown", lambda: self._grown(POD), timeout=180 * self.patience,
                         interval=2.0)
        self.result.size_after = grown
        self.kubectl(*self._ns("exec", POD, "--", "df", "-h", "/data"))

    def _grown(self, pod: str) -> int | None:
        size = int(self.env.kube.exec_in(self.namespace, pod, "df -B1 --output=size /data | tail -n 1").strip())
        return size if size > self.result.size_before + GIB // 2 else None

    def snapshot(self) -> None:
        self.kubectl("get", "volumesnapshotclass", self.snapshot_class)
        self.kubectl(*self._ns("exec", POD, "--", "sync"))
        snapshot = {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                    "metadata": {"name": SNAPSHOT, "namespace": self.namespace},
                    "spec": {"volumeSnapshotClassName": self.snapshot_class,
                             "source": {"persistentVolumeClaimName": CLAIM}}}
        self.kubectl("apply", "-f", "-", manifest=[snapshot],
                     shown="kubectl apply -f deploy/examples/snapshots/snapshotclass.yaml   # its VolumeSnapshot")
        flag, timeout = self._wait(240)
        self.kubectl(*self._ns("wait", "--for=jsonpath={.status.readyToUse}=true", f"volumesnapshot/{SNAPSHOT}",
                               flag), timeout=timeout)
        self.kubectl(*self._ns("get", "volumesnapshot", SNAPSHOT))

    def restore(self) -> None:
        _, pod, restored = _examples()
        restored = copy.deepcopy(restored)
        restored["metadata"]["namespace"] = self.namespace
        restored["spec"]["storageClassName"] = CLASS
        restored["spec"]["resources"]["requests"]["storage"] = GROWN_SIZE  # at least the snapshot's size
        reader = self._pod(pod, READER, RESTORED, "cat /data/hello")
        self.kubectl("apply", "-f", "-", manifest=[restored, reader],
                     shown="kubectl apply -f deploy/examples/snapshots/snapshotclass.yaml   # its restore claim, "
                           "and a pod reading it" + self._placement())
        flag, timeout = self._wait(180)
        self.kubectl(*self._ns("wait", "--for=jsonpath={.status.phase}=Bound", f"pvc/{RESTORED}", flag),
                     timeout=timeout)
        self.kubectl(*self._ns("wait", "--for=condition=Ready", f"pod/{READER}", flag), timeout=timeout)
        self.result.restored = self.kubectl(*self._ns("exec", READER, "--", "cat", "/data/hello")).strip()
        self.say("  the restored claim holds what the first pod wrote" if self.result.restored == self.result.written
                 else "  THE RESTORED CLAIM DIFFERS from what the first pod wrote")
