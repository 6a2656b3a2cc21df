# Container image for the roofwatch agent (used by the Helm chart and deploy/kubernetes).
#   docker build -t ghcr.io/roofwatch/roofwatch:0.1.0 .
#   docker build --build-arg EXTRAS=amd -t ghcr.io/roofwatch/roofwatch:0.1.0-amd .
# The NVIDIA container runtime injects libnvidia-ml.so at run time (NVIDIA_DRIVER_CAPABILITIES
# =utility), so the image carries no driver. For AMD, the amdsmi Python package needs the host's
# ROCm libamd_smi.so mounted or installed; see docs/deploy.md.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG EXTRAS=""
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY exporters ./exporters
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".${EXTRAS:+[$EXTRAS]}"

FROM ${PYTHON_IMAGE}
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index /wheels/*.whl && rm -rf /wheels
# Unprivileged by default; the chart runs as uid 0 with every capability dropped only when it
# mounts the kubelet pod-resources socket, which is root-owned.
USER 65534:65534
ENV PYTHONUNBUFFERED=1
EXPOSE 9477
ENTRYPOINT ["roofwatch"]
CMD ["run"]
