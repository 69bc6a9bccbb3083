"""Spark's own Kafka source (``spark.readStream.format("kafka")``) for the installed pyspark.

pyspark does not ship the ``spark-sql-kafka-0-10`` connector, and ``spark.jars.packages`` cannot
resolve it when Maven Central has no artifact of the exact Spark version (pyspark 4.3.0). This
module resolves the connector once with Maven into ``~/.cache/txn-offsets/spark-kafka-<pyspark
version>/libs`` (the Maven repository is the one the Kafka jars use, ``~/.cache/txn-offsets/m2``)
and returns the jars to put on ``spark.jars``: the connector and its runtime dependencies
(kafka-clients, commons-pool2, the token provider), without the jars pyspark already ships.

It tries the connector of pyspark's own version first, then the newest known to load on it
(:data:`FALLBACK_VERSION`). Maven runs with a settings file whose only mirror (``*``) is Maven
Central, because Spark's parent POM names repositories that are not reachable from everywhere;
``TXN_OFFSETS_MAVEN_MIRROR`` replaces Central's URL (e.g. an internal proxy). Later calls need no
network: a ``.complete`` marker names the resolved version.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from xml.sax.saxutils import escape

from txn_offsets.devstack.kafka import cache_dir
from txn_offsets.errors import StackError

__all__ = ["FALLBACK_VERSION", "shipped_artifacts", "spark_kafka_conf", "spark_kafka_jars"]

logger = logging.getLogger(__name__)

SERVICE = "spark-kafka"
CONNECTOR = "spark-sql-kafka-0-10_2.13"
# Central has no spark-sql-kafka 4.3.x yet; 4.2.0 loads on pyspark 4.3 and reads correctly.
FALLBACK_VERSION = "4.2.0"
CENTRAL = "https://repo1.maven.org/maven2"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.txn-offsets</groupId>
  <artifactId>spark-kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.spark</groupId><artifactId>{connector}</artifactId>
      <version>{version}</version></dependency>
  </dependencies>
</project>
"""

_SETTINGS = """<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
  <mirrors>
    <mirror><id>txn-offsets-central</id><mirrorOf>*</mirrorOf><url>{url}</url></mirror>
  </mirrors>
</settings>
"""

# a line of `mvn dependency:list`: group:artifact:type[:classifier]:version:scope
_LISTED = re.compile(
    r"^\s+(?P<group>[^:\s]+):(?P<artifact>[^:\s]+):(?P<type>[^:\s]+):(?:(?P<classifier>[^:\s]+):)?"
    r"(?P<version>[^:\s]+):(?P<scope>compile|runtime)\b",
    re.MULTILINE,
)
_NETWORK = re.compile(
    r"Could not transfer|transfer failed|UnknownHost|Connect(ion)? (refused|timed out)|"
    r"Network is unreachable|PKIX|handshake",
    re.IGNORECASE,
)
_MISSING = re.compile(r"Could not find artifact|could not be resolved|was not found in", re.IGNORECASE)


def _pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def _shipped_jars_dir() -> Path:
    """The jars Spark itself puts on its classpath (SPARK_HOME's, else the pip package's)."""
    home = os.environ.get("SPARK_HOME")
    if home and (Path(home) / "jars").is_dir():
        return Path(home) / "jars"
    import pyspark

    return Path(str(pyspark.__file__)).parent / "jars"


def shipped_artifacts(jars_dir: Path) -> set[str]:
    """The artifact ids of the jars in `jars_dir`. A file name does not say where the artifact id
    ends (``spark-sql-kafka-0-10_2.13-4.2.0``, ``log4j-1.2-api-2.25.4``), so every prefix that
    stops before a ``-<digit>`` counts: only exact artifact ids from Maven are compared with it."""
    names: set[str] = set()
    for jar in jars_dir.glob("*.jar"):
        stem = jar.name.removesuffix(".jar")
        names.update(stem[: m.start()] for m in re.finditer(r"-\d", stem))
    return names


def spark_kafka_jars(spark_version: str | None = None, *, timeout_s: float = 600.0) -> list[Path]:
    """The jars that give ``spark_version`` (default: the installed pyspark's) Spark's Kafka source.

    Idempotent and safe to call from several processes at once (a file lock serialises the first
    download). Raises :class:`txn_offsets.StackError` with the fix when Maven is missing, Maven
    Central is unreachable, no connector version resolves, or Maven takes longer than `timeout_s`.
    """
    version = spark_version or _pyspark_version()
    home = cache_dir() / f"spark-kafka-{version}"
    libs = home / "libs"
    marker = home / ".complete"
    if marker.exists():
        return _listed(libs)
    home.mkdir(parents=True, exist_ok=True)
    with _locked(home / ".lock"):
        if marker.exists():  # another process finished while we waited
            return _listed(libs)
        mvn = shutil.which("mvn")
        if mvn is None:
            raise StackError(
                SERVICE,
                "Maven (mvn) is needed once to download Spark's Kafka connector from Maven Central",
                "install it (Debian: `apt-get install maven`)",
            )
        shipped = shipped_artifacts(_shipped_jars_dir())
        tried: list[str] = []
        for candidate in dict.fromkeys([version, FALLBACK_VERSION]):
            staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=home))
            try:
                if _resolve(mvn, candidate, staging, shipped, timeout_s):
                    if libs.exists():
                        shutil.rmtree(libs)
                    staging.rename(libs)
                    marker.write_text(f"{CONNECTOR} {candidate}\n")
                    logger.info("Spark's Kafka connector %s is in %s", candidate, libs)
                    return _listed(libs)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            tried.append(candidate)
        raise StackError(
            SERVICE,
            f"Maven Central has no {CONNECTOR} for version(s) {', '.join(tried)}",
            "upgrade txn_offsets (a newer FALLBACK_VERSION) or pass spark_version= a connector version "
            "that exists for your Spark major version",
        )


def spark_kafka_conf(jars: Sequence[Path] | None = None) -> dict[str, str]:
    """SparkSession settings that put the connector on the driver's and executors' classpath."""
    paths = jars if jars is not None else spark_kafka_jars()
    return {"spark.jars": ",".join(str(p) for p in paths)}


def _listed(libs: Path) -> list[Path]:
    jars = sorted(libs.glob("*.jar"))
    if not any(j.name.startswith(f"{CONNECTOR}-") for j in jars):
        raise StackError(SERVICE, f"the cached connector in {libs} is incomplete", f"remove {libs.parent}")
    return jars


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _resolve(mvn: str, version: str, out: Path, shipped: set[str], timeout_s: float) -> bool:
    """Copy the connector `version` and its runtime dependencies into `out` (minus `shipped`).
    False if Central has no such version; raises for every other failure."""
    mirror = os.environ.get("TXN_OFFSETS_MAVEN_MIRROR", CENTRAL)
    logger.info("downloading %s %s (Maven, mirror %s) into %s", CONNECTOR, version, mirror, out)
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "dependencies.txt"
        (Path(tmp) / "pom.xml").write_text(_POM.format(connector=CONNECTOR, version=escape(version)))
        (Path(tmp) / "settings.xml").write_text(_SETTINGS.format(url=escape(mirror)))
        try:
            done = subprocess.run(
                [
                    mvn,
                    "-B",
                    "-q",
                    "-s",
                    str(Path(tmp) / "settings.xml"),
                    f"-Dmaven.repo.local={cache_dir() / 'm2'}",
                    f"{DEPENDENCY_PLUGIN}:copy-dependencies",
                    f"{DEPENDENCY_PLUGIN}:list",
                    f"-DoutputDirectory={out}",
                    f"-DoutputFile={listing}",
                    "-DincludeScope=runtime",
                ],
                cwd=tmp,
                capture_output=True,
                text=True,
                check=False,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired:
            raise StackError(
                SERVICE,
                f"Maven did not finish resolving {CONNECTOR} {version} within {timeout_s:.0f}s",
                f"check network access to {mirror} (or set TXN_OFFSETS_MAVEN_MIRROR to a reachable "
                "mirror of Maven Central), then run again",
            ) from None
        listed = listing.read_text() if listing.exists() else ""
    out_text = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)
    if done.returncode != 0:
        errors = [ln.removeprefix("[ERROR]").strip() for ln in out_text.splitlines() if "[ERROR]" in ln]
        detail = next((e for e in errors if e), out_text.strip()[-300:])[:400]
        if _NETWORK.search(out_text):
            raise StackError(
                SERVICE,
                f"Maven Central is unreachable: {detail}",
                f"check network access to {mirror} (or set TXN_OFFSETS_MAVEN_MIRROR to a reachable "
                "mirror of Maven Central), then run again",
            )
        if _MISSING.search(out_text) and CONNECTOR in out_text:
            logger.info("%s %s is not on Maven Central", CONNECTOR, version)
            return False
        raise StackError(
            SERVICE,
            f"Maven could not resolve {CONNECTOR} {version}: {detail}",
            f"see Maven's full error: `mvn dependency:get -Dartifact=org.apache.spark:{CONNECTOR}:{version}`",
        )
    for dep in _LISTED.finditer(listed):
        if dep["artifact"] in shipped:
            classifier = f"-{dep['classifier']}" if dep["classifier"] else ""
            (out / f"{dep['artifact']}-{dep['version']}{classifier}.{dep['type']}").unlink(missing_ok=True)
    return True
