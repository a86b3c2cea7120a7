"""The settings only a variable sets (part of ``settings``' table): horo's own knobs without a flag, Horovod's
runtime variables without one, and the variables horo sets for each rank, as Horovod's launcher does."""

from __future__ import annotations

from .setting import Setting

__all__ = ["VARIABLES"]

_V = "variables"
_GLOO = "horo runs on MPI, not Gloo"
_SPARK = "set by Horovod's Spark runner for its own tasks; horo.spark starts its tasks itself"

_HORO: tuple[Setting, ...] = (
    # Cache-sized pieces run a 64 MiB allreduce several times faster than one call, while a single call stays
    # faster up to a few MiB (docs/design-engine.md, "One call or pieces for mid-size allreduces").
    Setting("chunk_bytes", _V, "bytes per MPI call for allreduces larger than 8x this", var="HORO_CHUNK_BYTES",
            kind="int", default="1048576", note="16 MiB across hosts", reader="the MPI transport", agreed=True,
            topic="engine"),
    # From this size horo's ring (ring.py) beats MPI's copying out-of-place Allreduce (docs/design-engine.md,
    # "Out-of-place allreduces: horo's own ring").
    Setting("ring_min_bytes", _V, "out-of-place allreduces from this size go round horo's own ring instead of "
            "MPI's out-of-place `Allreduce`, which copies first; 0: never", var="HORO_RING_MIN_BYTES", kind="int",
            default="262144", note="0 across hosts", reader="the MPI transport", agreed=True, topic="engine"),
    Setting("adasum_blas", _V, "1: Adasum's arithmetic through the BLAS inside numpy's wheel (faster; see "
            "[Adasum](adasum.md))", var="HORO_ADASUM_BLAS", kind="bool", default="0", reader="Adasum",
            topic="engine"),
    # Heartbeats run in a process of each rank's own, so a long step never trips it.
    Setting("heartbeat_timeout", _V, "a peer that sends no heartbeat this long (a frozen host, a silently cut "
            "link) ends the job on every reachable rank, naming it; in an elastic job its host is dropped and "
            "the job goes on from the last commit. Heartbeats run in a small process of each rank's own: a long "
            "step never trips it. 0: off", var="HORO_HEARTBEAT_TIMEOUT_SECONDS", kind="float", default="5",
            reader="the heartbeat process", agreed=True, topic="failures"),
    Setting("abort_on_error", _V, "abort the MPI job on an uncaught exception (size > 1), so no rank waits for a "
            "dead one", var="HORO_ABORT_ON_ERROR", kind="bool", default="1", reader="init()", topic="failures"),
    Setting("nccl_fusion_threshold", _V, "fusion size for GPU tensors: device copies are cheap next to a kernel "
            "launch", var="HORO_NCCL_FUSION_THRESHOLD", kind="int", default="8388608", reader="the NCCL backend",
            agreed=True, topic="gpus"),
    Setting("gpu_operations", _V, "`NCCL`: GPU tensors go over NCCL where every rank of the set can use it, "
            "else through host memory; `MPI`: always through host memory (a build option in Horovod, a run-time "
            "switch in horo)", var="HORO_GPU_OPERATIONS", horovod="HOROVOD_GPU_OPERATIONS", kind="choice",
            choices=("NCCL", "MPI"), default="NCCL", reader="the GPU backend", topic="gpus"),
    # As DDP's Reducer sizes them: the first bucket small, so the first exchange starts early in backward.
    Setting("bucket_bytes", _V, "`horo.torch` gradient bucket size (DDP's 25 MiB); 0: one exchange per "
            "parameter. Autotune tunes it unless set by hand ([Autotune](autotune.md#the-bucket-size))",
            var="HORO_BUCKET_BYTES", kind="int", default="26214400", reader="horo.torch", agreed=True,
            topic="gpus"),
    Setting("first_bucket_bytes", _V, "the first gradient bucket's size (DDP's 1 MiB)",
            var="HORO_FIRST_BUCKET_BYTES", kind="int", default="1048576", reader="horo.torch", agreed=True,
            topic="gpus"),
    Setting("launcher", _V, "how a Lightning strategy run as plain `python` starts its ranks: `spawn` (this "
            "process is rank 0, MPI spawns the others), or `hororun` / `mpiexec` (the script runs again on every "
            "rank; always so across nodes and in a SLURM allocation)", var="HORO_LAUNCHER", kind="choice",
            choices=("spawn", "hororun", "mpiexec"), default="spawn", reader="horo.lightning", topic="launching"),
    Setting("join", _V, "processes another launcher started (torchrun, horo.ray, horo.spark) join one MPI "
            "world at init(); `0`: init() refuses instead; `ignore`: each runs as a world of one, on purpose",
            var="HORO_JOIN", default="1", reader="init()",
            topic="launching"),
    Setting("join_port", _V, "the joining's rendezvous port on `MASTER_ADDR`", var="HORO_JOIN_PORT", kind="int",
            note="`MASTER_PORT` + 1", reader="init()", topic="launching"),
    Setting("join_timeout", _V, "seconds the joining waits for every process and for the MPI job",
            var="HORO_JOIN_TIMEOUT", kind="float", default="120", reader="init()", topic="launching"),
    Setting("join_secret", _V, "the key of processes another launcher started (torchrun across hosts): the same "
            "random value, 32 characters or more, in every process's environment, never on a command line; "
            "unset on one host, local rank 0 draws one ([Keys](cluster.md#keys))", var="HORO_JOIN_SECRET",
            reader="init()", topic="launching"),
    Setting("spark_start_timeout", _V, "seconds for horo.spark's tasks to start and join one world: the default "
            "`start_timeout` of `run` and `run_elastic`", var="HORO_SPARK_START_TIMEOUT",
            horovod="HOROVOD_SPARK_START_TIMEOUT", kind="float", default="600", reader="horo.spark",
            topic="launching"),
    Setting("testbed_dir", _V, "where `python -m horo.testbed` keeps the state of an emulated cluster (the "
            "test bed of horo's own multi-host suite)", var="HORO_TESTBED_DIR", kind="path",
            default="/run/horo-testbed", reader="horo.testbed", topic="launching"),
    # How horo.tensorflow's graph collectives wait (horo/tensorflow/kernel.py): a compiled kernel, else tf.data.
    Setting("tf_kernel", _V, "how `horo.tensorflow`'s collectives inside a graph wait: `auto` (a small TensorFlow "
            "kernel compiled on first use, else a pure-Python wait through tf.data, with one warning), "
            "`compiled` (raise if the kernel cannot be built), `python` (always tf.data)", var="HORO_TF_KERNEL",
            default="auto", reader="horo.tensorflow", topic="engine"),
    Setting("cache_dir", _V, "where `horo.tensorflow` keeps its compiled kernel, one per TensorFlow version",
            var="HORO_CACHE_DIR", kind="path", note="`$XDG_CACHE_HOME/horo`, else `~/.cache/horo`",
            reader="horo.tensorflow", topic="engine"),
    # Read only where the MPI launcher did not say (OMPI_MCA_mpi_ft_enable): hororun's elastic mode and
    # `mpiexec --with-ft ulfm` both set that variable for the ranks.
    Setting("elastic_ft", _V, "1: take this job's Open MPI as started with fault tolerance (ULFM) where "
            "`OMPI_MCA_mpi_ft_enable` is not in the ranks' environment (when it is, it decides); hororun's "
            "elastic mode and `mpiexec --with-ft ulfm` need neither", var="HORO_ELASTIC_FT",
            reader="horo.elastic", topic="failures"),
    Setting("elastic_verbose", _V, "0: no `horo.elastic:` lines on stderr (a world that shrinks, grows or "
            "restarts, a worker that leaves)", var="HORO_ELASTIC_VERBOSE", default="1", reader="horo.elastic",
            topic="timeline"),
    Setting("autotune_start", _V, "the first trial's values, e.g. `HORO_FUSION_THRESHOLD=67108864,"
            "HORO_CYCLE_TIME=5`; those knobs stay tunable ([Autotune](autotune.md))", var="HORO_AUTOTUNE_START",
            reader="autotune", topic="timeline"),
)

#: Horovod's runtime variables that no flag sets, read as Horovod reads them or warned about.
_HOROVOD: tuple[Setting, ...] = (
    Setting("cpu_operations", _V, "Horovod's host-memory collectives library", horovod="HOROVOD_CPU_OPERATIONS",
            kind="choice", fixed="MPI", why="horo's host-memory collectives are MPI's"),
    Setting("disable_group_fusion", _V, "Horovod's fusion of grouped ops", horovod="HOROVOD_DISABLE_GROUP_FUSION",
            kind="bool", why="horo fuses a group's tensors as one request; it has no switch for it"),
    Setting("enable_xla_ops", _V, "Horovod's XLA ops", horovod="HOROVOD_ENABLE_XLA_OPS", kind="bool",
            why="horo.tensorflow's collectives do not run inside XLA (jit_compile=True raises)"),
    Setting("enable_async_completion", _V, "Horovod's asynchronous GPU completion",
            horovod="HOROVOD_ENABLE_ASYNC_COMPLETION", kind="bool",
            why="horo's NCCL collectives are ordered on the framework's stream; there is nothing to complete"),
    Setting("batch_d2d_memcopies", _V, "Horovod's batched device copies", horovod="HOROVOD_BATCH_D2D_MEMCOPIES",
            kind="bool", why="horo packs GPU fusion buffers with its own kernels"),
    Setting("adasum_mpi_chunk_size", _V, "Horovod's Adasum MPI chunk", horovod="HOROVOD_ADASUM_MPI_CHUNK_SIZE",
            kind="int", why="horo's Adasum exchanges whole tensors"),
    Setting("ccl_cache", _V, "Intel oneCCL's cache", horovod="HOROVOD_CCL_CACHE", kind="bool",
            why="horo does not use oneCCL"),
    Setting("dynamic_process_sets", _V, "process sets added and removed after init()",
            horovod="HOROVOD_DYNAMIC_PROCESS_SETS", kind="bool", fixed="1",
            why="horo always allows adding and removing process sets"),
    Setting("disable_nvtx_ranges", _V, "Horovod's NVTX ranges", horovod="HOROVOD_DISABLE_NVTX_RANGES", kind="bool",
            fixed="1", why="horo emits no NVTX ranges"),
    Setting("gloo_iface", _V, "Horovod's Gloo interface", horovod="HOROVOD_GLOO_IFACE", why=_GLOO),
    Setting("gloo_rendezvous_addr", _V, "Horovod's Gloo rendezvous", horovod="HOROVOD_GLOO_RENDEZVOUS_ADDR",
            why=_GLOO),
    Setting("gloo_rendezvous_port", _V, "Horovod's Gloo rendezvous", horovod="HOROVOD_GLOO_RENDEZVOUS_PORT",
            why=_GLOO),
    Setting("elastic", _V, "Horovod's elastic worker mark", horovod="HOROVOD_ELASTIC", kind="bool",
            why="set by horovodrun for its elastic workers; hororun --min-np or --host-discovery-script starts an "
            "elastic job"),
    Setting("secret_key", _V, "Horovod's launcher key", horovod="HOROVOD_SECRET_KEY",
            why="Horovod's launcher's own; horo's launchers make a key per job and never put it in a variable "
            "the user sets"),
    Setting("spark_pythonpath", _V, "Horovod's Spark task path", horovod="HOROVOD_SPARK_PYTHONPATH", why=_SPARK),
    Setting("spark_work_dir", _V, "Horovod's Spark task directory", horovod="HOROVOD_SPARK_WORK_DIR", why=_SPARK),
    Setting("spark_use_local_rank_gpu_index", _V, "Horovod's Spark GPU choice",
            horovod="HOROVOD_SPARK_USE_LOCAL_RANK_GPU_INDEX", kind="bool",
            why="horo.spark leaves the GPU to the task; use hvd.local_rank() to pick one"),
)

_R = "rank"
#: What horo sets for each rank, with Horovod's gloo launcher's names: from the launcher's variables when the
#: process starts (under hororun), and exactly, from the communicators, at init() (elastic changes included).
_RANK: tuple[Setting, ...] = (
    Setting("horovod_rank", _R, "this process's rank", horovod="HOROVOD_RANK", kind="int", reader="set"),
    Setting("horovod_size", _R, "the number of ranks", horovod="HOROVOD_SIZE", kind="int", reader="set"),
    Setting("horovod_local_rank", _R, "the rank among those on this host", horovod="HOROVOD_LOCAL_RANK",
            kind="int", reader="set"),
    Setting("horovod_local_size", _R, "the ranks on this host", horovod="HOROVOD_LOCAL_SIZE", kind="int",
            reader="set"),
    Setting("horovod_cross_rank", _R, "the host's index among the hosts with a rank of this local rank",
            horovod="HOROVOD_CROSS_RANK", kind="int", reader="set"),
    Setting("horovod_cross_size", _R, "the hosts with a rank of this local rank", horovod="HOROVOD_CROSS_SIZE",
            kind="int", reader="set"),
    Setting("horovod_hostname", _R, "this rank's host: its name in an elastic job's host list, else the "
            "machine's host name", horovod="HOROVOD_HOSTNAME", reader="set"),
)

VARIABLES: tuple[Setting, ...] = _HORO + _HOROVOD + _RANK
