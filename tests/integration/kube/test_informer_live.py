"""Informers against the real apiserver: event order, apiserver restarts, 410 after etcd
compaction (relist with deletes of unknown final state), client-side inactivity timeouts, and
the controller's deploy/ RBAC."""
from __future__ import annotations

import functools
import threading
from typing import Any, Iterator

import kubernetes.client as k8s
import pytest
from prometheus_client import REGISTRY

from cephcsi.kube.backoff import BackoffSettings
from cephcsi.kube.client import new_api_client
from cephcsi.kube.factory import InformerFactory
from cephcsi.kube.informer import EventHandler, Informer, InformerSettings
from tests.controlplane.cluster import ControlPlane
from tests.controlplane.proxy import TcpProxy
from tests.integration.kube.conftest import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.kube, pytest.mark.timeout(120)]

FAST = InformerSettings(backoff=BackoffSettings(initial=0.1, maximum=0.5), connect_timeout=2.0)


class Events:
    """Thread-safe record of handler calls as (kind, name, value...)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[tuple[Any, ...]] = []

    def handler(self, field: str = "data") -> EventHandler:
        def val(o: dict[str, Any]) -> Any:
            return (o.get(field) or {}).get("v") if field == "data" else o["metadata"].get("labels", {}).get("v")
        return EventHandler(
            on_add=lambda o: self._add("add", o["metadata"]["name"], val(o)),
            on_update=lambda a, b: self._add("update", b["metadata"]["name"], val(a), val(b)),
            on_delete=lambda o, unknown: self._add("delete", o["metadata"]["name"], val(o), unknown),
        )

    def _add(self, *item: Any) -> None:
        with self._lock:
            self.items.append(item)

    def snapshot(self) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self.items)

    def for_name(self, name: str) -> list[tuple[Any, ...]]:
        return [e for e in self.snapshot() if e[1] == name]


@pytest.fixture
def admin(control_plane: ControlPlane) -> Iterator[k8s.CoreV1Api]:
    with control_plane.api_client() as client:
        yield k8s.CoreV1Api(client)


def config_map_informer(configuration: k8s.Configuration, namespace: str,
                        settings: InformerSettings = FAST) -> Informer:
    api = k8s.CoreV1Api(new_api_client(configuration=configuration))
    return Informer(functools.partial(api.list_namespaced_config_map, namespace), name=f"cm-{namespace}",
                    settings=settings)


def cache_matches_server(informer: Informer, server_items: list[Any]) -> bool:
    cached = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in informer.list()}
    live = {o.metadata.name: o.metadata.resource_version for o in server_items}
    return cached == live


def metric(metric_name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(metric_name, labels) or 0.0


def test_sees_creates_updates_deletes_in_order(control_plane: ControlPlane, kube_namespace: str,
                                               admin: k8s.CoreV1Api) -> None:
    admin.create_namespaced_config_map(kube_namespace, {"metadata": {"name": "pre"}, "data": {"v": "0"}})
    informer = config_map_informer(control_plane.configuration(), kube_namespace)
    events = Events()
    informer.add_handler(events.handler())
    informer.start()
    try:
        assert informer.wait_for_sync(10)
        for name in ("a", "b"):
            admin.create_namespaced_config_map(kube_namespace, {"metadata": {"name": name}, "data": {"v": "0"}})
        for value in ("1", "2", "3"):
            for name in ("a", "b"):
                admin.patch_namespaced_config_map(name, kube_namespace, {"data": {"v": value}})
        admin.delete_namespaced_config_map("a", kube_namespace)
        admin.delete_namespaced_config_map("pre", kube_namespace)
        assert wait_until(lambda: len(events.snapshot()) == 11, 10), events.snapshot()
        assert events.for_name("a") == [
            ("add", "a", "0"), ("update", "a", "0", "1"), ("update", "a", "1", "2"),
            ("update", "a", "2", "3"), ("delete", "a", "3", False)]
        assert events.for_name("b")[-1] == ("update", "b", "2", "3")
        assert events.for_name("pre") == [("add", "pre", "0"), ("delete", "pre", "0", False)]
        assert [o["metadata"]["name"] for o in informer.list()] == ["b"]
        assert informer.get_by_name(kube_namespace, "b")["data"] == {"v": "3"}  # type: ignore[index]
    finally:
        informer.stop()


def test_converges_after_apiserver_restart(control_plane_guard: ControlPlane, kube_namespace: str) -> None:
    plane = control_plane_guard
    with plane.api_client() as client:
        admin = k8s.CoreV1Api(client)
        admin.create_namespaced_config_map(kube_namespace, {"metadata": {"name": "a"}, "data": {"v": "0"}})
        admin.create_namespaced_config_map(kube_namespace, {"metadata": {"name": "b"}, "data": {"v": "0"}})
    informer = config_map_informer(plane.configuration(), kube_namespace)
    events = Events()
    informer.add_handler(events.handler())
    informer.start()
    try:
        assert informer.wait_for_sync(10)
        watches_before = metric("cephcsi_informer_watches_total", name=informer.name)
        plane.restart_apiserver(graceful=False)
        with plane.api_client() as client:
            admin = k8s.CoreV1Api(client)
            admin.patch_namespaced_config_map("a", kube_namespace, {"data": {"v": "1"}})
            admin.delete_namespaced_config_map("b", kube_namespace)
            admin.create_namespaced_config_map(kube_namespace, {"metadata": {"name": "c"}, "data": {"v": "0"}})
            assert wait_until(lambda: cache_matches_server(
                informer, admin.list_namespaced_config_map(kube_namespace).items), 30)
        assert metric("cephcsi_informer_watches_total", name=informer.name) > watches_before
        assert ("update", "a", "0", "1") in events.snapshot()
        assert ("delete", "b", "0", False) in events.snapshot()
        assert ("add", "c", "0") in events.snapshot()
    finally:
        informer.stop()


def test_relists_after_compaction_makes_its_resource_version_expire(
        control_plane: ControlPlane, kube_namespace: str, apiserver_proxy: TcpProxy) -> None:
    # PodTemplates bypass the apiserver watch cache (see ControlPlaneSettings), so a watch from
    # a compacted revision really gets 410 from etcd.
    with control_plane.api_client() as client:
        admin = k8s.CoreV1Api(client)

        def template(name: str, v: str) -> dict[str, Any]:
            return {"metadata": {"name": name, "labels": {"v": v}},
                    "template": {"spec": {"containers": [{"name": "c", "image": "none"}]}}}

        for name in ("p1", "p2", "p3"):
            admin.create_namespaced_pod_template(kube_namespace, template(name, "0"))
        cfg = control_plane.configuration(host=apiserver_proxy.url)
        api = k8s.CoreV1Api(new_api_client(configuration=cfg))
        informer = Informer(functools.partial(api.list_namespaced_pod_template, kube_namespace),
                            name=f"pt-{kube_namespace}", settings=FAST)
        events = Events()
        informer.add_handler(events.handler(field="labels"))
        informer.start()
        try:
            assert informer.wait_for_sync(10)
            lists_before = metric("cephcsi_informer_lists_total", name=informer.name)
            apiserver_proxy.cut()  # the informer's watch breaks and cannot reconnect
            admin.delete_namespaced_pod_template("p1", kube_namespace)
            admin.patch_namespaced_pod_template("p2", kube_namespace, {"metadata": {"labels": {"v": "1"}}})
            admin.create_namespaced_pod_template(kube_namespace, template("p4", "0"))
            control_plane.compact_etcd()
            apiserver_proxy.restore()
            assert wait_until(lambda: cache_matches_server(
                informer, admin.list_namespaced_pod_template(kube_namespace).items), 30)
            assert metric("cephcsi_informer_lists_total", name=informer.name) == lists_before + 1
            assert metric("cephcsi_informer_watch_errors_total", name=informer.name, reason="expired") >= 1
            after = events.snapshot()[3:]
            assert sorted(after, key=str) == sorted(
                [("delete", "p1", "0", True), ("update", "p2", "0", "1"), ("add", "p4", "0")], key=str)
        finally:
            informer.stop()


def test_reconnects_when_the_watch_goes_silent(control_plane: ControlPlane, kube_namespace: str,
                                               apiserver_proxy: TcpProxy, admin: k8s.CoreV1Api) -> None:
    settings = InformerSettings(inactivity_timeout=1.5, connect_timeout=1.0,
                                backoff=BackoffSettings(initial=0.1, maximum=0.5))
    informer = config_map_informer(control_plane.configuration(host=apiserver_proxy.url), kube_namespace, settings)
    informer.start()
    try:
        assert informer.wait_for_sync(10)
        # An object seen through the watch proves the watch stream is established.
        admin.create_namespaced_config_map(kube_namespace, {"metadata": {"name": "before"}})
        assert wait_until(lambda: informer.get_by_name(kube_namespace, "before") is not None, 10)
        apiserver_proxy.blackhole()  # packets vanish: no error, just silence
        admin.create_namespaced_config_map(kube_namespace, {"metadata": {"name": "during"}})
        assert wait_until(lambda: metric("cephcsi_informer_watch_errors_total", name=informer.name,
                                         reason="inactive") >= 1, 10)
        assert informer.get_by_name(kube_namespace, "during") is None
        apiserver_proxy.restore()
        assert wait_until(lambda: informer.get_by_name(kube_namespace, "during") is not None, 15)
    finally:
        informer.stop()


def test_label_and_field_selectors(control_plane: ControlPlane, kube_namespace: str, admin: k8s.CoreV1Api) -> None:
    admin.create_namespaced_config_map(kube_namespace, {"metadata": {"name": "x", "labels": {"app": "ceph"}}})
    admin.create_namespaced_config_map(kube_namespace, {"metadata": {"name": "y", "labels": {"app": "other"}}})
    admin.create_namespaced_config_map(kube_namespace, {"metadata": {"name": "z", "labels": {"app": "ceph"}}})
    api = k8s.CoreV1Api(new_api_client(configuration=control_plane.configuration()))
    informer = Informer(functools.partial(api.list_namespaced_config_map, kube_namespace), name="sel",
                        settings=FAST, label_selector="app=ceph", field_selector="metadata.name!=z")
    informer.start()
    try:
        assert informer.wait_for_sync(10)
        admin.create_namespaced_config_map(kube_namespace, {"metadata": {"name": "w", "labels": {"app": "ceph"}}})
        admin.create_namespaced_config_map(kube_namespace, {"metadata": {"name": "v", "labels": {"app": "no"}}})
        assert wait_until(lambda: informer.get_by_name(kube_namespace, "w") is not None, 10)
        assert sorted(o["metadata"]["name"] for o in informer.list()) == ["w", "x"]
    finally:
        informer.stop()


def test_controller_rbac_can_run_the_sidecars_informers(controller_configuration: k8s.Configuration) -> None:
    factory = InformerFactory(new_api_client(configuration=controller_configuration), settings=FAST)
    informers = [factory.persistent_volumes(), factory.persistent_volume_claims(), factory.storage_classes(),
                 factory.volume_attachments(), factory.nodes(), factory.csi_nodes()]
    assert factory.persistent_volumes() is informers[0]  # shared, not duplicated
    factory.start()
    try:
        assert factory.wait_for_sync(20)
        assert all(i.has_synced() for i in informers)
    finally:
        factory.stop()
