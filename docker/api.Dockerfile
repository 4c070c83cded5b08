# The control plane: FastAPI under uvicorn. No JAX in this image.
FROM python:3.11-slim
WORKDIR /srv/rlaas
COPY pyproject.toml README.md ./
COPY app app
COPY rl_core rl_core
COPY sdk sdk
COPY worker worker
COPY migrations migrations
RUN pip install --no-cache-dir '.[api]'
EXPOSE 8000
CMD ["sh", "-c", "rlaas migrate && rlaas serve --host 0.0.0.0 --port 8000"]
