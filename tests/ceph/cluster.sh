#!/usr/bin/env bash
# A real one-node Ceph cluster (1 mon, 1 mgr, 1 memstore OSD) on 127.0.0.1, for tests and
# benchmarks; no systemd needed. Ports are picked free at start, so several clusters can run
# on one machine.
#
#   tests/ceph/cluster.sh start DIR [POOL]   # prints DIR/cluster.env (shell-sourceable)
#   tests/ceph/cluster.sh stop DIR
#   tests/ceph/cluster.sh stop-mon DIR | start-mon DIR   # outage tests
#   tests/ceph/cluster.sh freeze DIR | thaw DIR           # SIGSTOP/SIGCONT every daemon: an
#       unresponsive cluster that comes back with its data (memstore loses data on restart)
#
# DIR must be short (unix socket paths are limited to 107 bytes).
# CEPH_ADDR (default 127.0.0.1): the IPv4 address the mon, mgr and OSD bind to. Pods on a CNI
# bridge cannot reach loopback, so the e2e node runs the cluster on its node IP.
set -euo pipefail
addr="${CEPH_ADDR:-127.0.0.1}"

cmd="${1:?usage: cluster.sh start|stop|stop-mon|start-mon DIR [POOL]}"
dir="${2:?cluster folder}"
pool="${3:-rbd}"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("'"$addr"'",0)); print(s.getsockname()[1]); s.close()'
}

stop_pidfile() {
  local pidfile=$1 pid
  [[ -f $pidfile ]] || return 0
  pid=$(cat "$pidfile" 2>/dev/null || true)
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then echo "ceph test cluster: timed out waiting for $what" >&2; return 1; fi
    sleep 0.2
  done
}

start() {
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if [[ -f $dir/cluster.env ]]; then echo "$dir/cluster.env"; return 0; fi
  mkdir -p "$dir"/{mon/ceph-a,mgr/ceph-x,osd/ceph-0,run,log}
  local fsid v2 v1 conf
  fsid=$(uuidgen)
  v2=$(free_port); v1=$(free_port)
  conf=$dir/ceph.conf
  cat >"$conf" <<CONF
[global]
fsid = $fsid
mon host = [v2:$addr:$v2,v1:$addr:$v1]
public network = $addr/32
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
ms bind ipv6 = false
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
osd pool default pg autoscale mode = off
run dir = $dir/run
admin socket = $dir/run/\$name.asok
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
paxos propose interval = 0.1
mgr stats period = 1
mon mgr digest period = 1
mgr tick period = 1
[mon]
mon data = $dir/mon/ceph-\$id
mon cluster log file = $dir/log/cluster.log
auth allow insecure global id reclaim = false
[mgr]
mgr data = $dir/mgr/ceph-\$id
[osd]
osd data = $dir/osd/ceph-\$id
osd objectstore = memstore
memstore device bytes = 8589934592
osd max object name len = 256
osd max object namespace len = 64
[client]
keyring = $dir/client.admin.keyring
admin socket = $dir/run/\$name.\$pid.asok
CONF
  local ks="ceph-authtool --create-keyring"
  $ks "$dir/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  $ks "$dir/client.admin.keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
  $ks "$dir/mgr.keyring" --gen-key -n mgr.x --cap mon 'profile mgr' --cap osd 'allow *' --cap mds 'allow *' >/dev/null
  ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/client.admin.keyring" >/dev/null
  ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/mgr.keyring" >/dev/null
  monmaptool --create --fsid "$fsid" --addv a "[v2:$addr:$v2,v1:$addr:$v1]" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/mon.keyring" 2>>"$dir/log/setup.log"
  cp "$dir/mgr.keyring" "$dir/mgr/ceph-x/keyring"
  ceph-mon -c "$conf" -i a
  ceph-mgr -c "$conf" -i x
  local C="ceph -c $conf --connect-timeout 10"
  wait_for 30 "monitor quorum" $C mon stat

  local osd_uuid osd_key
  osd_uuid=$(uuidgen)
  osd_key=$(ceph-authtool --gen-print-key)
  echo "{\"cephx_secret\": \"$osd_key\"}" | $C osd new "$osd_uuid" -i - >/dev/null
  ceph-authtool --create-keyring "$dir/osd/ceph-0/keyring" --name osd.0 --add-key "$osd_key" >/dev/null
  ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" 2>>"$dir/log/setup.log" >/dev/null
  ceph-osd -c "$conf" -i 0 2>>"$dir/log/setup.log"
  wait_for 60 "osd.0 up" bash -c "$C osd dump --format json | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)[\"osds\"][0][\"up\"] else 1)'"

  $C osd pool create "$pool" 8 8 replicated >/dev/null 2>&1
  rbd -c "$conf" pool init "$pool"
  # A second RBD pool, as ceph-csi's topologyConstrainedPools use one: its StorageClass pool holds
  # the journal, the images go here (tests of volumes journaled apart from their image).
  local pool2="${pool}-topo"
  $C osd pool create "$pool2" 8 8 replicated >/dev/null 2>&1
  $C osd pool application enable "$pool2" rbd >/dev/null 2>&1
  # The identity the driver uses in tests: the least privilege ceph-csi documents (for both pools).
  local csi_key
  csi_key=$($C auth get-or-create-key client.csi mon 'profile rbd' \
    osd "profile rbd pool=$pool, profile rbd pool=$pool2" mgr "profile rbd pool=$pool, profile rbd pool=$pool2")
  wait_for 60 "all PGs active+clean" bash -c "$C pg stat --format json | python3 -c '
import json,sys
d=json.load(sys.stdin); s=d.get(\"pg_summary\", d)
states=s.get(\"num_pg_by_state\", [])
tot=s.get(\"num_pgs\", 0)
clean=sum(x[\"num\"] for x in states if x[\"name\"]==\"active+clean\")
sys.exit(0 if tot>0 and clean==tot else 1)'"
  local admin_key
  admin_key=$(ceph-authtool -p -n client.admin "$dir/client.admin.keyring")
  cat >"$dir/cluster.env.tmp" <<ENV
CEPH_DIR=$dir
CEPH_CONF=$conf
CEPH_FSID=$fsid
CEPH_MON_HOST=$addr:$v1
CEPH_MON_V2=$addr:$v2
CEPH_POOL=$pool
CEPH_POOL2=$pool2
CEPH_ADMIN_KEY=$admin_key
CEPH_CSI_USER=csi
CEPH_CSI_KEY=$csi_key
ENV
  chmod 600 "$dir/cluster.env.tmp"
  mv "$dir/cluster.env.tmp" "$dir/cluster.env"
  echo "$dir/cluster.env"
}

stop() {
  [[ -d $dir ]] || return 0
  stop_pidfile "$dir/run/osd.0.pid"
  stop_pidfile "$dir/run/mgr.x.pid"
  stop_pidfile "$dir/run/mon.a.pid"
  rm -f "$dir/cluster.env"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  stop-mon) stop_pidfile "$dir/run/mon.a.pid" ;;
  start-mon) ceph-mon -c "$dir/ceph.conf" -i a ;;
  freeze|thaw)
    sig=STOP; [[ $cmd == thaw ]] && sig=CONT
    for name in mon.a mgr.x osd.0; do
      [[ -f $dir/run/$name.pid ]] && kill -s "$sig" "$(cat "$dir/run/$name.pid")" 2>/dev/null || true
    done ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
