"""SLURM host lists (the parser on its own, and scontrol when it is on PATH) and the launcher's
environment variables: values out of range or not integers are one-line errors, at once."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from meshshard.comm import expand_hostlist, first_slurm_host
from meshshard.comm._context import _launch_from_env


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node17", ["node17"]),
        ("gpu[07-09,12]", ["gpu07", "gpu08", "gpu09", "gpu12"]),
        ("a[001-002],b[1-2]", ["a001", "a002", "b1", "b2"]),
        ("x1,x2", ["x1", "x2"]),
        ("rack1-node[01-02]-ib", ["rack1-node01-ib", "rack1-node02-ib"]),
        ("cn[1-2]x[3-4]", ["cn1x3", "cn1x4", "cn2x3", "cn2x4"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("[1-2]a", ["1a", "2a"]),
        ("r[1,3]-c[2]-x,login", ["r1-c2-x", "r3-c2-x", "login"]),
        (" node1 ", ["node1"]),
    ],
)
def test_hostlist_grammar(nodelist: str, hosts: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")  # no scontrol: the parser
    assert expand_hostlist(nodelist) == hosts
    assert first_slurm_host(nodelist) == hosts[0]


@pytest.mark.parametrize(
    ("nodelist", "reason"),
    [
        ("node[01-04", r"a '\[' without its '\]'"),
        ("node01-04]", r"a '\]' without its '\['"),
        ("node[[1]]", r"nested brackets"),
        ("node[]", r"an empty bracket group"),
        ("a,,b", r"an empty host name"),
        ("a,", r"an empty host name"),
        ("", r"an empty list"),
        ("n[4-2]", r"the range '4-2' runs backwards"),
        ("n[1-x]", r"'1-x' in a bracket group is not a number"),
        ("n[1,,2]", r"'' in a bracket group is not a number"),
        ("a b", r"white space inside the list"),
        ("n[0-999999],m[0-9]", r"1000010 hosts, more than 1000000"),
    ],
)
def test_malformed_hostlist_is_one_line(nodelist: str, reason: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    with pytest.raises(ValueError, match=r"^Expected a SLURM host list such as 'node\[01-04,07\],gpu3' \(got .*: " + reason) as info:
        expand_hostlist(nodelist)
    assert "\n" not in str(info.value)
    if "hosts, more than" not in reason:
        with pytest.raises(ValueError, match=reason):
            first_slurm_host(nodelist)


def test_first_host_never_expands_the_whole_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    assert first_slurm_host("n[0000000001-9999999999]x[5-9]") == "n0000000001x5"


def _fake_scontrol(folder: Path, body: str) -> None:
    script = folder / "scontrol"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_scontrol_expands_the_list_when_it_is_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_scontrol(tmp_path, 'test "$1 $2" = "show hostnames" && printf "%s\\n" "from-scontrol-$3" other')
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    assert first_slurm_host("weird[1-2]") == "from-scontrol-weird[1-2]"


def test_failing_scontrol_falls_back_to_the_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_scontrol(tmp_path, "exit 1")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert first_slurm_host("rack1-node[01-02]-ib") == "rack1-node01-ib"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "4", "WORLD_SIZE": "4"}, r"^Expected the environment variable RANK in \[0, 4\), WORLD_SIZE = 4 \(got 4\)$"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, r"^Expected the environment variable RANK in \[0, 2\), WORLD_SIZE = 2 \(got -1\)$"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, r"^Expected the environment variable WORLD_SIZE to be at least 1 \(got 0\)$"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
         r"^Expected the environment variable LOCAL_RANK in \[0, 2\), LOCAL_WORLD_SIZE = 2 \(got 2\)$"),
        ({"RANK": "0", "WORLD_SIZE": "2.0"}, r"^Expected the environment variable WORLD_SIZE to be an integer \(got '2.0'\)$"),
        ({"SLURM_PROCID": "3", "SLURM_NTASKS": "3"}, r"^Expected the environment variable SLURM_PROCID in \[0, 3\), SLURM_NTASKS = 3 \(got 3\)$"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "x"}, r"^Expected the environment variable SLURM_LOCALID to be an integer \(got 'x'\)$"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "abc"},
         r"^Expected the environment variable SLURM_NTASKS_PER_NODE to be a task count such as '2\(x3\),1' \(got 'abc'\)$"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "2", "SLURM_NTASKS_PER_NODE": "2"},
         r"^Expected the environment variable SLURM_LOCALID in \[0, 2\), SLURM_NTASKS_PER_NODE = 2 \(got 2\)$"),
    ],
)
def test_launcher_variables_are_checked_at_once(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _launch_from_env(env)


def test_good_launcher_variables() -> None:
    assert _launch_from_env({"RANK": "1", "WORLD_SIZE": "2"}) == ("torchrun", 1, 2, 1, 2)
    assert _launch_from_env({"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_NTASKS_PER_NODE": "2(x2)"}) == ("slurm", 2, 4, 0, 2)
