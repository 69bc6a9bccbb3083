# Image for the `migrate` service and the example job in docker-compose.yml.
FROM python:3.11-slim-bookworm
# JAVA_HOME names no architecture (Debian's JDK directory is java-17-openjdk-<arch>): it is the JDK
# that `java` on PATH resolves to, linked at a fixed path when the image is built on any platform
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /opt/java \
 && /opt/java/bin/java -version
ENV JAVA_HOME=/opt/java \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
# the offsets migrations (migrations/) are built into the package: installed with it
COPY txn_offsets ./txn_offsets
COPY migrations ./migrations
RUN pip install --no-cache-dir '.[examples]'
COPY examples ./examples
# the job runs as an unprivileged user
RUN useradd --create-home --uid 1000 app && chown -R app /app
USER app
CMD ["txn-offsets", "--help"]
