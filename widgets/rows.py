"""What the dashboard model hands out: :class:`RankRow` per rank (with its
:class:`PipelineStep` when it runs a pipeline), :class:`ClusterRow`,
:class:`AutotunePanel`, a :class:`Lane` per rank of the live timeline and the
:class:`WorldChange` records of an elastic cluster. Frozen plain dataclasses, built by
:class:`widgets.model.DashboardModel` (which re-exports them) and read by the views.
"""

from dataclasses import dataclass, field

SAMPLES, BYTES = "samples/s", "B/s"


@dataclass(frozen=True)
class RankRow:
    """One rank as shown: identity, device, state and throughput."""

    rank: int
    host: str = ""
    pid: int = None
    device: str = ""  # "cpu" or "cuda:k" (k: the rank's CUDA ordinal, 0 once pinned)
    gpu_name: str = ""
    gpu_mem_used: int = None  # bytes this process holds on its GPU
    gpu_mem_total: int = None
    gpu_index: int = None  # the pinned GPU as nvidia-smi numbers it
    gpu_util: float = None  # percent, the whole GPU
    gpu_dev_mem_used: int = None  # bytes in use on the GPU by every process
    gpu_path: str = ""  # a key of gpu_stats.GPU_PATHS once a CUDA collective ran
    state: str = "starting"  # starting | idle | running | collective | stalled | dead
    detail: str = "waiting for the first snapshot"
    stale_s: float = None  # seconds without a snapshot, when over the model's stale_after_s
    unit: str = BYTES
    rate: float = None  # samples/s, or bytes/s sent (allreduce + point-to-point) without samples
    ops_rate: float = None  # allreduce ops/s
    samples: int = 0  # cumulative samples reported with report()
    spark: tuple = ()
    extra: dict = field(default_factory=dict)
    last_error: str = ""
    pipeline: "PipelineStep" = None  # the rank's last pipeline training step, if it ran one


@dataclass(frozen=True)
class PipelineStep:
    """A rank's last pipeline training step: ``actions`` are (kind "F" | "B", stage,
    micro-batch, start, end) in seconds from the step's start on that rank, in the order it
    ran them; ``more`` counts those the engine left out (past its cap)."""

    schedule: str = ""
    step_s: float = 0.0
    bubble: float = 0.0  # measured idle fraction of the step
    ideal: float = 0.0  # the schedule's, (K - 1) / (V M + K - 1)
    actions: tuple = ()
    more: int = 0


@dataclass(frozen=True)
class ClusterRow:
    """The cluster as a whole over the rate window."""

    ranks: int = 0
    counts: dict = field(default_factory=dict)  # state -> number of ranks
    unit: str = BYTES
    total_rate: float = None
    spark: tuple = ()
    slowest: tuple = None  # (rank, rate)
    fastest: tuple = None
    spread: float = None  # (fastest - slowest) / fastest
    fusion: float = None  # tensors per fused batch
    split: dict = None  # fractions of wall time, see rates.time_split
    straggler: int = None  # rank that waits least while others wait, when the gap is large
    world: tuple = ()  # the latest WorldChange records, oldest first (elastic clusters)


@dataclass(frozen=True)
class WorldChange:
    """An elastic cluster re-formed: ``size_before`` → ``size`` ranks at ``generation``;
    ``left`` holds (rank, pid, why) of the ranks that left (dead or removed)."""

    generation: int
    size_before: int
    size: int
    left: tuple = ()


@dataclass(frozen=True)
class AutotunePanel:
    """The autotuner's state as reported by the lowest live rank that has one."""

    enabled: bool = False
    phase: str = ""
    sample: int = None
    samples: int = None
    current: dict = field(default_factory=dict)
    best: dict = field(default_factory=dict)
    best_score: float = None
    scores: tuple = ()  # ((sample, score), ...) ascending by sample


@dataclass(frozen=True)
class Lane:
    """One rank's strip of the live timeline: bars are (op, name, start, duration, open) with
    start in seconds relative to now (negative); open bars are collectives still running. A bar
    standing for several back-to-back collectives of one op carries two more fields, (...,
    count, busy seconds), and the name of the first."""

    rank: int
    bars: tuple = ()
