# A CPU worker: Celery with the solo pool, JAX on the CPU. Serves the "cpu" queue.
FROM python:3.11-slim
WORKDIR /srv/rlaas
COPY pyproject.toml README.md ./
COPY app app
COPY rl_core rl_core
COPY sdk sdk
COPY worker worker
COPY migrations migrations
RUN pip install --no-cache-dir '.[worker]'
ENV RLAAS_QUEUE=cpu
CMD ["rlaas", "worker"]
