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
#
# Newer releases (read by `start`; the other commands find them in DIR/release.env):
# CEPH_RELEASE  pacific (default: the host's own packages), reef (Debian trixie, 18.2.7) or
#               tentacle (sid, 20.2.4). A newer release runs from the root tests/ceph/releases.sh
#               builds (cached): every daemon and CLI call goes through `chroot ROOT`, with /proc,
#               /sys, /dev and DIR bind-mounted into it (DIR at the same path; `stop` unmounts).
#               Its default address is 127.0.0.8 (reef) or 127.0.0.9 (tentacle), bound with
#               `public addr` (`public network` finds no interface for those).
# CEPH_ROOT     a root to use instead of the cached one; `/` when this script already runs inside
#               the release's root (tests/ceph/in_root.sh): no chroot, no bind mounts.
# CEPH_AUTH     stock (default) or legacy. Tentacle >= 20.2.4 allows only the cephx cipher
#               aes256k and makes only aes256k keys (`Ag...`), which Pacific and Reef clients
#               cannot parse. legacy also allows `aes` (as an upgraded cluster does) and makes the
#               admin and csi keys `aes` (`AQ...`); the other daemons keep aes256k keys.
# cluster.env says CEPH_RELEASE, CEPH_VERSION, CEPH_AUTH and CEPH_KEY_TYPE (aes or aes256k:
# the type of the admin and csi keys) and CEPH_ROOT (empty for pacific).
set -euo pipefail

cmd="${1:?usage: cluster.sh start|stop|stop-mon|start-mon DIR [POOL]}"
dir="${2:?cluster folder}"
pool="${3:-rbd}"

if [[ $cmd != start && -f $dir/release.env ]]; then
  # shellcheck disable=SC1091
  . "$dir/release.env"
fi
release="${CEPH_RELEASE:-pacific}"
root="${CEPH_ROOT:-}"
auth="${CEPH_AUTH:-stock}"
case "$release" in
  pacific) default_addr=127.0.0.1 ;;
  reef) default_addr=127.0.0.8 ;;
  tentacle) default_addr=127.0.0.9 ;;
  *) echo "cluster.sh: unknown CEPH_RELEASE '$release' (pacific, reef, tentacle)" >&2; exit 2 ;;
esac
case "$auth" in
  stock) ;;
  legacy) [[ $release == tentacle ]] || { echo "cluster.sh: CEPH_AUTH=legacy is for tentacle (older releases make aes keys anyway)" >&2; exit 2; } ;;
  *) echo "cluster.sh: unknown CEPH_AUTH '$auth' (stock, legacy)" >&2; exit 2 ;;
esac
addr="${CEPH_ADDR:-$default_addr}"
if [[ $release != pacific && -z $root ]]; then
  root=$("$(dirname "$0")/releases.sh" build "$release")
fi

# A Ceph program: the host's for pacific, the release root's otherwise.
# From / as chroot starts them: Tentacle's default `osd class dir` is relative
# (lib/x86_64-linux-gnu/rados-classes), so an OSD started elsewhere loads no cls and answers
# every class call EOPNOTSUPP.
run() {
  if [[ -z $root ]]; then "$@"
  elif [[ $root == / ]]; then (cd / && "$@")
  else chroot "$root" "$@"
  fi
}

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

key_type_of() {
  case "$1" in
    AQ*) echo aes ;;
    Ag*) echo aes256k ;;
    *) echo unknown ;;
  esac
}

# Bind mounts a release root needs, one layer per cluster: the same mount point may be stacked
# by several clusters sharing a root, and each `stop` takes off one layer (they are identical).
# DIR is mounted at its own path inside the root, so every path in ceph.conf means the same file
# to the host and to the daemons. Recorded in DIR/run/root-mounts so stop removes exactly these.
mount_root() {
  [[ $root != / ]] || return 0
  exec 8>"$(dirname "$root")/.mounts.lock"
  flock 8
  local m
  : >"$dir/run/root-mounts"
  for m in /proc /sys /dev; do
    mount --bind "$m" "$root$m"
    echo "$root$m" >>"$dir/run/root-mounts"
  done
  mkdir -p "$root$dir"
  mount --bind "$dir" "$root$dir"
  echo "$root$dir" >>"$dir/run/root-mounts"
  flock -u 8
}

umount_root() {
  [[ $root != / && -f $dir/run/root-mounts ]] || return 0
  exec 8>"$(dirname "$root")/.mounts.lock"
  flock 8
  local m
  # Newest first; a layer another cluster's daemon still has open is detached lazily (the
  # layers below it are the same file system).
  tac "$dir/run/root-mounts" | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
  rm -f "$dir/run/root-mounts"
  rmdir "$root$(cd "$dir" && pwd)" 2>/dev/null || true
  flock -u 8
}

start() {
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if [[ -f $dir/cluster.env ]]; then echo "$dir/cluster.env"; return 0; fi
  mkdir -p "$dir"/{mon/ceph-a,mgr/ceph-x,osd/ceph-0,run,log}
  if [[ -n $root ]]; then
    printf 'CEPH_RELEASE=%s\nCEPH_ROOT=%s\nCEPH_AUTH=%s\n' "$release" "$root" "$auth" >"$dir/release.env"
    mount_root
  fi
  local fsid v2 v1 conf
  fsid=$(uuidgen)
  v2=$(free_port); v1=$(free_port)
  conf=$dir/ceph.conf
  # `public network` finds no interface holding 127.0.0.8/32 (lo has 127.0.0.1/8): a release root
  # binds to its address directly.
  local net_conf="public network = $addr/32"
  [[ -z $root ]] || net_conf="public addr = $addr
cluster addr = $addr"
  local mon_conf="" key_type=()
  if [[ $auth == legacy ]]; then
    # As an upgraded Tentacle cluster: the insecure aes cipher still allowed and creatable (set
    # here rather than with `ceph config set`, whose default lags the monmap until a mon tick).
    mon_conf="mon auth allow insecure key = true"
    key_type=(--key-type aes)
  fi
  cat >"$conf" <<CONF
[global]
fsid = $fsid
mon host = [v2:$addr:$v2,v1:$addr:$v1]
$net_conf
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
$mon_conf
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
  local ks="run ceph-authtool --create-keyring"
  $ks "$dir/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  $ks "$dir/client.admin.keyring" --gen-key ${key_type[@]+"${key_type[@]}"} -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
  $ks "$dir/mgr.keyring" --gen-key -n mgr.x --cap mon 'profile mgr' --cap osd 'allow *' --cap mds 'allow *' >/dev/null
  run ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/client.admin.keyring" >/dev/null
  run ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/mgr.keyring" >/dev/null
  local ciphers=()
  [[ $auth != legacy ]] || ciphers=(--auth-allowed-ciphers aes256k,aes)
  run monmaptool --create --fsid "$fsid" --addv a "[v2:$addr:$v2,v1:$addr:$v1]" ${ciphers[@]+"${ciphers[@]}"} \
    "$dir/monmap" >/dev/null
  run ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/mon.keyring" 2>>"$dir/log/setup.log"
  cp "$dir/mgr.keyring" "$dir/mgr/ceph-x/keyring"
  run ceph-mon -c "$conf" -i a
  run ceph-mgr -c "$conf" -i x
  local C="ceph -c $conf --connect-timeout 10"
  [[ -z $root || $root == / ]] || C="chroot $root $C"
  wait_for 30 "monitor quorum" $C mon stat

  local osd_uuid osd_key
  osd_uuid=$(uuidgen)
  osd_key=$(run ceph-authtool --gen-print-key)
  echo "{\"cephx_secret\": \"$osd_key\"}" | $C osd new "$osd_uuid" -i - >/dev/null
  run ceph-authtool --create-keyring "$dir/osd/ceph-0/keyring" --name osd.0 --add-key "$osd_key" >/dev/null
  run ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" 2>>"$dir/log/setup.log" >/dev/null
  run ceph-osd -c "$conf" -i 0 2>>"$dir/log/setup.log"
  wait_for 60 "osd.0 up" bash -c "$C osd dump --format json | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)[\"osds\"][0][\"up\"] else 1)'"

  $C osd pool create "$pool" 8 8 replicated >/dev/null 2>&1
  run rbd -c "$conf" pool init "$pool"
  # A second RBD pool, as ceph-csi's topologyConstrainedPools use one: its StorageClass pool holds
  # the journal, the images go here (tests of volumes journaled apart from their image).
  local pool2="${pool}-topo"
  $C osd pool create "$pool2" 8 8 replicated >/dev/null 2>&1
  $C osd pool application enable "$pool2" rbd >/dev/null 2>&1
  # The identity the driver uses in tests: the least privilege ceph-csi documents (for both pools).
  local csi_key
  csi_key=$($C auth get-or-create-key client.csi mon 'profile rbd' \
    osd "profile rbd pool=$pool, profile rbd pool=$pool2" mgr "profile rbd pool=$pool, profile rbd pool=$pool2" \
    ${key_type[@]+"${key_type[@]}"})
  wait_for 60 "all PGs active+clean" bash -c "$C pg stat --format json | python3 -c '
import json,sys
d=json.load(sys.stdin); s=d.get(\"pg_summary\", d)
states=s.get(\"num_pg_by_state\", [])
tot=s.get(\"num_pgs\", 0)
clean=sum(x[\"num\"] for x in states if x[\"name\"]==\"active+clean\")
sys.exit(0 if tot>0 and clean==tot else 1)'"
  local admin_key
  admin_key=$(run ceph-authtool -p -n client.admin "$dir/client.admin.keyring")
  # A key's first two bytes are its type, little-endian: 1 (aes) encodes as AQ, 2 (aes256k) as Ag.
  local made_type
  made_type=$(key_type_of "$admin_key")
  if [[ $(key_type_of "$csi_key") != "$made_type" ]]; then
    echo "ceph test cluster: the admin key is $made_type but the csi key $(key_type_of "$csi_key")" >&2
    return 1
  fi
  if [[ $auth == legacy && $made_type != aes ]]; then
    echo "ceph test cluster: CEPH_AUTH=legacy made $made_type keys, not aes" >&2
    return 1
  fi
  local version
  version=$(run ceph --version | awk '{print $3}')
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
CEPH_RELEASE=$release
CEPH_VERSION=$version
CEPH_AUTH=$auth
CEPH_KEY_TYPE=$made_type
CEPH_ROOT=$root
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
  [[ -z $root ]] || umount_root
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  stop-mon) stop_pidfile "$dir/run/mon.a.pid" ;;
  start-mon) run ceph-mon -c "$dir/ceph.conf" -i a ;;
  freeze|thaw)
    sig=STOP; [[ $cmd == thaw ]] && sig=CONT
    for name in mon.a mgr.x osd.0; do
      [[ -f $dir/run/$name.pid ]] && kill -s "$sig" "$(cat "$dir/run/$name.pid")" 2>/dev/null || true
    done ;;
  *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
