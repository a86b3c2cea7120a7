"""Every setting of horo, declared once: flags, Horovod config-file key, variables, unit, default, reader.

``hororun``/``horovodrun``'s argument groups, the ``HOROVOD_*`` -> ``HORO_*`` aliases (``config``), the
``--config-file`` reader, ``--verbose``'s list of effective values, and the tables of docs/configuration.md and
docs/api/launcher.md all come from :data:`SETTINGS`. Horovod 0.28.1's flags, config keys and variables are its
launch.py, config_parser.py, common.h and env_parser.cc; its units are kept (MB and ms on the launch line).
"""

from __future__ import annotations

from .setting import Setting
from .settings_launch import LAUNCH
from .settings_vars import VARIABLES

__all__ = ["ALIASES", "BUILD_VARIABLES", "SETTINGS", "by_horovod", "by_var"]

_B = "bool"

#: The tuning knobs, timeline, stall check, autotune and logging: each a variable of the ranks' (mostly
#: agreed at init()), a Horovod variable of the same meaning, and, where Horovod has them, flags and a key.
_TUNING: tuple[Setting, ...] = (
    # --- tuneable parameters
    # Bytes: on host memory the copies cost more than fusion saves above ~1 MiB (docs/design-engine.md has the
    # measurements), so horo's default is far below Horovod's 128 MiB.
    Setting("fusion_threshold_mb", "params", "host tensors smaller than this are packed together (engine, "
            "grouped ops); GPU tensors follow `HORO_NCCL_FUSION_THRESHOLD`. Horovod's one threshold, for both, "
            "is 128 MiB; horo's is smaller: see [the engine's design](design-engine.md)",
            var="HORO_FUSION_THRESHOLD", horovod="HOROVOD_FUSION_THRESHOLD", flags=("--fusion-threshold-mb",),
            key="params.fusion_threshold_mb", kind="int", unit="MB", default="1048576", reader="the engine",
            agreed=True, topic="engine", metavar="MB"),
    # A parked rank wakes at once on its own submission, which any pending op needs anyway, so a long tick
    # costs no latency; it only sets how often idle ranks report to the stall inspector, and keeps idle CPU
    # near zero.
    Setting("cycle_time_ms", "params", "ms between engine rounds while a rank has nothing pending (a rank "
            "wakes at once on its own submission, so a longer tick costs no latency); at least 10 across hosts. "
            "Horovod's cycle (1 ms) paces every round instead",
            var="HORO_CYCLE_TIME", horovod="HOROVOD_CYCLE_TIME", flags=("--cycle-time-ms",),
            key="params.cycle_time_ms", kind="float", unit="ms", default="50", reader="the engine", agreed=True,
            topic="engine", metavar="MS"),
    Setting("cache_capacity", "params", "names kept in the response cache (0: off)",
            var="HORO_CACHE_CAPACITY", horovod="HOROVOD_CACHE_CAPACITY", flags=("--cache-capacity",),
            key="params.cache_capacity", kind="int", default="1024", reader="the engine", agreed=True,
            topic="engine", metavar="N"),
    Setting("hierarchical_allreduce", "params", "1: reduce within each host, allreduce across one rank per host, "
            "broadcast within the host (NCCL within a host and MPI across for GPU tensors). Pays where the "
            "MPI's own allreduce does not know the hosts; Open MPI 5's default already does this",
            var="HORO_HIERARCHICAL_ALLREDUCE", horovod="HOROVOD_HIERARCHICAL_ALLREDUCE",
            consts=(("--hierarchical-allreduce", "1"), ("--no-hierarchical-allreduce", "0")),
            key="params.hierarchical_allreduce", kind=_B, default="0", reader="the engine, the NCCL backend",
            agreed=True, topic="engine"),
    Setting("hierarchical_allgather", "params", "1: the same scheme for allgather",
            var="HORO_HIERARCHICAL_ALLGATHER", horovod="HOROVOD_HIERARCHICAL_ALLGATHER",
            consts=(("--hierarchical-allgather", "1"), ("--no-hierarchical-allgather", "0")),
            key="params.hierarchical_allgather", kind=_B, default="0", reader="the engine", agreed=True,
            topic="engine"),
    Setting("torus_allreduce", "params", "Horovod's 2D NCCL torus allreduce", horovod="HOROVOD_TORUS_ALLREDUCE",
            consts=(("--torus-allreduce", "1"), ("--no-torus-allreduce", "0")), key="params.torus_allreduce",
            kind=_B, fixed="0", refuse=True,
            why="horo has no torus allreduce; --hierarchical-allreduce runs NCCL within each host and MPI across"),
    # --- autotune
    Setting("autotune", "autotune", "tune the engine's knobs while training (needs horo-mpi[autotune]); see "
            "[Autotune](autotune.md)", var="HORO_AUTOTUNE", horovod="HOROVOD_AUTOTUNE",
            consts=(("--autotune", "1"), ("--no-autotune", "0")), key="autotune.enabled", kind=_B, default="0",
            reader="the engine (rank 0 tunes, every rank follows)", topic="timeline"),
    Setting("autotune_log_file", "autotune", "CSV of every trial, written by rank 0", var="HORO_AUTOTUNE_LOG",
            horovod="HOROVOD_AUTOTUNE_LOG", flags=("--autotune-log-file",), key="autotune.log_file", kind="path",
            reader="autotune", topic="timeline", metavar="FILE", autotune_only=True),
    Setting("autotune_warmup_samples", "autotune", "samples discarded after each change of setting",
            var="HORO_AUTOTUNE_WARMUP_SAMPLES", horovod="HOROVOD_AUTOTUNE_WARMUP_SAMPLES",
            flags=("--autotune-warmup-samples",), key="autotune.warmup_samples", kind="int", default="3",
            reader="autotune", topic="timeline", metavar="N", autotune_only=True),
    Setting("autotune_steps_per_sample", "autotune", "steps per scored sample",
            var="HORO_AUTOTUNE_STEPS_PER_SAMPLE", horovod="HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE",
            flags=("--autotune-steps-per-sample",), key="autotune.steps_per_sample", kind="int", default="10",
            reader="autotune", topic="timeline", metavar="N", autotune_only=True),
    Setting("autotune_bayes_opt_max_samples", "autotune", "trials of the Bayesian search before the best "
            "setting is kept", var="HORO_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
            horovod="HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", flags=("--autotune-bayes-opt-max-samples",),
            key="autotune.bayes_opt_max_samples", kind="int", default="20", reader="autotune", topic="timeline",
            metavar="N", autotune_only=True),
    Setting("autotune_gaussian_process_noise", "autotune", "noise level of the Gaussian process, in [0, 1]",
            var="HORO_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", horovod="HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
            flags=("--autotune-gaussian-process-noise",), key="autotune.gaussian_process_noise", kind="float",
            default="0.8", reader="autotune", topic="timeline", metavar="X", autotune_only=True),
    Setting("autotune_cache", "autotune", "reuse the setting an earlier run of the same job tuned, and save new "
            "ones (horo's)", var="HORO_AUTOTUNE_CACHE", horovod="HOROVOD_AUTOTUNE_CACHE",
            flags=("--autotune-cache",), kind="path", reader="autotune", topic="timeline", metavar="FILE",
            autotune_only=True),
    # --- timeline
    Setting("timeline", "timeline", "write a Chrome-trace timeline (rank 0) to this path; `DYNAMIC`: none at "
            "start, `start_timeline()` starts one; see [Timeline](timeline.md)", var="HORO_TIMELINE",
            horovod="HOROVOD_TIMELINE", flags=("--timeline-filename",), key="timeline.filename", kind="path",
            reader="init(), rank 0", topic="timeline", metavar="FILE"),
    Setting("timeline_mark_cycles", "timeline", "1: mark each engine round as a `CYCLE_START` instant event on "
            "the timeline", var="HORO_TIMELINE_MARK_CYCLES", horovod="HOROVOD_TIMELINE_MARK_CYCLES",
            consts=(("--timeline-mark-cycles", "1"), ("--no-timeline-mark-cycles", "0")),
            key="timeline.mark_cycles", kind=_B, default="0", reader="init(), the timeline", topic="timeline"),
    # --- stall check
    Setting("no_stall_check", "stall_check", "1: no stall warnings and no stall shutdown (Horovod's stall "
            "check off)", var="HORO_STALL_CHECK_DISABLE", horovod="HOROVOD_STALL_CHECK_DISABLE",
            consts=(("--no-stall-check", "1"), ("--stall-check", "0")), key="!stall_check.enabled", kind=_B,
            default="0", reader="the engine, the watchdog", agreed=True, topic="failures"),
    Setting("stall_check_warning_time_seconds", "stall_check", "warn, naming the missing ranks and tensors, when "
            "some ranks wait this long for others", var="HORO_STALL_CHECK_TIME_SECONDS",
            horovod="HOROVOD_STALL_CHECK_TIME_SECONDS", flags=("--stall-check-warning-time-seconds",),
            key="stall_check.warning_time_seconds", kind="float", default="60", reader="the engine", agreed=True,
            topic="failures", metavar="SEC"),
    # 0 (Horovod's default): a legitimately long wait (one rank evaluating while the others wait in an
    # allreduce) must not kill a job unless the user set a limit.
    Setting("stall_check_shutdown_time_seconds", "stall_check", "raise `StallError` on every rank after this "
            "long; a rank blocked this long inside one MPI call exits 1 with an error naming the call (0: off)",
            var="HORO_STALL_SHUTDOWN_TIME_SECONDS", horovod="HOROVOD_STALL_SHUTDOWN_TIME_SECONDS",
            flags=("--stall-check-shutdown-time-seconds",), key="stall_check.shutdown_time_seconds",
            kind="float", default="0", reader="the engine, the watchdog", agreed=True, topic="failures",
            metavar="SEC"),
    # --- logging
    Setting("log_level", "logging", "the least severe of horo's log records printed to stderr (`TRACE` is "
            "`DEBUG`)", var="HORO_LOG_LEVEL", horovod="HOROVOD_LOG_LEVEL", flags=("--log-level",),
            key="logging.level", kind="choice", default="WARNING", reader="init(): the `horo` logger",
            choices=("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"), topic="timeline", metavar="LEVEL"),
    Setting("log_hide_time", "logging", "1: horo's log records without a time stamp",
            var="HORO_LOG_HIDE_TIME", horovod="HOROVOD_LOG_HIDE_TIME",
            consts=(("--log-without-timestamp", "1"), ("--log-hide-timestamp", "1"), ("--log-with-timestamp", "0"),
                    ("--no-log-hide-timestamp", "0")), key="!logging.with_timestamp", kind=_B, default="0",
            reader="init(): the `horo` logger", topic="timeline"),
)

#: Every setting, in ``--help``'s order.
SETTINGS: tuple[Setting, ...] = LAUNCH + _TUNING + VARIABLES

#: Horovod build options (its setup.py and CMake): read when Horovod is compiled, never by a job.
BUILD_VARIABLES: tuple[str, ...] = (
    "HOROVOD_ALLOW_MIXED_GPU_IMPL", "HOROVOD_BUILD_ARCH_FLAGS", "HOROVOD_BUILD_CUDA_CC_LIST", "HOROVOD_CMAKE",
    "HOROVOD_CUDA_HOME", "HOROVOD_DEBUG", "HOROVOD_GPU", "HOROVOD_GPU_ALLGATHER", "HOROVOD_GPU_ALLREDUCE",
    "HOROVOD_GPU_ALLTOALL", "HOROVOD_GPU_BROADCAST", "HOROVOD_GPU_REDUCESCATTER", "HOROVOD_LOCAL_VERSION",
    "HOROVOD_NCCL_HOME", "HOROVOD_NCCL_INCLUDE", "HOROVOD_NCCL_LIB", "HOROVOD_NCCL_LINK", "HOROVOD_NVTX_INCLUDE",
    "HOROVOD_ROCM_HOME", "HOROVOD_SKIP_COMPILE", "HOROVOD_WITH_GLOO", "HOROVOD_WITH_MPI", "HOROVOD_WITH_MXNET",
    "HOROVOD_WITH_NVTX", "HOROVOD_WITH_PYTORCH", "HOROVOD_WITH_TENSORFLOW", "HOROVOD_WITHOUT_GLOO",
    "HOROVOD_WITHOUT_MPI", "HOROVOD_WITHOUT_MXNET", "HOROVOD_WITHOUT_NVTX", "HOROVOD_WITHOUT_PYTORCH",
    "HOROVOD_WITHOUT_TENSORFLOW",
)

_BY_HOROVOD = {s.horovod: s for s in SETTINGS if s.horovod}
_BY_VAR = {s.var: s for s in SETTINGS if s.var}
#: Horovod's name -> horo's, where both name the same variable (same units; docs/configuration.md says where
#: horo's default or scope differs).
ALIASES: dict[str, str] = {s.horovod: s.var for s in SETTINGS if s.horovod and s.var and s.var.startswith("HORO_")}


def by_horovod(name: str) -> Setting | None:
    """The setting Horovod's variable ``name`` belongs to, if any."""
    return _BY_HOROVOD.get(name)


def by_var(name: str) -> Setting | None:
    """The setting whose variable (``HORO_...``) is ``name``, if any."""
    return _BY_VAR.get(name)
