# Image for the `migrate` service and the example job in docker-compose.yml.
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*
ENV JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
# the offsets migrations are package data (txn_offsets/migrations): installed with the package
COPY txn_offsets ./txn_offsets
RUN pip install --no-cache-dir '.[examples]'
COPY examples ./examples
# the job runs as an unprivileged user
RUN useradd --create-home --uid 1000 app && chown -R app /app
USER app
CMD ["txn-offsets", "--help"]
