# A CPU worker: Celery with the solo pool, JAX on the CPU. Serves the "cpu" queue.
FROM python:3.11-slim
# bubblewrap: the code_exec sandbox's wall between tenants (rl_core/envs/sandbox.py). A
# deployed worker without it refuses code_exec runs (docs/lifecycle.md, "The sandbox
# wall"), so the build fails here rather than ship an image without it.
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap \
    && bwrap --version \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --create-home --uid 10001 rlaas \
    && mkdir -p /var/lib/rlaas && chown rlaas /var/lib/rlaas  # the artifacts volume
WORKDIR /srv/rlaas
COPY pyproject.toml README.md ./
COPY app app
COPY rl_core rl_core
COPY sdk sdk
COPY worker worker
COPY migrations migrations
RUN pip install --no-cache-dir '.[worker,trackers]'
ENV RLAAS_QUEUE=cpu
# Unprivileged: what a sandboxed program could reach is what this user can.
USER rlaas
CMD ["rlaas", "worker"]
