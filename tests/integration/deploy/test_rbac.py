"""The RBAC of deploy/, created for real and asked of the real RBAC authorizer, with the
ServiceAccounts' own bound tokens (TokenRequest — what the kubelet projects into the pods):
the controller and node identities can do what they need and nothing on the deny lists
(tests/unit/deploy/manifests.py), and a few real requests behave accordingly."""
from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import kubernetes.client
import pytest

from tests.controlplane.cluster import ControlPlane
from tests.unit.deploy import manifests as m

pytestmark = [pytest.mark.integration, pytest.mark.kube]


@pytest.fixture(scope="module")
def controller_client(control_plane: ControlPlane, installed_rbac: list[dict[str, Any]]) -> Iterator[kubernetes.client.ApiClient]:
    token = control_plane.service_account_token(m.NAMESPACE, m.CONTROLLER_SA, expiration_seconds=600)
    with kubernetes.client.ApiClient(control_plane.configuration(token)) as client:
        yield client


@pytest.fixture(scope="module")
def node_client(control_plane: ControlPlane, installed_rbac: list[dict[str, Any]]) -> Iterator[kubernetes.client.ApiClient]:
    token = control_plane.service_account_token(m.NAMESPACE, m.NODE_SA, expiration_seconds=600)
    with kubernetes.client.ApiClient(control_plane.configuration(token)) as client:
        yield client


def allowed(client: kubernetes.client.ApiClient, access: m.Access) -> bool:
    review = kubernetes.client.V1SelfSubjectAccessReview(
        spec=kubernetes.client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=kubernetes.client.V1ResourceAttributes(
                verb=access.verb, group=access.group, resource=access.resource,
                subresource=access.subresource or None, namespace=access.namespace or None,
            )
        )
    )
    reply = kubernetes.client.AuthorizationV1Api(client).create_self_subject_access_review(review)
    return bool(reply.status.allowed)


@pytest.mark.parametrize(("identity", "account"), [("controller_client", m.CONTROLLER_SA), ("node_client", m.NODE_SA)])
def test_token_authenticates_as_the_service_account(identity: str, account: str, request: pytest.FixtureRequest) -> None:
    client = request.getfixturevalue(identity)
    review = kubernetes.client.AuthenticationV1Api(client).create_self_subject_review({})
    assert review.status.user_info.username == f"system:serviceaccount:{m.NAMESPACE}:{account}"


def test_controller_can_do_what_the_provisioner_and_attacher_need(controller_client: kubernetes.client.ApiClient) -> None:
    missing = [f"{a} ({a.why})" for a in m.CONTROLLER_MUST if not allowed(controller_client, a)]
    assert not missing, missing


def test_controller_cannot_do_anything_on_the_deny_list(controller_client: kubernetes.client.ApiClient) -> None:
    excess = [f"{a} ({a.why})" for a in m.CONTROLLER_MUST_NOT if allowed(controller_client, a)]
    assert not excess, excess


def test_node_can_read_nodes_and_nothing_else_listed(node_client: kubernetes.client.ApiClient) -> None:
    missing = [str(a) for a in m.NODE_MUST if not allowed(node_client, a)]
    excess = [str(a) for a in m.NODE_MUST_NOT if allowed(node_client, a)]
    assert not missing and not excess, (missing, excess)


def test_controller_real_requests(control_plane: ControlPlane, controller_client: kubernetes.client.ApiClient) -> None:
    """Beyond the authorizer's answers: the calls the loops make succeed, others get 403."""
    core = kubernetes.client.CoreV1Api(controller_client)
    coordination = kubernetes.client.CoordinationV1Api(controller_client)
    storage = kubernetes.client.StorageV1Api(controller_client)
    suffix = uuid.uuid4().hex[:8]
    with control_plane.api_client() as admin:
        kubernetes.client.CoreV1Api(admin).create_namespaced_secret(
            m.NAMESPACE, {"metadata": {"name": f"csi-rbd-secret-{suffix}"}, "stringData": {"userID": "u"}}
        )
    core.list_persistent_volume_claim_for_all_namespaces(limit=1)
    core.list_persistent_volume(limit=1)
    storage.list_volume_attachment(limit=1)
    storage.list_storage_class(limit=1)
    assert core.read_namespaced_secret(f"csi-rbd-secret-{suffix}", m.NAMESPACE).data["userID"]
    event = core.create_namespaced_event("default", {
        "metadata": {"name": f"cephcsi-test.{suffix}"},
        "involvedObject": {"kind": "PersistentVolumeClaim", "namespace": "default", "name": "x"},
        "reason": "Provisioning", "message": "rbac test", "type": "Normal", "count": 1,
    })
    core.patch_namespaced_event(event.metadata.name, "default", {"count": 2})
    with control_plane.api_client() as admin:
        kubernetes.client.CoreV1Api(admin).delete_namespaced_event(event.metadata.name, "default")
    lease = coordination.create_namespaced_lease(m.NAMESPACE, {
        "metadata": {"name": f"rbd-csi-ceph-com-{suffix}"},
        "spec": {"holderIdentity": "test", "leaseDurationSeconds": 15},
    })
    lease.spec.holder_identity = "test-2"
    coordination.replace_namespaced_lease(lease.metadata.name, m.NAMESPACE, lease)

    forbidden: list[Callable[[], object]] = [
        lambda: core.create_namespaced_secret(m.NAMESPACE, {"metadata": {"name": f"x-{suffix}"}}),
        lambda: core.list_namespaced_secret(m.NAMESPACE),
        lambda: core.read_namespaced_secret("anything", m.OTHER_NAMESPACE),
        lambda: core.delete_namespaced_persistent_volume_claim("x", "default"),
        lambda: coordination.create_namespaced_lease(m.OTHER_NAMESPACE, {"metadata": {"name": f"x-{suffix}"}, "spec": {}}),
        lambda: kubernetes.client.AppsV1Api(controller_client).list_namespaced_deployment(m.NAMESPACE),
    ]
    for call in forbidden:
        with pytest.raises(kubernetes.client.ApiException) as caught:
            call()
        assert caught.value.status == 403, caught.value


def test_node_real_requests(control_plane: ControlPlane, node_client: kubernetes.client.ApiClient) -> None:
    name = f"cephcsi-rbac-node-{uuid.uuid4().hex[:8]}"
    with control_plane.api_client() as admin:
        admin_core = kubernetes.client.CoreV1Api(admin)
        admin_core.create_node({"metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": "z1"}}})
        try:
            core = kubernetes.client.CoreV1Api(node_client)
            assert core.read_node(name).metadata.labels["topology.kubernetes.io/zone"] == "z1"
            calls: tuple[Callable[[], object], ...] = (
                lambda: core.list_node(), lambda: core.patch_node(name, {"metadata": {"labels": {"a": "b"}}}))
            for call in calls:
                with pytest.raises(kubernetes.client.ApiException) as caught:
                    call()
                assert caught.value.status == 403
        finally:
            admin_core.delete_node(name)
