# Owlet image: one image for the GPU worker and the UI (the command picks the role; see docker-compose.yml).
# torch from PyPI on linux/amd64 ships CUDA, so the same image runs the worker on a GPU host.
FROM python:3.11-slim AS base
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false GRADIO_ANALYTICS_ENABLED=False \
    MALLOC_ARENA_MAX=2
WORKDIR /app
COPY requirements.txt .
RUN pip install -r requirements.txt
COPY pyproject.toml README.md ./
COPY engine engine
COPY worker worker
COPY ui ui
COPY owlet owlet
COPY training training
COPY scripts scripts
# The project itself (no dependencies: requirements.txt pinned them), editable so the one copy of the code is
# /app, as in a checkout; this puts owlet-worker, owlet-page and owlet-demo on PATH. The image is the
# project's own environment, so its short package names (engine, worker, ui) cannot clash with anything.
RUN pip install --no-deps -e .
RUN useradd --create-home --uid 1000 owlet && mkdir -p /app/models && chown -R owlet /app
USER owlet
EXPOSE 7860
# The model folder is mounted at /app/models (read-only) by docker-compose.yml.
CMD ["owlet-page", "--host", "0.0.0.0", "--port", "7860"]

# Optional monitoring image: the same app plus Flower (`docker compose --profile flower up`).
FROM base AS flower
USER root
RUN pip install flower==2.2.0
USER owlet
EXPOSE 5555
CMD ["celery", "-A", "worker.main", "flower", "--port=5555"]
