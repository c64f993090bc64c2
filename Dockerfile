# Image for web, beat and workers (see docker-compose.yml).
FROM python:3.11-slim
# Production mode unless the container is told otherwise: no DEBUG pages, HTTPS redirects, HSTS,
# secure cookies; SECRET_KEY and ALLOWED_HOSTS must then be given (docs/configuration.md).
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 SWITCHYARD_ENV=production
WORKDIR /app
# The runtime lock only: test and dev tools are in requirements-dev.txt, which never enters the image
# (.dockerignore; tests/stack/test_requirements.py).
COPY requirements.txt .
# PyPI's default torch wheel is a CUDA build; the CPU index keeps the image small.
# Use an image with CUDA and drop the extra index for GPU clusters.
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu -r requirements.txt
COPY . .
RUN SECRET_KEY=build-only ALLOWED_HOSTS=build-only python manage.py collectstatic --noinput
EXPOSE 8000
# The web server's one configuration (gthread, workers per CPU, keep-alive, persistent database
# connections): stack/gunicorn_conf.py, also run by docker-compose.yml and `manage.py bench gateway`.
CMD ["gunicorn", "-c", "stack/gunicorn_conf.py", "stack.wsgi:application"]
