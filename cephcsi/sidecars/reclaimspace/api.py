"""The loop's one write: the run's record on the claim (a merge patch of two annotations)."""
from __future__ import annotations

from kubernetes import client as k8s

from cephcsi.sidecars.api import call_json


class ReclaimApi:
    def __init__(self, api_client: k8s.ApiClient) -> None:
        self._core = k8s.CoreV1Api(api_client)

    def annotate_claim(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        body = {"metadata": {"annotations": annotations}}
        call_json(f'annotate PersistentVolumeClaim "{namespace}/{name}"',
                  lambda: self._core.patch_namespaced_persistent_volume_claim(
                      name, namespace, body, _preload_content=False))
