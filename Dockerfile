# Container image of the roofwatch agent: what the Helm chart and deploy/kubernetes run.
#
#   ./dev.sh image              builds it here (buildah over a Debian bookworm base made by mmdebstrap,
#                               no registry needed) as dist/roofwatch-VERSION-oci.tar
#   ./dev.sh image amd          the [amd] variant (the amdsmi wrapper), tagged VERSION-amd
#   docker build --build-arg VERSION=0.1.0 -t ghcr.io/roofwatch/roofwatch:0.1.0 .   where a registry is reachable
#
# The NVIDIA container runtime injects libnvidia-ml.so at run time (NVIDIA_DRIVER_CAPABILITIES
# =utility), so the image carries no driver. For AMD, the amdsmi Python package needs the host's
# ROCm libamd_smi.so mounted or installed; see docs/deploy.md. What the image holds and its size:
# docs/deploy.md#the-container-image.
#
# PYTHON_IMAGE: any Debian-like image with python3 and its venv module (python:3.11-slim-bookworm,
# or the mmdebstrap base ./dev.sh image builds). Both stages use it, so the virtualenv's interpreter
# link points at the same python3 in the image that runs it.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG EXTRAS=""
# PIP_INSTALL_OPTIONS: where the dependencies come from; empty means PyPI. ./dev.sh image mounts a
# wheelhouse fetched beforehand and passes "--no-index --find-links=/wheelhouse", so that build needs
# no network.
ARG PIP_INSTALL_OPTIONS=""
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY agent ./agent
COPY exporters ./exporters
# One virtualenv holds roofwatch and its dependencies; pip and setuptools leave it afterwards, so the
# image carries no installer, no build backend and no download cache.
RUN python3 -m venv /opt/roofwatch \
 && /opt/roofwatch/bin/pip install --no-cache-dir --disable-pip-version-check ${PIP_INSTALL_OPTIONS} ".${EXTRAS:+[$EXTRAS]}" \
 && /opt/roofwatch/bin/pip uninstall --yes --quiet --quiet --disable-pip-version-check pip setuptools wheel

FROM ${PYTHON_IMAGE}
ARG VERSION=unknown
ARG REVISION=unknown
ARG EXTRAS=""
LABEL org.opencontainers.image.title="roofwatch" \
      org.opencontainers.image.description="GPU telemetry agent: roofline verdicts, MFU and MBU for Prometheus" \
      org.opencontainers.image.source="https://github.com/roofwatch/roofwatch" \
      org.opencontainers.image.url="https://github.com/roofwatch/roofwatch" \
      org.opencontainers.image.documentation="https://github.com/roofwatch/roofwatch/blob/main/docs/deploy.md" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      io.roofwatch.extras="${EXTRAS}"
COPY --from=build /opt/roofwatch /opt/roofwatch
ENV PATH=/opt/roofwatch/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Unprivileged by default; the chart runs as uid 0 with every capability dropped only when it
# mounts the kubelet pod-resources socket, which is root-owned.
USER 65534:65534
EXPOSE 9477
ENTRYPOINT ["roofwatch"]
CMD ["run"]
