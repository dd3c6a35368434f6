"""The Kubernetes objects a KMS reads (Secrets, vaulttokens' ConfigMap): through the sidecars' API
client in the controller, else through `LazyKubeReader`, which connects only on the first read a
KMS asks for. Design: docs/design/encryption-and-frontends.md.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from cephcsi.errors import FailedPrecondition, NotFound, PermissionDenied

if TYPE_CHECKING:
    from cephcsi.sidecars.api import KubeApi


RBAC_HINT = ("grant it there: kubectl -n {namespace} create rolebinding cephcsi-kms-reader "
             "--clusterrole=cephcsi-kms-reader --serviceaccount=<driver namespace>:<this plugin's ServiceAccount> "
             "(deploy/node-rbac.yaml)")


class KubeSecretReader:
    def __init__(self, api: KubeApi) -> None:
        self.api = api

    def read_secret(self, namespace: str, name: str) -> Mapping[str, str] | None:
        try:
            return self.api.read_secret(namespace, name)
        except NotFound:
            return None
        except PermissionDenied as error:
            raise PermissionDenied(f"{error.message}; {RBAC_HINT.format(namespace=namespace)}") from None

    def read_config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        try:
            return self.api.read_config_map(namespace, name)
        except NotFound:
            return None
        except PermissionDenied as error:
            raise PermissionDenied(f"{error.message}; {RBAC_HINT.format(namespace=namespace)}") from None


def connect(kubeconfig: str) -> KubeApi:
    """An API client from `kubeconfig` ('' = the pod's ServiceAccount); FailedPrecondition when
    there is no usable configuration (a KMS needs the API, and the process was given none)."""
    # The client library loads only when a KMS first needs it (node plugins without encryption never do).
    from cephcsi.kube.client import ClientSettings, new_api_client
    from cephcsi.kube.errors import KubeError
    from cephcsi.sidecars.api import KubeApi

    try:
        # qps=0: a KMS read happens once per volume call; the limiter would only add a thread-safe no-op.
        return KubeApi(new_api_client(ClientSettings(kubeconfig=kubeconfig or None, qps=0)))
    except KubeError as error:
        raise FailedPrecondition(
            f"the KMS needs the Kubernetes API (to read a Secret or ConfigMap), but {error.message}; "
            "run the plugin with its ServiceAccount token mounted or pass --kubeconfig"
        ) from None


class LazyKubeReader:
    """A KubeSecretReader built on first use. A failed connect is not remembered: the next read
    tries again (the token may be mounted by then)."""

    def __init__(self, kubeconfig: str = "", connector: Callable[[str], KubeApi] = connect) -> None:
        self.kubeconfig = kubeconfig
        self._connector = connector
        self._lock = threading.Lock()
        self._reader: KubeSecretReader | None = None

    @property
    def connected(self) -> bool:
        return self._reader is not None

    def _get(self) -> KubeSecretReader:
        with self._lock:
            if self._reader is None:
                self._reader = KubeSecretReader(self._connector(self.kubeconfig))
            return self._reader

    def read_secret(self, namespace: str, name: str) -> Mapping[str, str] | None:
        return self._get().read_secret(namespace, name)

    def read_config_map(self, namespace: str, name: str) -> Mapping[str, str] | None:
        return self._get().read_config_map(namespace, name)
