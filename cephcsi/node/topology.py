"""Topology segments for NodeGetInfo, from the labels of this node's Node object.

`--domainlabels` → `topology.<driver name>/<label suffix>` (ceph-csi's keys), read at each
NodeGetInfo with a client of its own; API unreachable is UNAVAILABLE, a missing label
FAILED_PRECONDITION. docs/design/node.md, "Topology".
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from cephcsi.errors import FailedPrecondition, Unavailable
from cephcsi.observability.logging import fields

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api

log = logging.getLogger(__name__)

# The labels serve --domainlabels (NodeGetInfo) and config.json readAffinity (krbd maps).
_CANNOT = "cannot read the node labels (--domainlabels, readAffinity)"


class NodeLabels(Protocol):
    def labels(self, node_name: str) -> Mapping[str, str]: ...


def segment_key(driver_name: str, label: str) -> str:
    return f"topology.{driver_name}/{label.rsplit('/', 1)[-1]}"


def segments(driver_name: str, domain_labels: Sequence[str], labels: Mapping[str, str], node_name: str) -> dict[str, str]:
    missing = [label for label in domain_labels if not labels.get(label)]
    if missing:
        raise FailedPrecondition(
            f"node {node_name} lacks the topology label(s) {', '.join(missing)} named by --domainlabels; "
            "label the node (kubectl label node ...) or change --domainlabels"
        )
    return {segment_key(driver_name, label): labels[label] for label in domain_labels}


class KubeNodeLabels:
    """Reads a Node's labels through the kubernetes client."""

    def __init__(self, kubeconfig: str = "", timeout: float = 10.0) -> None:
        self.kubeconfig = kubeconfig
        self.timeout = timeout

    def _api(self, purpose: str) -> CoreV1Api:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException

        configuration = client.Configuration()
        try:
            if self.kubeconfig:
                config.load_kube_config(config_file=self.kubeconfig, client_configuration=configuration)
            else:
                config.load_incluster_config(client_configuration=configuration)
        except (ConfigException, OSError, ValueError) as error:
            source = self.kubeconfig or "the in-cluster service account"
            raise Unavailable(
                f"{purpose}: no usable Kubernetes client config from {source} ({error})"
            ) from None
        return client.CoreV1Api(client.ApiClient(configuration))

    def labels(self, node_name: str) -> Mapping[str, str]:
        return dict((self.node(node_name).get("metadata") or {}).get("labels") or {})

    def node(self, node_name: str, purpose: str = _CANNOT) -> dict[str, Any]:
        """The Node object as the API returns it; UNAVAILABLE (saying what `purpose` cannot do)
        when it cannot be read."""
        from kubernetes.client.exceptions import ApiException

        api = self._api(purpose)
        try:
            reply = api.read_node(node_name, _request_timeout=self.timeout, _preload_content=False)
            node = json.loads(reply.data)
        except ApiException as error:
            raise Unavailable(
                f"{purpose}: the API server answered {error.status} {error.reason} "
                f"for Node {node_name!r} (check that the node exists and the plugin may get nodes)"
            ) from None
        except Exception as error:  # noqa: BLE001 - urllib3/socket errors: the API is unreachable
            log.warning("reading the node failed", extra=fields(node=node_name, error=str(error)))
            raise Unavailable(f"{purpose}: the API server is unreachable ({type(error).__name__})") from None
        return node if isinstance(node, dict) else {}
