# tally's image: `kopf run operator/main.py` on python:3.11-slim, as a non-root user, fit for a
# read-only root filesystem (nothing is written outside the emptyDirs the Deployment mounts:
# TALLY_WEBHOOK_CERT_DIR and /tmp). Not built in CI (no container engine there); see README,
# "Install in a cluster".
#
#   docker build -t tally:0.1.0 .
#
# Dependencies: the direct ones are pinned in pyproject.toml (==); pip resolves their own
# dependencies at build time. Pin the base image by digest for reproducible builds.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/tally
# Only what `pip install .` reads: the project metadata and the package.
COPY pyproject.toml ./
COPY operator/tally ./operator/tally
RUN /opt/tally/bin/pip install --no-cache-dir . \
    && /opt/tally/bin/python -m compileall -q /opt/tally

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/tally/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN groupadd --system --gid 65532 tally \
    && useradd --system --uid 65532 --gid tally --no-create-home --shell /usr/sbin/nologin tally
COPY --from=build /opt/tally /opt/tally
# The entry point only; the package itself is installed in /opt/tally, with its console script
# kubectl-tally in /opt/tally/bin, on PATH (`kubectl tally`, docs/kubectl-tally.md).
COPY operator/main.py /app/operator/main.py
WORKDIR /app
USER 65532:65532
# webhook (TALLY_WEBHOOK_PORT), metrics (TALLY_METRICS_PORT), Kopf liveness (--liveness).
EXPOSE 9443 8080 8081 8082
ENTRYPOINT ["kopf", "run", "/app/operator/main.py", "--all-namespaces", "--standalone", \
            "--liveness=http://0.0.0.0:8081/healthz"]
