"""The embedded stack's set-up errors say what is wrong and how to fix it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from txn_offsets.devstack import kafka
from txn_offsets.errors import StackError


def test_java_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-such-jdk"))
    with pytest.raises(StackError, match=r"no Java runtime found.*Fix: install openjdk-17"):
        kafka.java_binary()


def test_java_too_old(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a stand-in `java` that reports an old version the way Java 11 does
    java = tmp_path / "jdk11" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.22\" 2024-01-16' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk11"))
    with pytest.raises(StackError, match=r"is Java 11.*Fix: install openjdk-17"):
        kafka.java_binary()


def test_maven_central_unreachable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a real Maven run, pointed at a mirror nobody listens on, with an empty cache
    home = tmp_path / "home"
    (home / ".m2").mkdir(parents=True)
    (home / ".m2" / "settings.xml").write_text(
        "<settings><mirrors><mirror><id>nowhere</id><mirrorOf>*</mirrorOf>"
        "<url>https://127.0.0.1:9/maven2</url></mirror></mirrors></settings>"
    )
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("MAVEN_OPTS", f"-Duser.home={home} {os.environ.get('MAVEN_OPTS', '')}")
    with pytest.raises(StackError, match=r"Maven Central is unreachable.*Fix: check network access"):
        kafka.ensure_libs()
    assert not (tmp_path / "cache" / "txn-offsets" / f"kafka-{kafka.KAFKA_VERSION}" / ".complete").exists()
