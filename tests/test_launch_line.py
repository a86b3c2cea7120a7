"""A Horovod job's launch line runs unchanged: every flag form of horovodrun 0.28.1 (tests/data/horovodrun.json)
has Horovod's meaning or is refused in one line; every ``HOROVOD_*`` variable is honoured or warned about; the
settings table covers Horovod's flags, config keys and variables. The walk checks each flag's effect on what
hororun hands on (the ranks' variables, the MPI launcher's arguments) without starting MPI; then a few real
jobs: a launch line with a config file, ``--mpi-args``, ``--output-filename`` and ``--verbose`` at 2 ranks,
Horovod's rank variables at 1 rank, ``--start-timeout``, ``-v``.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import tomllib

import horo
from horo.core.base import config as cfg
from horo.core.base.horovod_env import check_environment, configure_logging, unsupported
from horo.core.base.setting import GROUPS
from horo.core.base.settings import BUILD_VARIABLES, SETTINGS, by_horovod
from horo.run import main
from horo.run.args import UsageError, parse_args
from horo.run.effective import print_settings, resolve
from horo.run.mpiexec import HYDRA, OPENMPI, LaunchPlan, build_command
from horo.run.output import Output, rank_folder

ROOT = Path(__file__).resolve().parents[1]
DATA = json.loads((ROOT / "tests" / "data" / "horovodrun.json").read_text())
JOB = ROOT / "tests" / "scripts" / "launch_line_job.py"
JOB_TIMEOUT = 120.0


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each case sees the once-per-process warnings anew, and none of this process's own settings.
    monkeypatch.setattr(cfg, "_warned", set())
    monkeypatch.setattr(cfg, "_copied", {})
    for name in list(os.environ):
        if name.startswith(("HORO_", "HOROVOD_")):
            monkeypatch.delenv(name)


# --------------------------------------------------------------------------- the table against Horovod's lists


def test_the_settings_table_holds_every_horovod_flag_config_key_and_variable() -> None:
    forms = {f for s in SETTINGS for f in s.forms}
    horovod_forms = [f for flag in DATA["flags"] for f in flag["forms"]]
    assert len(horovod_forms) == 71 and not set(horovod_forms) - forms, set(horovod_forms) - forms
    keys = {s.key.lstrip("!") for s in SETTINGS if s.key}
    assert set(DATA["config_keys"]) == keys
    for name in DATA["variables"] + DATA["rank_variables"]:
        assert by_horovod(name) is not None, name
    assert set(DATA["build_variables"]) == set(BUILD_VARIABLES)
    # A flag's group is Horovod's (horo's own flags go where they belong).
    group = {f: GROUPS[s.group] for s in SETTINGS for f in s.forms}
    for flag in DATA["flags"]:
        for form in flag["forms"]:
            assert group[form] == flag["group"], form


def test_the_docs_tables_are_the_settings_tables() -> None:
    """docs/configuration.md and docs/api/launcher.md hold what tools/settings_tables.py writes from the table."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import settings_tables
    finally:
        sys.path.remove(str(ROOT / "tools"))
    for page in settings_tables.PAGES:
        text = page.read_text(encoding="utf-8")
        assert text.count("<!-- settings table: ") >= 5
        assert settings_tables.rewritten(text, page) == text, f"{page}: run python tools/settings_tables.py"


def test_help_shows_horovods_groups(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["--help"], prog="horovodrun")
    out = capsys.readouterr()
    assert info.value.code == 0 and out.out.startswith("usage: horovodrun ")
    for title in ("SSH arguments", "tuneable parameter arguments", "autotune arguments", "elastic arguments",
                  "timeline arguments", "stall check arguments", "library arguments", "logging arguments",
                  "host arguments", "controller arguments"):
        assert title in out.out


# --------------------------------------------------------------------------- every flag, with its effect

ABS = os.path.abspath


def _discovery(tmp: Path) -> str:
    path = tmp / "discover.sh"
    path.write_text("#!/bin/sh\necho localhost:2\n")
    path.chmod(0o755)
    return str(path)


def _config(tmp: Path) -> str:
    path = tmp / "horovod.yaml"
    path.write_text("params:\n  cycle_time_ms: 7\n")
    return str(path)


# form -> (its arguments, then other flags the case needs; what must follow). Kinds: "env": variables the ranks
# get; "ns": a parsed value; "args": the MPI launcher's extra arguments; "ssh": the ssh program's options;
# "warned": a variable the ranks get and the one warning, which names why; "refused": exit 2 in one line that
# names what to use instead; "exit0": prints and exits 0.
ON, OFF = "1", "0"
CASES: dict[str, tuple[list[str], str, Any]] = {
    "-v": ([], "exit0", horo.__version__),
    "--version": ([], "exit0", horo.__version__),
    "-np": (["3"], "ns", ("np", 3)),
    "--num-proc": (["3"], "ns", ("np", 3)),
    "-cb": ([], "ns", ("check_build", True)),
    "--check-build": ([], "ns", ("check_build", True)),
    "--disable-cache": ([], "ns", ("disable_cache", True)),  # hororun keeps no cache: its checks always run
    "--start-timeout": (["7"], "start", 7.0),
    "--network-interfaces": (["eth0,eth1"], "ns", ("network_interface", ["eth0", "eth1"])),
    "--network-interface": (["eth0", "--network-interface", "eth1"], "ns", ("network_interface", ["eth0", "eth1"])),
    "--output-filename": (["out"], "ns", ("output_filename", "out")),
    "--verbose": ([], "ns", ("verbose", True)),
    "--config-file": (["CONFIG"], "env", {"HORO_CYCLE_TIME": "7", "HOROVOD_CYCLE_TIME": "7"}),
    "-p": (["2222"], "ssh", ["-p", "2222"]),
    "--ssh-port": (["2222"], "ssh", ["-p", "2222"]),
    "-i": (["/keys/id"], "ssh", ["-i", "/keys/id"]),
    "--ssh-identity-file": (["/keys/id"], "ssh", ["-i", "/keys/id"]),
    "--fusion-threshold-mb": (["8"], "env", {"HORO_FUSION_THRESHOLD": str(8 << 20),
                                             "HOROVOD_FUSION_THRESHOLD": str(8 << 20)}),
    "--cycle-time-ms": (["2.5"], "env", {"HORO_CYCLE_TIME": "2.5"}),
    "--cache-capacity": (["64"], "env", {"HORO_CACHE_CAPACITY": "64"}),
    "--hierarchical-allreduce": ([], "env", {"HORO_HIERARCHICAL_ALLREDUCE": ON}),
    "--no-hierarchical-allreduce": ([], "env", {"HORO_HIERARCHICAL_ALLREDUCE": OFF}),
    "--hierarchical-allgather": ([], "env", {"HORO_HIERARCHICAL_ALLGATHER": ON}),
    "--no-hierarchical-allgather": ([], "env", {"HORO_HIERARCHICAL_ALLGATHER": OFF}),
    "--torus-allreduce": ([], "refused", "--hierarchical-allreduce"),
    "--no-torus-allreduce": ([], "env", {"HOROVOD_TORUS_ALLREDUCE": OFF}),  # horo never runs a torus
    "--autotune": ([], "env", {"HORO_AUTOTUNE": ON}),
    "--no-autotune": ([], "env", {"HORO_AUTOTUNE": OFF}),
    "--autotune-log-file": (["t.csv", "--autotune"], "env", {"HORO_AUTOTUNE_LOG": ABS("t.csv")}),
    "--autotune-warmup-samples": (["2", "--autotune"], "env", {"HORO_AUTOTUNE_WARMUP_SAMPLES": "2"}),
    "--autotune-steps-per-sample": (["4", "--autotune"], "env", {"HORO_AUTOTUNE_STEPS_PER_SAMPLE": "4"}),
    "--autotune-bayes-opt-max-samples": (["9", "--autotune"], "env", {"HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "9"}),
    "--autotune-gaussian-process-noise": (["0.5", "--autotune"], "env",
                                          {"HORO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "0.5"}),
    "--min-np": (["2"], "ns", ("elastic", True)),
    "--min-num-proc": (["2"], "ns", ("elastic", True)),
    "--max-np": (["4"], "warned", ("--max-np 4 alone does not make the job elastic", {})),
    "--max-num-proc": (["4"], "warned", ("alone does not make the job elastic", {})),
    "--slots-per-host": (["2", "--host-discovery-script", "DISCOVERY"], "ns", ("slots_per_host", 2)),
    "--elastic-timeout": (["30", "--min-np", "2"], "ns", ("elastic_timeout", 30.0)),
    "--reset-limit": (["3", "--min-np", "2"], "ns", ("reset_limit", 3)),
    "--blacklist-cooldown-range": (["10", "20", "--min-np", "2"], "ns", ("cooldown", [10.0, 20.0])),
    "--timeline-filename": (["tl.json"], "env", {"HORO_TIMELINE": ABS("tl.json"), "HOROVOD_TIMELINE": ABS("tl.json")}),
    "--timeline-mark-cycles": ([], "env", {"HORO_TIMELINE_MARK_CYCLES": ON}),
    "--no-timeline-mark-cycles": ([], "env", {"HORO_TIMELINE_MARK_CYCLES": OFF}),
    "--no-stall-check": ([], "env", {"HORO_STALL_CHECK_DISABLE": ON, "HOROVOD_STALL_CHECK_DISABLE": ON}),
    "--stall-check": ([], "env", {"HORO_STALL_CHECK_DISABLE": OFF}),
    "--stall-check-warning-time-seconds": (["90"], "env", {"HORO_STALL_CHECK_TIME_SECONDS": "90"}),
    "--stall-check-shutdown-time-seconds": (["120"], "env", {"HORO_STALL_SHUTDOWN_TIME_SECONDS": "120"}),
    "--mpi-threads-disable": ([], "warned", ("MPI_THREAD_MULTIPLE", {"HOROVOD_MPI_THREADS_DISABLE": ON})),
    "--no-mpi-threads-disable": ([], "env", {"HOROVOD_MPI_THREADS_DISABLE": OFF}),
    "--mpi-args": (["--map-by ppr:6:node"], "args", ["--map-by", "ppr:6:node"]),
    "--tcp": ([], "env", {"NCCL_IB_DISABLE": ON}),
    "--binding-args": (["--bind-to core"], "args", ["--bind-to", "core"]),
    "--num-nccl-streams": (["2"], "warned", ("current stream", {"HOROVOD_NUM_NCCL_STREAMS": "2"})),
    "--thread-affinity": (["1"], "warned", ("--binding-args", {"HOROVOD_THREAD_AFFINITY": "1"})),
    "--gloo-timeout-seconds": (["60"], "warned", ("not Gloo", {"HOROVOD_GLOO_TIMEOUT_SECONDS": "60"})),
    "--log-level": (["INFO"], "env", {"HORO_LOG_LEVEL": "INFO", "HOROVOD_LOG_LEVEL": "INFO"}),
    "--log-with-timestamp": ([], "env", {"HORO_LOG_HIDE_TIME": OFF}),
    "--log-without-timestamp": ([], "env", {"HORO_LOG_HIDE_TIME": ON}),
    "--log-hide-timestamp": ([], "env", {"HORO_LOG_HIDE_TIME": ON}),
    "--no-log-hide-timestamp": ([], "env", {"HORO_LOG_HIDE_TIME": OFF}),
    "-prefix-timestamp": ([], "ns", ("prefix_output_with_timestamp", ON)),
    "--prefix-output-with-timestamp": ([], "ns", ("prefix_output_with_timestamp", ON)),
    "-H": (["a:2,b:2"], "ns", ("hosts", "a:2,b:2")),
    "--hosts": (["a:2,b:2"], "ns", ("hosts", "a:2,b:2")),
    "-hostfile": (["hosts.txt"], "ns", ("hostfile", "hosts.txt")),
    "--hostfile": (["hosts.txt"], "ns", ("hostfile", "hosts.txt")),
    "--host-discovery-script": (["DISCOVERY"], "ns", ("elastic", True)),
    "--gloo": ([], "refused", "drop --gloo"),
    "--mpi": ([], "ns", ("controller", "MPI")),
    "--jsrun": ([], "refused", "-H instead of --jsrun"),
}


def test_every_flag_form_of_horovodrun_has_a_case() -> None:
    assert sorted(CASES) == sorted(f for flag in DATA["flags"] for f in flag["forms"])


@pytest.mark.parametrize("form", [f for flag in DATA["flags"] for f in flag["forms"]])
def test_the_flag_has_horovods_meaning_or_is_refused(form: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    rest, kind, want = CASES[form]
    rest = [_discovery(tmp_path) if a == "DISCOVERY" else _config(tmp_path) if a == "CONFIG" else a for a in rest]
    np_ = [] if form in ("-np", "--num-proc") else ["-np", "2"]
    argv = [*np_, form, *rest, "python", "train.py"]
    if kind == "exit0":
        with pytest.raises(SystemExit) as info:
            parse_args(argv, environ={})
        assert info.value.code == 0 and want in capsys.readouterr().out
        return
    if kind == "refused":
        with pytest.raises(UsageError) as err:
            parse_args(argv, environ={})
        assert want in str(err.value) and "\n" not in str(err.value) and "HINT" in str(err.value)
        assert main(argv) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1
        return
    ns = parse_args(argv, environ={})
    if form in ("-cb", "--check-build"):
        assert ns.check_build
        return
    eff = resolve(ns, environ={})
    err = capsys.readouterr().err
    if kind == "ns":
        assert getattr(ns, want[0]) == want[1]
    elif kind == "env":
        assert {k: eff.rank_env.get(k) for k in want} == want
    elif kind == "args":
        assert eff.launcher_args == want
    elif kind == "ssh":
        assert eff.ssh_args == want
    elif kind == "start":
        assert eff.start_timeout == want
    elif kind == "warned":
        text, env = want
        assert {k: eff.rank_env.get(k) for k in env} == env
        assert err.count("warning") == 1 and text in err, err
    if kind != "warned":
        assert "warning" not in err, err


def test_mpi_args_and_binding_args_go_to_the_mpi_launcher_before_the_command() -> None:
    eff = resolve(parse_args(["-np", "2", "--binding-args=--bind-to core", "--mpi-args", "--map-by 'ppr:2:node'",
                              "python", "t.py"], environ={}), {})
    for flavor in (OPENMPI, HYDRA):
        cmd = build_command(LaunchPlan(mpiexec="/x/mpiexec", np=2, command=["python", "t.py"], flavor=flavor,
                                       extra_args=eff.launcher_args))
        assert cmd[-6:] == ["--bind-to", "core", "--map-by", "ppr:2:node", "python", "t.py"]
    with pytest.raises(UsageError, match=r"Received: --mpi-args=\"--map-by 'ppr\".*HINT"):
        resolve(parse_args(["-np", "2", "--mpi-args", "--map-by 'ppr", "python", "t.py"], environ={}), {})


def test_a_repeated_network_interface_accumulates() -> None:
    ns = parse_args(["-np", "1", "--network-interface", "eth0", "--network-interfaces", "eth1,eth0",
                     "--network-interface", "ib0", "python", "t.py"], environ={})
    assert ns.network_interface == ["eth0", "eth1", "ib0"]
    assert resolve(ns, {}).rank_env["NCCL_SOCKET_IFNAME"] == "eth0,eth1,ib0"  # NCCL's too, as Horovod sets it
    assert "NCCL_SOCKET_IFNAME" not in resolve(ns, {"NCCL_SOCKET_IFNAME": "ib1"}).rank_env


def test_autotune_flags_without_autotune_are_accepted_and_said_to_do_nothing(
        capsys: pytest.CaptureFixture[str]) -> None:
    eff = resolve(parse_args(["-np", "1", "--autotune-warmup-samples", "2", "python", "t.py"], environ={}), {})
    assert "HORO_AUTOTUNE_WARMUP_SAMPLES" not in eff.rank_env
    assert "--autotune-warmup-samples 2 has no effect without --autotune" in capsys.readouterr().err
    # Autotune on by Horovod's variable: the flag applies (Horovod would drop it; horo does what it says).
    eff = resolve(parse_args(["-np", "1", "--autotune-warmup-samples", "2", "python", "t.py"], environ={}),
                  {"HOROVOD_AUTOTUNE": "1"})
    assert eff.rank_env["HORO_AUTOTUNE_WARMUP_SAMPLES"] == "2"


def test_the_elastic_timeout_is_the_flag_else_the_variable_else_600() -> None:
    def timeout(env: dict[str, str], *flag: str) -> float:
        return parse_args(["--min-np", "2", *flag, "python", "t.py"], environ=env).elastic_timeout

    assert timeout({}) == 600
    assert timeout({"HOROVOD_ELASTIC_TIMEOUT": "42"}) == 42
    assert timeout({"HOROVOD_ELASTIC_TIMEOUT": "42", "HORO_ELASTIC_TIMEOUT": "43"}) == 43
    assert timeout({"HORO_ELASTIC_TIMEOUT": "43"}, "--elastic-timeout", "44") == 44
    with pytest.raises(UsageError, match="Received: HOROVOD_ELASTIC_TIMEOUT='soon'.*HINT"):
        timeout({"HOROVOD_ELASTIC_TIMEOUT": "soon"})


def test_config_file_keys_flags_win_and_bad_values_are_named(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "horovod.yaml"
    path.write_text(textwrap.dedent("""\
        controller: mpi
        params:
          fusion_threshold_mb: 32
          cycle_time_ms: 10
          hierarchical_allreduce: true
        autotune:
          enabled: true
          warmup_samples: 5
        timeline:
          filename: tl.json
          mark_cycles: true
        stall_check:
          enabled: false
          warning_time_seconds: 120
        library_options:
          num_nccl_streams: 2
        logging:
          level: DEBUG
          with_timestamp: false
          hide_timestamp: true
        """))
    ns = parse_args(["-np", "2", "--config-file", str(path), "--cycle-time-ms", "3", "python", "t.py"], environ={})
    eff = resolve(ns, {})
    env = eff.rank_env
    assert env["HORO_FUSION_THRESHOLD"] == str(32 << 20) and env["HORO_CYCLE_TIME"] == "3"  # the flag wins
    assert env["HORO_HIERARCHICAL_ALLREDUCE"] == "1" and env["HORO_AUTOTUNE"] == "1"
    assert env["HORO_AUTOTUNE_WARMUP_SAMPLES"] == "5" and env["HORO_TIMELINE"] == os.path.abspath("tl.json")
    assert env["HORO_TIMELINE_MARK_CYCLES"] == "1" and env["HORO_STALL_CHECK_DISABLE"] == "1"
    assert env["HORO_STALL_CHECK_TIME_SECONDS"] == "120" and env["HORO_LOG_LEVEL"] == "DEBUG"
    assert env["HORO_LOG_HIDE_TIME"] == "1" and env["HOROVOD_NUM_NCCL_STREAMS"] == "2"
    err = capsys.readouterr().err
    assert "logging.hide_timestamp is not a key of Horovod's config file" in err
    assert "num_nccl_streams: 2 is ignored" in err
    path.write_text("controller: gloo\n")
    with pytest.raises(UsageError, match=r"controller=GLOO cannot apply: horo runs on MPI.*HINT"):
        parse_args(["-np", "2", "--config-file", str(path), "python", "t.py"], environ={})
    path.write_text("params:\n  cycle_time_ms: fast\n")
    with pytest.raises(UsageError, match=r"Received: params.cycle_time_ms='fast'.*HINT"):
        parse_args(["-np", "2", "--config-file", str(path), "python", "t.py"], environ={})
    with pytest.raises(UsageError, match=r"Received: --config-file='/nonexistent.yaml'.*HINT"):
        parse_args(["-np", "2", "--config-file", "/nonexistent.yaml", "python", "t.py"], environ={})


def test_verbose_names_each_settings_source(tmp_path: Path) -> None:
    path = tmp_path / "horovod.yaml"
    path.write_text("params:\n  cache_capacity: 99\n")
    env = {"HORO_STALL_CHECK_TIME_SECONDS": "30", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "50"}
    eff = resolve(parse_args(["-np", "2", "--config-file", str(path), "--fusion-threshold-mb", "4", "python", "t.py"],
                             environ=env), env)
    lines = []
    print_settings(eff, stream=type("S", (), {"write": lambda self, t: lines.append(t), "flush": lambda self: None})())
    text = "".join(lines)
    assert "HORO_FUSION_THRESHOLD=4194304  (--fusion-threshold-mb 4)" in text
    assert f"HORO_CACHE_CAPACITY=99  (config file {path}: params.cache_capacity: 99)" in text
    assert "HORO_STALL_CHECK_TIME_SECONDS=30  (HORO_STALL_CHECK_TIME_SECONDS)" in text
    assert "HORO_STALL_SHUTDOWN_TIME_SECONDS=50  (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)" in text
    assert "HORO_CYCLE_TIME=50  (default)" in text


def test_a_variable_the_ranks_would_refuse_is_refused_before_the_launch() -> None:
    ns = parse_args(["-np", "2", "python", "t.py"], environ={})
    with pytest.raises(UsageError, match=r"Received: HOROVOD_FUSION_THRESHOLD='64MB'.*HINT"):
        resolve(ns, {"HOROVOD_FUSION_THRESHOLD": "64MB"})
    with pytest.raises(UsageError, match=r"Received: HORO_LOG_LEVEL='LOUD'.*HINT"):
        resolve(ns, {"HORO_LOG_LEVEL": "LOUD"})


def test_horovodrun_is_installed_as_the_same_program(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["horovodrun"] == scripts["hororun"] == "horo.run:main"
    monkeypatch.setattr(sys, "argv", ["/venv/bin/horovodrun"])
    assert main(["--bogus"]) == 2
    assert capsys.readouterr().err.startswith("horovodrun: error: unrecognized horovodrun option")


# --------------------------------------------------------------------------- every HOROVOD_ variable


@pytest.mark.parametrize("name", DATA["variables"] + DATA["build_variables"] + ["HOROVOD_FUSION_THRESHOLDS"])
def test_every_horovod_variable_is_honoured_or_warned_about_once(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    value = {"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "ccl", "HOROVOD_GPU_OPERATIONS": "MPI",
             "HOROVOD_LOG_LEVEL": "INFO", "HOROVOD_TIMELINE": "/data/tl.json"}.get(name, "2")
    env = {name: value}
    warned = dict(unsupported(env))
    # Honoured: read under horo's name, or what horo always does (2 is on: horo has no NVTX ranges to turn
    # off, and always allows dynamic process sets).
    honoured = cfg.horo_name(name) is not None or name in ("HOROVOD_DISABLE_NVTX_RANGES",
                                                            "HOROVOD_DYNAMIC_PROCESS_SETS")
    assert honoured != (name in warned), f"{name}: honoured={honoured}, warned={warned}"
    for _ in range(2):
        check_environment(env)
        cfg.resolve_aliases(env)
    err = capsys.readouterr().err
    assert err.count(f"horo: warning: {name}=") == (0 if honoured else 1), err
    target = cfg.horo_name(name)
    if target is not None:  # an on/off variable is read as Horovod reads it: 2 is on
        read = "1" if by_horovod(name).kind == "bool" else value  # type: ignore[union-attr]
        assert cfg.apply_aliases(dict(env)) == {target: read}


def test_values_horo_honours_are_not_warned_about() -> None:
    env = {"HOROVOD_CONTROLLER": "mpi", "HOROVOD_CPU_OPERATIONS": "MPI", "HOROVOD_DYNAMIC_PROCESS_SETS": "1",
           "HOROVOD_TORUS_ALLREDUCE": "0", "HOROVOD_MPI_THREADS_DISABLE": "0", "HOROVOD_RANK": "3",
           "HOROVOD_HOSTNAME": "node1"}
    assert unsupported(env) == []


def test_no_warning_in_a_rank_whose_launcher_gave_them(capsys: pytest.CaptureFixture[str]) -> None:
    check_environment({"HOROVOD_NUM_NCCL_STREAMS": "2", cfg.CHECKED: "1"})
    assert capsys.readouterr().err == ""


def test_horovods_on_off_variables_are_read_as_horovod_reads_them(capsys: pytest.CaptureFixture[str]) -> None:
    got = cfg.read_env({"HOROVOD_HIERARCHICAL_ALLREDUCE": "true", "HOROVOD_HIERARCHICAL_ALLGATHER": "1"})
    assert got["HORO_HIERARCHICAL_ALLREDUCE"] == 0.0 and got["HORO_HIERARCHICAL_ALLGATHER"] == 1.0
    err = capsys.readouterr().err
    assert "HOROVOD_HIERARCHICAL_ALLREDUCE='true' is read as 0, as Horovod reads it" in err and "HINT" in err
    assert cfg.read_env({"HORO_HIERARCHICAL_ALLREDUCE": "true"})["HORO_HIERARCHICAL_ALLREDUCE"] == 1.0


def test_stall_check_disable_turns_warning_and_shutdown_off() -> None:
    got = cfg.read_env({"HOROVOD_STALL_CHECK_DISABLE": "1", "HORO_STALL_SHUTDOWN_TIME_SECONDS": "30"})
    assert got["HORO_STALL_CHECK_TIME_SECONDS"] == math.inf and got["HORO_STALL_SHUTDOWN_TIME_SECONDS"] == 0.0
    assert cfg.read_env({"HOROVOD_STALL_CHECK_DISABLE": "0"})["HORO_STALL_CHECK_TIME_SECONDS"] == 60.0


def test_log_level_and_hidden_time_on_the_horo_logger(monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    logger = logging.getLogger("horo")
    monkeypatch.setattr(logger, "level", logger.level)
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))
    monkeypatch.setattr(logger, "propagate", logger.propagate)
    configure_logging({"HORO_LOG_LEVEL": "trace", "HORO_LOG_HIDE_TIME": "1"})
    assert logger.level == logging.DEBUG
    assert "asctime" not in logger.handlers[-1].formatter._fmt  # type: ignore[union-attr]
    configure_logging({"HORO_LOG_LEVEL": "ERROR"})
    assert logger.level == logging.ERROR and "asctime" in logger.handlers[-1].formatter._fmt  # type: ignore[union-attr]
    with pytest.raises(ValueError, match=r"Received: HOROVOD_LOG_LEVEL='LOUD'.*HINT"):
        configure_logging({"HORO_LOG_LEVEL": "LOUD", "HOROVOD_LOG_LEVEL": "LOUD"})


# --------------------------------------------------------------------------- output files


def test_rank_folders_are_padded_as_horovods() -> None:
    assert rank_folder("d", 0, 1) == os.path.join("d", "rank.0")
    assert [os.path.basename(rank_folder("d", r, 11)) for r in (0, 10)] == ["rank.00", "rank.10"]
    assert rank_folder("d", 0, 3, job=2) == os.path.join("d", "job.2", "rank.0")


def test_tagged_lines_go_to_each_ranks_files(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    out = Output(str(tmp_path), size=2, keep_tags=False, mark="m0")
    out.stdout(b"[1,1]<stdout>: hello\n")
    out.stderr(b"[1,0]<stderr>: oops\n")
    out.stderr(b"[1,1]<stderr>: m0 1\n")  # the start mark: counted, never shown
    out.close()
    assert (tmp_path / "rank.1" / "stdout").read_bytes() == b"hello\n"
    assert (tmp_path / "rank.0" / "stderr").read_bytes() == b"oops\n"
    assert (tmp_path / "rank.0" / "stdout").read_bytes() == b""
    assert out.started == {1}
    seen = capfd.readouterr()
    assert seen.out == "hello\n" and seen.err == "oops\n"
    stamped = Output(timestamp=True)  # --prefix-output-with-timestamp, with the tag kept (--tag-output)
    stamped.stdout(b"[1,0]<stdout>: hi\n")
    assert re.fullmatch(r"\[\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}\] \[1,0\]<stdout>: hi\n", capfd.readouterr().out)


# --------------------------------------------------------------------------- real jobs


def _hororun(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``hororun ARGS`` with only ``env`` of Horovod's and horo's variables, killed as a group on a hang."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(("HORO_", "HOROVOD_"))}
    full.update(OMP_NUM_THREADS="1", **(env or {}))
    cmd = [sys.executable, "-m", "horo.run", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full, cwd=cwd,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=JOB_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"hororun {args} hung for {JOB_TIMEOUT:.0f}s:\n{out}\n{err}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # nothing of the job may outlive it
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _reports(out: str) -> list[dict[str, Any]]:
    found = [json.loads(ln.split("REPORT ", 1)[1]) for ln in out.splitlines() if "REPORT " in ln]
    return sorted(found, key=lambda r: r["rank"])


@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_a_horovod_launch_line_at_two_ranks(tmp_path: Path) -> None:
    config = tmp_path / "horovod.yaml"
    config.write_text("params:\n  fusion_threshold_mb: 2\n")
    env = {"HOROVOD_CACHE_CAPACITY": "512", "HORO_STALL_CHECK_TIME_SECONDS": "30", "HOROVOD_NUM_NCCL_STREAMS": "2"}
    res = _hororun(["-np", "2", "--verbose", "--config-file", str(config), "--cycle-time-ms", "5",
                    "--mpi-args=-x LAUNCH_LINE_MPI_ARG=reached", "--output-filename", "logs",
                    "--timeline-filename", "tl.json", "--timeline-mark-cycles", sys.executable, str(JOB)],
                   tmp_path, env)
    assert res.returncode == 0, res.stdout + res.stderr
    events = json.loads((tmp_path / "tl.json").read_text())
    assert any(e["name"] == "CYCLE_START" for e in events) and any(e["name"] == "ALLREDUCE" for e in events)
    reports = _reports(res.stdout)
    assert [r["rank"] for r in reports] == [0, 1]
    for r in reports:
        assert r["config"] == {"HORO_FUSION_THRESHOLD": 2 << 20, "HORO_CYCLE_TIME": 5.0, "HORO_CACHE_CAPACITY": 512,
                               "HORO_STALL_CHECK_TIME_SECONDS": 30.0}
        assert r["mpi_args_var"] == "reached"  # --mpi-args reached the MPI launcher, which set it
        rank, want = str(r["rank"]), {"HOROVOD_RANK": str(r["rank"]), "HOROVOD_SIZE": "2",
                                      "HOROVOD_LOCAL_RANK": str(r["local_rank"]), "HOROVOD_LOCAL_SIZE": "2",
                                      "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1"}
        assert {k: r["before"][k] for k in want} == want and {k: r["after"][k] for k in want} == want
        assert r["after"]["HOROVOD_HOSTNAME"] == r["before"]["HOROVOD_HOSTNAME"] and r["before"]["HOROVOD_HOSTNAME"]
        # Horovod's layout: logs/rank.N/stdout and stderr, and the console still gets every line, untagged.
        assert f"REPORT {{\"rank\": {rank}," in (tmp_path / "logs" / f"rank.{rank}" / "stdout").read_text()
        assert (tmp_path / "logs" / f"rank.{rank}" / "stderr").read_text().strip().endswith(f"ERRLINE from rank {rank}")
        assert f"ERRLINE from rank {rank}" in res.stderr
    assert not re.search(r"^\[\d+,\d+\]<", res.stdout, re.M)
    # --verbose: each setting with its source; the warning once, for the whole job.
    for line in ("HORO_FUSION_THRESHOLD=2097152  (config file ", "HORO_CYCLE_TIME=5  (--cycle-time-ms 5)",
                 "HORO_CACHE_CAPACITY=512  (HOROVOD_CACHE_CAPACITY)", "HORO_BUCKET_BYTES=26214400  (default)",
                 "HORO_STALL_CHECK_TIME_SECONDS=30  (HORO_STALL_CHECK_TIME_SECONDS)"):
        assert line in res.stderr, res.stderr
    assert res.stderr.count("HOROVOD_NUM_NCCL_STREAMS='2' is ignored") == 1, res.stderr


@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_horovods_rank_variables_at_one_rank_and_a_dynamic_timeline(tmp_path: Path) -> None:
    # HOROVOD_TIMELINE=DYNAMIC (Horovod's): no timeline, and no file named DYNAMIC, until start_timeline().
    env = {"HOROVOD_TIMELINE": "DYNAMIC", "LAUNCH_LINE_TIMELINE": str(tmp_path / "later.json")}
    res = _hororun(["-np", "1", sys.executable, str(JOB)], tmp_path, env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert not (tmp_path / "DYNAMIC").exists()
    events = json.loads((tmp_path / "later.json").read_text())
    assert any(e["name"] == "CYCLE_START" for e in events) and any(e["name"] == "ALLREDUCE" for e in events)
    (r,) = _reports(res.stdout)
    want = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1",
            "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1"}
    assert {k: r["after"][k] for k in want} == want == {k: r["before"][k] for k in want}


@pytest.mark.timeout(JOB_TIMEOUT + 30)
def test_start_timeout_ends_a_job_whose_ranks_do_not_start(tmp_path: Path) -> None:
    res = _hororun(["-np", "2", "--start-timeout", "30", sys.executable, "-c", "print('RAN')"], tmp_path)
    assert res.returncode == 0 and res.stdout.count("RAN") == 2, res.stdout + res.stderr
    # `sleep` runs no Python, so no rank ever announces itself: the job ends long before sleep would.
    res = _hororun(["-np", "2", "sleep", "600"], tmp_path, {"HOROVOD_START_TIMEOUT": "2"})
    assert res.returncode == 1
    assert "ranks 0, 1 had not started 2 s after the launch" in res.stderr and "HINT" in res.stderr


@pytest.mark.timeout(JOB_TIMEOUT + 30)
@pytest.mark.parametrize("launcher", ["openmpi", "hydra"])
def test_ssh_port_and_identity_reach_the_program_that_starts_the_daemons(tmp_path: Path, launcher: str) -> None:
    mpiexec = ["--mpiexec", str(ROOT / ".venv-mpich" / "bin" / "mpiexec")] if launcher == "hydra" else []
    if mpiexec and not Path(mpiexec[1]).exists():
        pytest.skip("no MPICH venv (.venv-mpich: make test builds it)")
    # A stand-in for ssh that notes how the MPI launcher calls it, and fails: no daemon starts on "otherhost".
    log = tmp_path / "agent.log"
    agent = tmp_path / "agent"
    agent.write_text(f'#!/bin/sh\necho "$@" >> {log}\nexit 1\n')
    agent.chmod(0o755)
    res = _hororun([*mpiexec, "-np", "1", "-H", "otherhost:1", "--ssh-command", str(agent), "-p", "2222", "-i",
                    "/keys/id", sys.executable, "-c", "pass"], tmp_path)
    assert res.returncode != 0
    assert log.read_text().startswith("-p 2222 -i /keys/id "), log.read_text()


def test_version_flag_prints_the_version() -> None:
    out = subprocess.run([sys.executable, "-m", "horo.run", "-v"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == horo.__version__
