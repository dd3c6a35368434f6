#!/usr/bin/env bash
# The one test command: unit tests, then the integration tests against the real Ceph cluster,
# the real Kubernetes control plane, csi-sanity, the real-kernel VM node and the e2e node, which
# the test suite starts and stops itself; then the Ceph-facing suites once per newer Ceph release.
#
# Without arguments:
#   1. the whole suite against the host's Ceph (Pacific 16.2.15, the host's client), but for the
#      real-kernel tier's own tests (tests/vm), which a "vm" session runs at the same time;
#   2. one session per release in CEPHCSI_TEST_RELEASES (default "reef tentacle tentacle-legacy";
#      "" runs none), each against a one-node cluster of that release (tests/ceph/releases.sh roots,
#      `--ceph-release`):
#      - reef:            tests/ceph, ceph_ops, controller — with the host's Pacific client;
#      - tentacle:        tests/ceph, ceph_ops, controller — stock aes256k keys, so with Tentacle's
#                         own client: pytest runs inside the sid root (tests/ceph/in_root.sh);
#      - tentacle-legacy: tests/ceph, ceph_ops, auth — legacy aes keys (an upgraded cluster), the
#                         host's Pacific client; auth covers the cipher checks on such a cluster.
#   Left out of the release sessions, to keep them within ~30 minutes of CI's 2 cores: the two
#   kill-window searches that time SIGKILLs inside the client's librbd for minutes
#   (test_librbd_crashes.py::…trash_move_killed_inside_librbd, …remove_killed_while_it_moved…, and
#   test_snapshot_crashes.py) where the client is the host's Pacific librbd, as in the main session,
#   so they would search the same shapes again; and the Go bench caller test in the sid root (its
#   Go build cache is the host's). The random-kill tests run in every session.
#   The release sessions run in two lanes at once (see below). The exit status is the first failing
#   session's. CEPHCSI_TEST_MAIN=0 skips step 1 (to rerun only the release sessions).
#
# Each session reports its 25 slowest test phases (--durations), so a CI log shows where the time
# goes. CEPHCSI_TEST_DRY_RUN=1 prints every session's command line (one argument a line, a blank
# line after each) instead of running it (tests/unit/test_test_command.py checks them).
#
# Tiers (CEPHCSI_TEST_TIER): `ci` (the default, what CI runs) leaves out the tests marked `long`
# in every session, so that set-up and tests stay well inside CI's 90 minutes on 2 cores; `long`
# runs only those, in one session against the host's Ceph (most are real-kernel VM scenarios
# under TCG: a second variant of a path the ci tier proves once, or a minutes-long kill or soak);
# `all` runs both in every session.
#
# Extra arguments make it one pytest session with them (e.g. `scripts/test.sh -m unit` for the
# fast unit tests only, or `scripts/test.sh --ceph-release=reef tests/integration/ceph_ops`).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$(go env GOPATH 2>/dev/null || echo "$HOME/go")/bin:$PATH"
if (($#)); then
  exec .venv/bin/python -m pytest "$@"
fi

DRY_RUN=${CEPHCSI_TEST_DRY_RUN-0}
TIER=${CEPHCSI_TEST_TIER-ci}
# MAIN_ONLY / VM_ONLY: the main session leaves the VM tier's own tests (marker vm, not e2e) to
# the vm lane; tests/e2e/test_vm_node.py (vm and e2e) needs the e2e node, so it stays in main.
case "$TIER" in
  ci) TIER_ARGS=(--durations=25 -m "not long")
      MAIN_ONLY=(--durations=25 -m "not long and (e2e or not vm)")
      VM_ONLY=(--durations=25 -m "vm and not e2e and not long") ;;
  long) TIER_ARGS=(--durations=25 -m long) ;;
  all) TIER_ARGS=(--durations=25)
       MAIN_ONLY=(--durations=25 -m "e2e or not vm")
       VM_ONLY=(--durations=25 -m "vm and not e2e") ;;
  *) echo "scripts/test.sh: CEPHCSI_TEST_TIER is ci, long or all, not $TIER" >&2; exit 2 ;;
esac
CEPH_SUITES=(tests/ceph tests/integration/ceph_ops)
CONTROLLER=tests/integration/controller
LONG_KILL_SEARCHES=(
  "$CONTROLLER/test_librbd_crashes.py::test_delete_finishes_a_trash_move_killed_inside_librbd"
  "$CONTROLLER/test_librbd_crashes.py::test_delete_finishes_a_remove_killed_while_it_moved_the_image_to_the_trash"
  "$CONTROLLER/test_snapshot_crashes.py"
)
# The group-snapshot random-kill search (up to a minute of waiting on killed drivers' watches)
# runs in the main session only; the release sessions keep the named-step kills (Tentacle's own
# client in the tentacle session), which cover the same shapes. CI's 90 minutes are the limit.
GROUP_RANDOM_KILLS="$CONTROLLER/test_group_snapshots.py::test_random_sigkills_during_group_creates_and_deletes"
deselect_args() {
  local node
  for node in "$@"; do printf -- '--deselect\n%s\n' "$node"; done
}

session() {  # session RELEASE: the pytest command line of that release's session
  local release=$1
  case "$release" in
    reef)
      printf '%s\n' .venv/bin/python -m pytest "${TIER_ARGS[@]}" --ceph-release=reef "${CEPH_SUITES[@]}" "$CONTROLLER"
      # The group-snapshot failpoint walk kills the host's Pacific client at named steps, as the
      # main session does; Reef's side of it is covered by that file's other tests.
      deselect_args "${LONG_KILL_SEARCHES[@]}" "$CONTROLLER/test_group_snapshots.py::test_kill_at_every_step_then_retry_completes" \
        "$GROUP_RANDOM_KILLS" ;;
    tentacle)
      printf '%s\n' tests/ceph/in_root.sh tentacle "${TIER_ARGS[@]}" --ceph-release=tentacle "${CEPH_SUITES[@]}" "$CONTROLLER"
      deselect_args "${LONG_KILL_SEARCHES[0]}" "${LONG_KILL_SEARCHES[2]}" "$CONTROLLER/test_bench_go_caller.py" \
        "$GROUP_RANDOM_KILLS" ;;
    vm)
      printf '%s\n' .venv/bin/python -m pytest "${VM_ONLY[@]}" tests/vm ;;
    tentacle-legacy)
      printf '%s\n' .venv/bin/python -m pytest "${TIER_ARGS[@]}" --ceph-release=tentacle-legacy "${CEPH_SUITES[@]}" \
        tests/integration/auth ;;
    *) echo "scripts/test.sh: unknown release $release in CEPHCSI_TEST_RELEASES" >&2; return 2 ;;
  esac
}

run_session() {  # run_session RELEASE LOG: that release's session, its output to LOG, its status in LOG.rc
  local release=$1 log=$2 rc=0
  local -a argv
  mapfile -t argv < <(session "$release")
  if ((${#argv[@]} == 0)); then
    echo 2 >"$log.rc"
    return
  fi
  "${argv[@]}" >"$log" 2>&1 || rc=$?
  # 5: nothing selected, e.g. every test of a narrowed set marked for other releases.
  if ((rc == 5)); then
    echo "=== Ceph $release: no test selected ===" >>"$log"
    rc=0
  fi
  echo "$rc" >"$log.rc"
}

status=0
releases=(${CEPHCSI_TEST_RELEASES-reef tentacle tentacle-legacy})
vm_lane=()
if [[ $TIER == long ]]; then
  # One session against the host's Ceph: no vm lane, no release session.
  main=(.venv/bin/python -m pytest "${TIER_ARGS[@]}")
  releases=()
else
  main=(.venv/bin/python -m pytest "${MAIN_ONLY[@]}")
  if [[ ${CEPHCSI_TEST_MAIN-1} != 0 ]]; then vm_lane=(vm); fi
fi
if [[ $DRY_RUN == 1 ]]; then
  [[ ${CEPHCSI_TEST_MAIN-1} != 0 ]] && printf '%s\n' "${main[@]}" ""
  for release in "${vm_lane[@]}" "${releases[@]}"; do
    session "$release"
    echo
  done
  exit 0
fi
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
pids=()
# The real-kernel tier (tests/vm, Pacific like the main session) runs beside the main session,
# from its start: its VM emulates one CPU under TCG, so it keeps about one core busy for ~20
# minutes while the main session's integration tests mostly wait on Ceph. Its cluster and VMs
# are its own (tests/vm: per-session node indexes; the bridge outlives every user of it).
for release in "${vm_lane[@]}"; do
  run_session "$release" "$logs/$release" &
  pids+=($!)
done
if [[ ${CEPHCSI_TEST_MAIN-1} != 0 ]]; then
  "${main[@]}" || status=$?
fi
# Then the release sessions, in lanes, one per release family (reef; tentacle and tentacle-legacy,
# which share the sid root and its loopback address, one after the other), the lanes at the same
# time: their clusters are apart and the Ceph tests mostly wait on the OSDs, so two lanes take
# about 1.3 times the longer one instead of the sum (CI has 90 minutes). Each session's output
# (the vm lane's first) is printed whole when every lane is done.
declare -A lanes=()
for release in "${releases[@]}"; do
  family=${release%%-*}
  lanes[$family]+="$release "
done
for family in "${!lanes[@]}"; do
  (for release in ${lanes[$family]}; do run_session "$release" "$logs/$release"; done) &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || true; done
for release in "${vm_lane[@]}" "${releases[@]}"; do
  if [[ $release == vm ]]; then echo "=== real-kernel tier (tests/vm, Ceph pacific) ==="; else echo "=== Ceph $release ==="; fi
  [[ -f $logs/$release ]] && cat "$logs/$release"
  rc=$(cat "$logs/$release.rc" 2>/dev/null || echo 2)
  if ((rc != 0 && status == 0)); then status=$rc; fi
done
exit "$status"
