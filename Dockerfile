# syntax=docker/dockerfile:1
#
# The one cephcsi image, for both roles:
#   controller (deploy/controller-deployment.yaml): runs as the image's non-root USER 10001;
#     the Deployment repeats runAsUser/runAsGroup 10001 and sets runAsNonRoot.
#   node (deploy/node-daemonset.yaml): needs root and privileged (rbd map, mount, mkfs);
#     the DaemonSet sets runAsUser: 0 and privileged: true, overriding USER below.
#
# Build:  docker build -t registry.example.com/storage/cephcsi:0.1.0 .
#    or:  podman build -t ... .   /   buildah bud -t ... .
#    or, without a registry or Docker daemon (base image made with debootstrap):
#         scripts/build-image.sh   (writes a docker-archive tar for `ctr images import`)
# Pin the base by digest for a fully reproducible base:
#   docker build --build-arg DEBIAN_IMAGE=debian:sid-20261030-slim@sha256:<digest> ...
#
# Every RUN line is plain POSIX sh, no SHELL instruction: podman and buildah build OCI-format
# images by default, and the OCI format has no SHELL, so /bin/sh (dash) runs RUN lines there
# whatever a SHELL line says. Writing for sh makes docker, podman and buildah build alike.
#
# Debian sid: its Ceph client is Tentacle 20.2.4, with rados/rbd bindings for its Python 3.14.
# A fresh Tentacle >= 20.2.4 cluster makes only aes256k cephx keys, which no older client
# (trixie's Reef 18.2.7, bookworm's Pacific 16.2.15) can parse; Tentacle's client reads those
# and the older aes keys, and talks to Pacific and Reef clusters too. Debian has no Squid and
# no Tentacle for a stable release, and a trixie base with sid's Ceph drags in sid's libc,
# systemd libraries and Python (138 of its 193 packages from sid): the base is sid itself.
# Why, the alternatives measured, and how a moving sid stays checked: docs/ARCHITECTURE.md,
# "The image's Ceph client". Development machines and the test cluster stay on bookworm
# (Pacific, Python 3.11); the code supports every client from Pacific to Tentacle.
#
# A Reef variant for clusters whose keys are all legacy aes (no Tentacle-made keys):
#   --build-arg DEBIAN_IMAGE=debian:13.8-slim --build-arg CEPH_CLIENT=18.2 --build-arg PYTHON_MINOR=3.13
#
# Python: Debian's python3, because Ceph's rados/rbd bindings exist only as Debian packages
# built for it (PyPI has none). cephcsi and its PyPI dependencies live in a venv, and only the
# two binding modules are linked into it, exactly as scripts/setup.sh does for development.
# (--system-site-packages would instead let Debian's own python3-* packages, pulled in by
# ceph-common, satisfy or shadow cephcsi's requirements.)
#
# Debian packages come from scripts/packages.sh, run inside each stage so it picks the lists of
# the base image's release. Versions are not pinned (hence DL3008 ignored below): Debian's
# archive keeps only the newest build of each package, so an exact pin breaks the build at the
# next upload. What is pinned instead is what was verified: the final stage fails the build if
# sid has moved to another Ceph release or Python minor (ARG CEPH_CLIENT, PYTHON_MINOR), and
# scripts/build-image.sh records every package version of the image beside its archive.

ARG DEBIAN_IMAGE=debian:sid-20261030-slim

# ---- builder: wheels for cephcsi and its dependencies, then the runtime venv ------------
FROM ${DEBIAN_IMAGE} AS builder

COPY scripts/packages.sh /usr/share/cephcsi/packages.sh
# The assignment fails the RUN if packages.sh does (unknown release), so apt-get never runs
# with an empty list; $packages is unquoted on purpose: one word per package (SC2086).
# hadolint ignore=DL3008,SC2086
RUN packages="$(sh /usr/share/cephcsi/packages.sh builder)" \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $packages \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY protos/ protos/
COPY cephcsi/ cephcsi/

# `pip wheel` builds cephcsi in an isolated build environment: setup.py generates the gRPC
# stubs there with grpcio-tools (a build requirement in pyproject.toml, never installed in
# the image) and packages them (.dockerignore keeps any local stubs out of the context).
# All dependencies come as wheels too, so the runtime venv installs offline.
RUN python3 -m venv /opt/build \
 && /opt/build/bin/pip wheel --no-cache-dir --wheel-dir /wheels .

# The runtime venv is made here, at its final path, and copied whole into the final stage:
# the final stage gets the installed wheels and no pip, wheels or build tools. Its python is
# a link to /usr/bin/python3, the same Debian interpreter in both stages (same base image).
# rados/rbd are linked to the Debian bindings that the final stage installs
# (python3-rados, python3-rbd from scripts/packages.sh); the final stage checks the imports.
RUN python3 -m venv /opt/cephcsi \
 && /opt/cephcsi/bin/pip install --no-cache-dir --no-index --find-links /wheels cephcsi \
 && /opt/cephcsi/bin/pip uninstall --yes pip setuptools \
 && site="$(/opt/cephcsi/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')" \
 && suffix="$(/opt/cephcsi/bin/python -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')" \
 && for mod in rados rbd; do \
      ln -s "/usr/lib/python3/dist-packages/${mod}${suffix}" "${site}/${mod}${suffix}"; \
    done

# ---- final image ---------------------------------------------------------------------------
FROM ${DEBIAN_IMAGE}

LABEL org.opencontainers.image.title="cephcsi" \
      org.opencontainers.image.description="Ceph RBD CSI driver with the Kubernetes CSI sidecars embedded" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"

# The runtime list of scripts/packages.sh, the list scripts/setup.sh installs on development
# machines, so the image and the tested machines cannot drift. It includes kmod: the node
# plugin loads rbd/nbd with modprobe from the host's /lib/modules (mounted by the DaemonSet).
COPY scripts/packages.sh /usr/share/cephcsi/packages.sh
# hadolint ignore=DL3008,SC2086
RUN packages="$(sh /usr/share/cephcsi/packages.sh runtime)" \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $packages \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin cephcsi

COPY --from=builder /opt/cephcsi /opt/cephcsi
ENV PATH="/opt/cephcsi/bin:${PATH}" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# The Ceph client release and the Python minor this image was verified with (the packaging
# and e2e tests). sid moves: a build that gets another release fails here rather than ship an
# untested client; change these together with a run of those tests.
ARG CEPH_CLIENT=20.2
ARG PYTHON_MINOR=3.14

# Fail the build, not the pod, if the bindings, the generated stubs or a tool the node plugin
# runs are missing, or the client or interpreter is not the verified one.
RUN python -c 'import rados, rbd, cephcsi._generated.csi_pb2' \
 && python -c 'import sys; v = "%d.%d" % sys.version_info[:2]; sys.exit(None if v == sys.argv[1] else "Python " + v + ", not the verified " + sys.argv[1] + " (ARG PYTHON_MINOR)")' "$PYTHON_MINOR" \
 && ceph_version="$(rbd --version)" \
 && case "$ceph_version" in "ceph version $CEPH_CLIENT."*) ;; *) echo "$ceph_version: not the verified Ceph $CEPH_CLIENT client (ARG CEPH_CLIENT)" >&2; exit 1 ;; esac \
 && cephcsi --version \
 && modprobe --version \
 && for tool in rbd rbd-nbd rbd-fuse losetup mount umount blkid mkfs.ext4 mkfs.xfs; do \
      command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }; \
    done

USER 10001:10001
ENTRYPOINT ["cephcsi"]
