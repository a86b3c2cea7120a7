"""The settings of the launch itself (part of ``settings``' table): hosts, processes, ssh, the MPI launcher's
arguments, output, elastic mode, and the library options and controller of Horovod's launch line."""

from __future__ import annotations

from .setting import Setting

__all__ = ["LAUNCH"]

_GLOO = "horo runs on MPI, not Gloo"

LAUNCH: tuple[Setting, ...] = (
    # --- general
    Setting("version", "general", "print the version and exit", flags=("-v", "--version"), kind="switch"),
    Setting("np", "general", "number of processes (ranks); in elastic mode, the number to start with",
            flags=("-np", "-n", "--num-proc"), kind="int", metavar="N"),
    Setting("check_build", "general", "print the frameworks and backends horo can use, then exit",
            flags=("-cb", "--check-build"), kind="switch"),
    Setting("disable_cache", "general", "accepted: hororun keeps no cache of start-up checks",
            flags=("--disable-cache",), kind="switch"),
    Setting("start_timeout", "general", "seconds for every rank's Python to start (mpiexec starting the "
            "processes, on every host); past it hororun ends the job, naming the ranks missing. Unset: no limit "
            "(Horovod's 30 s bound its own ssh checks, which hororun does not make)", var="HORO_START_TIMEOUT",
            horovod="HOROVOD_START_TIMEOUT", flags=("--start-timeout",), kind="float", reader="hororun",
            topic="launching", metavar="SEC"),
    Setting("network_interface", "general", "network interfaces MPI, the launcher's control traffic and NCCL "
            "(NCCL_SOCKET_IFNAME, unless set) use; comma-separated or repeated (hydra takes one)",
            flags=("--network-interfaces", "--network-interface"), kind="list", metavar="IFACE[,IFACE]"),
    Setting("output_filename", "general", "also write each rank's output to DIR/rank.N/stdout and "
            "DIR/rank.N/stderr (N zero-padded to the width of the largest rank)", flags=("--output-filename",),
            kind="path", metavar="DIR"),
    Setting("verbose", "general", "print the effective settings with their sources and the exact mpiexec "
            "command line, and let the frameworks' start-up banners through", flags=("--verbose",), kind="switch"),
    Setting("config_file", "general", "Horovod's YAML file of settings (read with PyYAML: pip install pyyaml); "
            "flags on the command line win over it",
            flags=("--config-file",), kind="path", metavar="FILE"),
    Setting("mpiexec", "general", "the `mpiexec` hororun drives; default: the one next to the Python, else "
            "`mpiexec` on `PATH`", var="HORO_MPIEXEC", flags=("--mpiexec",), kind="path", reader="hororun",
            topic="launching", metavar="PATH"),
    # --- SSH
    Setting("ssh_port", "ssh", "ssh port on every host (given to the MPI launcher's ssh)",
            flags=("-p", "--ssh-port"), kind="int", metavar="PORT"),
    Setting("ssh_identity_file", "ssh", "the private key the MPI launcher's ssh uses",
            flags=("-i", "--ssh-identity-file"), kind="path", metavar="FILE"),
    Setting("ssh_command", "ssh", "the program that starts remote daemons instead of ssh, called as "
            "'CMD [options] HOST COMMAND...'", var="HORO_SSH", flags=("--ssh-command",), kind="text",
            reader="hororun", topic="launching", metavar="CMD"),
    # --- elastic
    Setting("min_np", "elastic", "fewest workers to go on with; starts an elastic job (as a discovery script "
            "does)", flags=("--min-np", "--min-num-proc"), kind="int", metavar="MIN"),
    Setting("max_np", "elastic", "most workers of an elastic job (default: every slot offered)",
            flags=("--max-np", "--max-num-proc"), kind="int", metavar="MAX"),
    Setting("slots_per_host", "elastic", "slots of a discovered host printed without ':slots' (default 1)",
            flags=("--slots-per-host",), kind="int", metavar="K"),
    Setting("elastic_timeout", "elastic", "seconds an elastic job waits for --min-np slots, at the start and "
            "after a failure; also horo.spark.run_elastic's default elastic_timeout", var="HORO_ELASTIC_TIMEOUT",
            horovod="HOROVOD_ELASTIC_TIMEOUT",
            flags=("--elastic-timeout",), kind="float", default="600",
            reader="hororun's elastic driver, horo.elastic, horo.spark", topic="launching", metavar="SEC"),
    Setting("reset_limit", "elastic", "fail an elastic job after more than R resets (default: no limit)",
            flags=("--reset-limit",), kind="int", metavar="R"),
    Setting("cooldown", "elastic", "a failed host returns after a random LO..HI seconds (default: never)",
            flags=("--blacklist-cooldown-range",), kind="pair", metavar="SEC"),
    # --- library options
    Setting("mpi_threads_disable", "library", "Horovod's MPI without threads", horovod="HOROVOD_MPI_THREADS_DISABLE",
            consts=(("--mpi-threads-disable", "1"), ("--no-mpi-threads-disable", "0")),
            key="library_options.mpi_threads_disable", kind="bool", fixed="0",
            why="horo's engine thread calls MPI while the training thread does, which needs MPI_THREAD_MULTIPLE"),
    Setting("mpi_args", "library", "extra arguments for the MPI launcher (shell-split, put before the command), "
            "e.g. --mpi-args=\"--map-by ppr:2:node\"", flags=("--mpi-args",), kind="text", metavar="ARGS"),
    Setting("tcp", "library", "only TCP: NCCL_IB_DISABLE=1 for every rank (Open MPI's transports are TCP and "
            "shared memory already)", var="NCCL_IB_DISABLE", consts=(("--tcp", "1"),), kind="bool",
            reader="NCCL"),
    Setting("binding_args", "library", "process binding arguments for the MPI launcher (shell-split), e.g. "
            "--binding-args=\"--bind-to core\"; on Open MPI, what they leave unsaid is Horovod's default "
            "--bind-to none --map-by slot", flags=("--binding-args",), kind="text", metavar="ARGS"),
    Setting("num_nccl_streams", "library", "Horovod's number of NCCL streams", horovod="HOROVOD_NUM_NCCL_STREAMS",
            flags=("--num-nccl-streams",), key="library_options.num_nccl_streams", kind="int", metavar="N",
            why="horo's NCCL collectives run on the framework's current stream"),
    Setting("thread_affinity", "library", "Horovod's background thread's core", horovod="HOROVOD_THREAD_AFFINITY",
            flags=("--thread-affinity",), key="library_options.thread_affinity", kind="int", metavar="CORE",
            why="horo does not pin its engine thread; bind the ranks with --binding-args (e.g. --bind-to core)"),
    Setting("gloo_timeout_seconds", "library", "Horovod's Gloo timeout", horovod="HOROVOD_GLOO_TIMEOUT_SECONDS",
            flags=("--gloo-timeout-seconds",), key="library_options.gloo_timeout_seconds", kind="int",
            metavar="SEC", why=_GLOO),
    # --- logging (its level and time stamps are tuning settings)
    Setting("prefix_output_with_timestamp", "logging", "put the time before each line of the ranks' output",
            consts=(("-prefix-timestamp", "1"), ("--prefix-output-with-timestamp", "1")), kind="switch"),
    Setting("tag_output", "logging", "put the rank before each line of the ranks' output",
            flags=("--tag-output",), kind="switch"),
    # --- hosts
    Setting("hosts", "hosts", "hosts and slots, e.g. host1:2,host2:2 (default: this machine)",
            flags=("-H", "--hosts"), kind="text", metavar="HOST:SLOTS,..."),
    Setting("hostfile", "hosts", "file with one 'host slots=N' (or 'host:N') per line",
            flags=("-hostfile", "--hostfile"), kind="path", metavar="FILE"),
    Setting("discovery", "hosts", "executable printing 'host:slots' lines, polled about once a second; starts "
            "an elastic job", flags=("--host-discovery-script",), kind="path", metavar="SCRIPT"),
    # --- controller
    Setting("controller", "controller", "the controller", horovod="HOROVOD_CONTROLLER",
            consts=(("--gloo", "GLOO"), ("--mpi", "MPI"), ("--jsrun", "JSRUN")), key="controller", kind="choice",
            fixed="MPI", refuse=True, why="horo runs on MPI, which hororun starts (elastic jobs too, over ULFM): "
            "drop --gloo; under LSF give the hosts with -H instead of --jsrun"),
)
