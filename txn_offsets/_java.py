"""Finding a Java runtime (Kafka 4 and Spark 4 both need Java >= 17)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from txn_offsets.errors import JavaNotFound

MIN_JAVA = 17


def find_java() -> str:
    """The `java` binary (JAVA_HOME first, then PATH), checked to be >= 17."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise JavaNotFound("no Java runtime found (JAVA_HOME unset and no `java` on PATH)")
    done = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if not match:
        raise JavaNotFound(f"cannot read the version of {java}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8" style
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise JavaNotFound(f"{java} is Java {major}")
    return java
