# A GPU worker: JAX with CUDA 12. Serves the "gpu" queue.
FROM nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04
# bubblewrap: the code_exec sandbox's wall between tenants; without it this worker
# refuses code_exec runs (docs/lifecycle.md, "The sandbox wall"). On an Ubuntu 24.04
# host, unprivileged user namespaces also need kernel.apparmor_restrict_unprivileged_userns=0
# (or an AppArmor profile for bwrap): the worker's start-up line says whether it runs.
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    bubblewrap && bwrap --version && rm -rf /var/lib/apt/lists/* \
    && useradd --system --create-home --uid 10001 rlaas \
    && mkdir -p /var/lib/rlaas && chown rlaas /var/lib/rlaas  # the artifacts volume
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /srv/rlaas
COPY pyproject.toml README.md ./
COPY app app
COPY rl_core rl_core
COPY sdk sdk
COPY worker worker
COPY migrations migrations
RUN pip install --no-cache-dir '.[worker,trackers]' 'jax[cuda12]'
ENV RLAAS_QUEUE=gpu
# Unprivileged: what a sandboxed program could reach is what this user can.
USER rlaas
CMD ["rlaas", "worker"]
