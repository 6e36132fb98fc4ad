# One image for the operator, the agent sidecar and the analyzer Job; it also carries the
# injectable hook folder (/opt/perfdiag/hook) that the webhook's init container copies into pods.
# Build: docker build -t perfdiag:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY perfdiag ./perfdiag
COPY operator ./operator
COPY collector ./collector
COPY analyzer ./analyzer
RUN pip wheel --no-cache-dir --wheel-dir /wheels . \
 && pip install --no-cache-dir --no-deps --target /tmp/pd /wheels/perfdiag-*.whl \
 && PYTHONPATH=/tmp/pd python -c "from pathlib import Path; from perfdiag.collector.hookdir import materialize; materialize(Path('/hook'))"

FROM python:3.11-slim
LABEL org.opencontainers.image.title="perfdiag" \
      org.opencontainers.image.description="Online performance troubleshooting for distributed PyTorch training" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
 && useradd --uid 10001 --create-home perfdiag
COPY --from=build /hook /opt/perfdiag/hook
USER 10001
ENTRYPOINT ["perfdiag"]
CMD ["--help"]
