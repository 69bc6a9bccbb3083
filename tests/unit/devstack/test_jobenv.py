"""The job env archive's check on tiny fake venvs (each refusal names its member), and the
requirements the env gets: the wheel's, extras and pyspark left out."""

from __future__ import annotations

import io
import json
import re
import tarfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from txn_offsets.devstack.lab.jobenv import check_archive, requirements_without, wheel_requirements
from txn_offsets.errors import StackError

SITE = "lib/python3.11/site-packages"
CFG = "home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.2\n"


def fake_env(tmp_path: Path, files: dict[str, str], links: dict[str, str] | None = None) -> Path:
    """A tar.gz laid out as venv-pack writes one: a good env plus `files` (None-valued keys dropped)."""
    members = {
        "pyvenv.cfg": CFG,
        f"{SITE}/txn_offsets/__init__.py": "",
        f"{SITE}/txn_offsets-0.1.0.dist-info/METADATA": "Name: txn-offsets\n",
        **files,
    }
    symlinks = {"bin/python": "python3", "bin/python3": "/usr/bin/python3", **(links or {})}
    path = tmp_path / "env.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            if text is None:
                continue
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in symlinks.items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return path


def test_a_good_env_reports_what_the_nodes_need(tmp_path: Path) -> None:
    report = check_archive(fake_env(tmp_path, {f"{SITE}/plain.pth": "# comment\nsub/dir\nimport os\n"}))
    assert (report.python_path, report.python_version, report.txn_offsets_version) == (
        "/usr/bin/python3",
        "3.11.2",
        "0.1.0",
    )
    assert report.members == 6
    assert "every node needs Python 3.11.2 at /usr/bin/python3" in report.describe()


EDITABLE_URL = json.dumps({"url": "file:///w/mypkg", "dir_info": {"editable": True}})


@pytest.mark.parametrize(
    ("files", "member"),
    [
        ({f"{SITE}/__editable__.txn_offsets-0.1.0.pth": "import __editable___txn_offsets_0_1_0_finder"},
         f"{SITE}/__editable__.txn_offsets-0.1.0.pth"),
        ({f"{SITE}/__editable___txn_offsets_0_1_0_finder.py": "MAPPING = {}"},
         f"{SITE}/__editable___txn_offsets_0_1_0_finder.py"),
        ({f"{SITE}/txn-offsets.egg-link": "/work/main\n."}, f"{SITE}/txn-offsets.egg-link"),
        ({f"{SITE}/m-1.dist-info/direct_url.json": EDITABLE_URL}, f"{SITE}/m-1.dist-info/direct_url.json"),
        ({f"{SITE}/easy.pth": "/work/main\n"}, f"{SITE}/easy.pth"),
        ({f"{SITE}/up.pth": "../../../../outside\n"}, f"{SITE}/up.pth"),
        ({f"{SITE}/pyspark/__init__.py": ""}, f"{SITE}/pyspark/__init__.py"),
    ],
    ids=["editable-pth", "editable-finder", "egg-link", "direct-url-editable", "pth-absolute", "pth-escapes",
         "pyspark"],
)  # fmt: skip
def test_each_refusal_is_one_line_naming_the_member(
    tmp_path: Path, files: dict[str, str], member: str
) -> None:
    with pytest.raises(StackError) as raised:
        check_archive(fake_env(tmp_path, files))
    message = str(raised.value)
    assert "\n" not in message
    assert f": {member}" in message or f" {member} " in message, message
    assert message.startswith("job env: ")


def test_a_direct_url_of_a_wheel_install_is_fine(tmp_path: Path) -> None:
    direct = json.dumps({"url": "file:///w/txn_offsets-0.1.0-py3-none-any.whl", "archive_info": {}})
    assert check_archive(fake_env(tmp_path, {f"{SITE}/txn_offsets-0.1.0.dist-info/direct_url.json": direct}))


def test_no_txn_offsets_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StackError, match=r"site-packages/txn_offsets/__init__\.py is missing"):
        check_archive(fake_env(tmp_path, {f"{SITE}/txn_offsets/__init__.py": None}))  # type: ignore[dict-item]


def test_a_python_link_leading_nowhere_in_the_archive_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StackError, match=r"bin/python leads to bin/python3\.11, which is not in the archive"):
        check_archive(fake_env(tmp_path, {}, {"bin/python": "python3.11"}))


def test_not_a_venv_and_not_an_archive_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StackError, match=r"pyvenv\.cfg is missing"):
        check_archive(fake_env(tmp_path, {"pyvenv.cfg": None}))  # type: ignore[dict-item]
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not gzip")
    with pytest.raises(StackError, match=r"not a readable tar\.gz"):
        check_archive(junk)


REQUIRES = [
    "pyspark<5,>=4.0",
    "confluent-kafka>=2.13.2",
    "SQLAlchemy<3,>=2.0",
    "psycopg[binary]<4,>=3.1",
    'msgspec>=0.19; extra == "examples"',
    'pyspark[connect]<5,>=4.0; extra == "connect"',
    'pandas<3,>=2.2; python_version >= "3.11" and extra == "dev"',
    'tomli>=2; python_version < "3.11"',
]


def test_requirements_without_pyspark_and_extras() -> None:
    assert requirements_without(REQUIRES) == [
        "confluent-kafka>=2.13.2",
        "SQLAlchemy<3,>=2.0",
        "psycopg[binary]<4,>=3.1",
        'tomli>=2; python_version < "3.11"',
    ]


def test_the_requirements_are_read_from_the_wheels_metadata(tmp_path: Path) -> None:
    wheel = tmp_path / "txn_offsets-0.1.0-py3-none-any.whl"
    metadata = "Metadata-Version: 2.4\nName: txn-offsets\n" + "".join(
        f"Requires-Dist: {r}\n" for r in REQUIRES
    )
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("txn_offsets/__init__.py", "")
        zf.writestr("txn_offsets-0.1.0.dist-info/METADATA", metadata + "\nThe readme: Requires-Dist: no\n")
    assert wheel_requirements(wheel) == REQUIRES


NAMES = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,12}[A-Za-z0-9])?", fullmatch=True)


@given(
    name=NAMES,
    spec=st.sampled_from(["", ">=1.0", "<3,>=2", "[binary]>=3.1", " (>=1)", "==1.*"]),
    marker=st.sampled_from(["", '; python_version >= "3.8"', '; extra == "x"', '; sys_platform == "linux"']),
)
def test_a_requirement_is_kept_unless_an_extra_or_the_clusters(name: str, spec: str, marker: str) -> None:
    line = f"{name}{spec}{marker}"
    clusters = re.sub(r"[-_.]+", "-", name).lower() == "pyspark"
    expected = [] if "extra" in marker or clusters else [line]
    assert requirements_without([line]) == expected
    # the cluster's own projects are matched by normalized name: Py_Spark is pyspark
    assert requirements_without([line], skip=[name.upper().replace("-", "_")]) == []
