# One image for the operator, the agent sidecar and the analyzer Job; it also carries the
# injectable hook folder (/opt/perfdiag/hook) that the webhook's init container copies into pods.
#
# Build and push (docs/install.md):
#   docker build -t ghcr.io/perfdiag/perfdiag:0.1.0 --build-arg VERSION=0.1.0 .
#   docker push ghcr.io/perfdiag/perfdiag:0.1.0
# The test suite builds it with buildah on a local Debian base (scripts/image-base.sh) and runs
# it: tests/image/.
ARG PYTHON_IMAGE=python:3.11-slim
# The same Python with a C compiler: the wheel builds the fast Kineto reader's scanner (C).
ARG BUILD_IMAGE=python:3.11

FROM ${BUILD_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY perfdiag ./perfdiag
COPY operator ./operator
COPY collector ./collector
COPY analyzer ./analyzer
# The hook folder is made from /: in /src, the source's perfdiag/ (without the component
# folders) would come first on sys.path.
RUN pip wheel --no-cache-dir --wheel-dir /wheels . \
 && pip install --no-cache-dir --no-deps --target /tmp/pd /wheels/perfdiag-*.whl \
 && cd / && PYTHONPATH=/tmp/pd python -c "from pathlib import Path; from perfdiag.collector.hookdir import materialize; materialize(Path('/hook'))"

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="perfdiag" \
      org.opencontainers.image.description="Online performance troubleshooting for distributed PyTorch training" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/perfdiag/perfdiag" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
 && groupadd --gid 10001 perfdiag \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp perfdiag
# World-readable: the init container copies it into an emptyDir under the pod's own user.
COPY --from=build --chmod=0755 /hook /opt/perfdiag/hook
# Numeric, so runAsNonRoot can verify it (the chart runs it as 10001 too).
USER 10001:10001
ENTRYPOINT ["perfdiag"]
CMD ["--help"]
