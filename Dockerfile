# Image for web, beat and workers (see docker-compose.yml).
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY requirements.txt .
# PyPI's default torch wheel is a CUDA build; the CPU index keeps the image small.
# Use an image with CUDA and drop the extra index for GPU clusters.
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu -r requirements.txt
COPY . .
RUN SECRET_KEY=build-only SWITCHYARD_ENV=production python manage.py collectstatic --noinput
EXPOSE 8000
CMD ["gunicorn", "stack.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3"]
