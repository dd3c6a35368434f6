"""Shared by the deploy/ tests against the real kube-apiserver (fixture `control_plane`)."""
from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest
from kubernetes.dynamic import DynamicClient

from tests.controlplane.cluster import ControlPlane
from tests.unit.deploy import manifests as m

FIELD_MANAGER = "cephcsi-deploy-test"


class Applier:
    """Server-side apply through the dynamic client, with strict field validation: an
    unknown or duplicated field (a typo such as `mountPropogation`) is an error, not a
    warning the apiserver drops the field with."""

    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.dynamic = DynamicClient(api_client)

    def resource(self, obj: dict[str, Any]) -> Any:
        return self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])

    def apply(self, obj: dict[str, Any], *, dry_run: bool) -> dict[str, Any]:
        resource = self.resource(obj)
        namespace = obj["metadata"].get("namespace") if resource.namespaced else None
        reply = self.dynamic.server_side_apply(
            resource,
            body=obj,
            namespace=namespace,
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
            dry_run="All" if dry_run else None,
            query_params=[("fieldValidation", "Strict")],
        )
        result: dict[str, Any] = reply.to_dict()
        return result

    def delete(self, obj: dict[str, Any]) -> None:
        resource = self.resource(obj)
        namespace = obj["metadata"].get("namespace") if resource.namespaced else None
        try:
            self.dynamic.delete(resource, name=obj["metadata"]["name"], namespace=namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture(scope="package")
def admin_applier(control_plane: ControlPlane) -> Iterator[Applier]:
    with control_plane.api_client() as client:
        yield Applier(client)


@pytest.fixture(scope="package")
def deploy_namespace(admin_applier: Applier) -> Iterator[str]:
    """The kustomization's namespace, created for real from deploy/namespace.yaml (namespaced
    objects cannot even be dry-run into a namespace that does not exist)."""
    namespace = m.find(m.render(), "Namespace")
    admin_applier.apply(namespace, dry_run=False)
    # Left in place: without kube-controller-manager's namespace controller a deleted namespace
    # stays Terminating for the rest of the session, and other test packages install the same
    # deploy/ RBAC into it (the fixtures below remove what they created instead).
    yield namespace["metadata"]["name"]


@pytest.fixture(scope="package")
def installed_rbac(admin_applier: Applier, deploy_namespace: str) -> Iterator[list[dict[str, Any]]]:
    """The ServiceAccounts, roles and bindings of deploy/, created for real."""
    kinds = ("ServiceAccount", "ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding")
    objects = [o for o in m.render() if o["kind"] in kinds]
    for obj in objects:
        admin_applier.apply(obj, dry_run=False)
    yield objects
    for obj in reversed(objects):
        admin_applier.delete(obj)
