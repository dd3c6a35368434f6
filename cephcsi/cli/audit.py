"""`cephcsi audit`: flags → AuditOptions → report on stdout, logs on stderr.

Exit status: 0 nothing found (or, with --repair, everything found repaired), 1 findings remain,
2 usage error or the cluster/pool/API server could not be read. The cephx key is read from a
file (--keyfile) or the environment (CEPHCSI_AUDIT_KEY), never from the command line, where
any user could read it in /proc; it is never printed.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from cephcsi.audit.report import to_json, to_table
from cephcsi.audit.run import DRIVER_NAME, AuditOptions, audit
from cephcsi.ceph.credentials import USER_ID_KEY, USER_KEY_KEY, Credentials
from cephcsi.ceph.leases import LeaseKeeper
from cephcsi.cli.args import _duration, _Parser, _positive
from cephcsi.errors import CephCSIError, InvalidArgument
from cephcsi.kube.errors import KubeError
from cephcsi.observability import logging as cephcsi_logging
from cephcsi.settings import CephSettings
from cephcsi.volumes.parameters import DEFAULT_PREFIX
from cephcsi.volumes.snapshots import DEFAULT_PREFIX as DEFAULT_SNAPSHOT_PREFIX

KEY_ENV = "CEPHCSI_AUDIT_KEY"
USAGE_ERROR = 2
DRAIN_SECONDS = 10.0
"""Longest wait at exit for journal lease releases still running behind a repair."""


class _AuditParser(_Parser):
    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"cephcsi audit: error: {message} (see cephcsi audit --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _AuditParser(prog="cephcsi audit", description=(
        "List inconsistencies between the driver's journal, an RBD pool, its trash and (with --kubeconfig) "
        "the PersistentVolumes and VolumeSnapshotContents; --repair fixes what is provably the driver's and safe "
        "to fix."),
        epilog=f"The cephx key comes from --keyfile or the {KEY_ENV} environment variable. "
               "Exit status: 0 clean, 1 inconsistencies found (or left after --repair), 2 usage or connection error.")
    t = p.add_argument_group("what to audit")
    t.add_argument("--config-file", default="/etc/ceph-csi-config/config.json", help="cluster list, ceph-csi format")
    t.add_argument("--cluster-id", required=True, help="clusterID of the config.json entry")
    t.add_argument("--pool", required=True, help="RBD pool of the volumes")
    t.add_argument("--rados-namespace", default=None, help="default: the cluster's rbd.radosNamespace")
    t.add_argument("--instanceid", "--instance-id", dest="instanceid", default="default",
                   help="journal instance id the driver runs with (its --instanceid; default %(default)s)")
    t.add_argument("--volume-name-prefix", default=DEFAULT_PREFIX,
                   help="StorageClass volumeNamePrefix (default %(default)s)")
    t.add_argument("--snapshot-name-prefix", default=DEFAULT_SNAPSHOT_PREFIX,
                   help="VolumeSnapshotClass snapshotNamePrefix (default %(default)s)")
    t.add_argument("--kubeconfig", default="",
                   help="also compare with this cluster's PersistentVolumes and VolumeSnapshotContents")
    t.add_argument("--drivername", default=DRIVER_NAME,
                   help="CSI driver name in PVs and VolumeSnapshotContents (default %(default)s)")
    c = p.add_argument_group("credentials")
    c.add_argument("--user", required=True, help="cephx user, with or without 'client.'")
    c.add_argument("--keyfile", default="", help=f"file holding the key or a keyring (default: ${KEY_ENV})")
    o = p.add_argument_group("output and repair")
    o.add_argument("--json", action="store_true", help="print JSON for scripts instead of a table")
    o.add_argument("--list-images", action="store_true",
                   help="also list every image with its journal name, PVs and owner (claim) metadata")
    o.add_argument("--repair", action="store_true", help="fix what is provably ours and safe to fix")
    o.add_argument("--repair-orphan-images", action="store_true",
                   help="with --repair and --kubeconfig: move unused orphan images to the trash (recoverable)")
    o.add_argument("--orphan-trash-days", type=_positive(float), default=7.0,
                   help="orphan images stay restorable in the trash this long (default %(default)g)")
    o.add_argument("--inline-purge-timeout", type=_duration, default=20.0,
                   help="longest wait for a purge run here because the mgr refused it")
    o.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info")
    x = p.add_argument_group("ceph")
    x.add_argument("--rados-osd-op-timeout", type=_duration, default=30.0)
    x.add_argument("--rados-mon-op-timeout", type=_duration, default=30.0)
    x.add_argument("--client-mount-timeout", type=_duration, default=10.0)
    return p


def read_key(keyfile: str) -> str:
    """The key from a bare-key file, a keyring file (`key = ...`) or the environment."""
    if not keyfile:
        key = os.environ.get(KEY_ENV, "").strip()
        if not key:
            raise InvalidArgument(f"no cephx key: pass --keyfile or set {KEY_ENV}")
        return key
    try:
        with open(keyfile, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise InvalidArgument(f"cannot read --keyfile {keyfile}: {error.strerror}") from None
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == "key":
            return value.strip()
    return text.strip()


def options_from(a: argparse.Namespace) -> AuditOptions:
    credentials = Credentials.from_secrets({USER_ID_KEY: a.user, USER_KEY_KEY: read_key(a.keyfile)})
    return AuditOptions(
        config_file=a.config_file, cluster_id=a.cluster_id, pool=a.pool, credentials=credentials,
        rados_namespace=a.rados_namespace, instance_id=a.instanceid, prefix=a.volume_name_prefix,
        snapshot_prefix=a.snapshot_name_prefix,
        kubeconfig=a.kubeconfig, driver_name=a.drivername, list_images=a.list_images, repair=a.repair,
        repair_orphan_images=a.repair_orphan_images, orphan_deferment_seconds=int(a.orphan_trash_days * 86400),
        inline_purge_seconds=a.inline_purge_timeout,
        ceph=CephSettings(osd_op_timeout=a.rados_osd_op_timeout, mon_op_timeout=a.rados_mon_op_timeout,
                          mount_timeout=a.client_mount_timeout),
    )


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.repair_orphan_images and not (a.repair and a.kubeconfig):
        # Without the PVs, an image no journal names may still be a statically provisioned volume.
        parser.error("--repair-orphan-images needs --repair and --kubeconfig (no PV may name the image)")
    if not a.volume_name_prefix:
        parser.error("--volume-name-prefix must not be empty")
    if not a.snapshot_name_prefix or a.snapshot_name_prefix == a.volume_name_prefix:
        # One prefix for both would make every image both journals' to judge.
        parser.error("--snapshot-name-prefix must be non-empty and differ from --volume-name-prefix")
    cephcsi_logging.configure(a.log_level)
    keeper = LeaseKeeper()  # the repairs' journal leases
    try:
        result = audit(options_from(a), keeper)
    except (CephCSIError, KubeError) as error:
        sys.stderr.write(f"cephcsi audit: error: {error}\n")
        return USAGE_ERROR
    finally:
        keeper.drain(DRAIN_SECONDS)
    sys.stdout.write(to_json(result) + "\n" if a.json else to_table(result))
    return 0 if result.clean else 1
