"""The pipeline's data model: one typed value per arrow.

    trace --ingest--> Profile --match(SkillIndex)--> MatchReport --select--> Plan --execute--> results

Everything after ingestion is format-agnostic: it sees only these models. They serialize to
JSON (``--json`` on the CLI, agent tool results) with ``model_dump(mode="json")``.
"""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The version of every `--json` document the CLI prints (their shapes are in schemas/cli-*.schema.json).
# Raise it when a key is renamed or removed; adding a key keeps it.
JSON_SCHEMA_VERSION = 1

# inferred_loop: a run of identical-shape launches of one op (a per-batch loop) gave `batch` = run length.
ShapeProvenance = Literal["trace", "kernel-name", "user", "unresolved", "inferred_loop"]
# What a kernel does, from its name and launching op (skillrun.ingest.names.kernel_category). Communication
# kernels (NCCL/RCCL) are reported but never offered to cards: no port replaces a collective.
KernelCategory = Literal["gemm", "attention", "elementwise", "reduction", "communication", "memcpy", "other"]
Shape = dict[str, int]  # problem dimensions: M, N, K, batch, tokens, experts, topk, model_dim, inter_dim …

# Names a recipe predicate may read. Problem dimensions plus device facts (see facts/).
SHAPE_KEYS = ("M", "N", "K", "batch", "tokens", "experts", "topk", "model_dim", "inter_dim", "group_size")
DEVICE_KEYS = ("cu_count", "sm_count", "xcds", "l2_mb", "lds_kb")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeviceInfo(_Model):
    index: int = 0
    name: Optional[str] = None
    vendor: Optional[Literal["nvidia", "amd"]] = None
    arch: Optional[str] = None  # gfx950, gfx942, sm_90, …
    sm_count: Optional[int] = None  # NVIDIA SMs or AMD CUs, as the profiler reports them
    warp_size: Optional[int] = None


class OpCall(_Model):
    """One launching op (with one set of argument shapes) behind a kernel."""

    op: str  # aten::_scaled_mm, aten::mm, vllm::…
    input_dims: list[Any] = Field(default_factory=list)
    input_types: list[str] = Field(default_factory=list)
    input_strides: list[Any] = Field(default_factory=list)
    concrete_inputs: list[Any] = Field(default_factory=list)
    calls: int = 0
    total_us: float = 0.0
    shape: Optional[Shape] = None  # problem dims recovered from the op (M, N, K, …)
    dtype: Optional[str] = None  # normalized input dtype: fp8_e4m3, fp8_e4m3_fnuz, bf16, fp16, fp32, int4 …
    scale_recipe: Optional[str] = None  # tensorwise | rowwise | blockwise_1x128_128x128 | …
    provenance: ShapeProvenance = "trace"
    # Length of the run of identical calls of this op (same shapes) in each profiler step: a per-batch
    # loop. The plan reads it as `batch` for batched cards (provenance inferred_loop).
    loop_batch: Optional[int] = None


class KernelStat(_Model):
    name: str  # as the profiler wrote it (may be mangled or truncated)
    demangled: Optional[str] = None
    total_us: float
    calls: int
    # Share of GPU kernel time, in percent, on the device where the kernel takes the largest share:
    # on a multi-GPU trace each device's time is its own 100% (never pooled across ranks).
    pct_gpu: float
    avg_us: float = 0.0
    min_us: Optional[float] = None  # shortest single call (None: the format only gives totals)
    max_us: Optional[float] = None
    device: Optional[int] = None  # the one device it ran on; None when several or unknown
    device_us: dict[int, float] = Field(default_factory=dict)  # kernel time per device index
    device_pct: dict[int, float] = Field(default_factory=dict)  # % of that device's kernel time
    short_name: Optional[str] = None  # the profiler's own short form (nsys shortName)
    category: KernelCategory = "other"
    ops: list[OpCall] = Field(default_factory=list)
    shape_provenance: ShapeProvenance = "unresolved"
    graph_replayed_calls: int = 0
    unattributed_us: float = 0.0  # device time of calls we could not link to a shape
    grid: Optional[list[int]] = None
    block: Optional[list[int]] = None
    median_us: Optional[float] = None  # of one call (None: the format gives no per-call times)
    std_us: Optional[float] = None  # sample standard deviation of one call's duration
    # What the trace says about how it was launched (first call seen): registers_per_thread,
    # shared_mem_bytes, vgprs, agprs, sgprs, lds_bytes, scratch_bytes, local_mem_per_thread …
    launch: dict[str, int] = Field(default_factory=dict)
    # The profiler's own per-kernel metrics where it has them (ncu: every numeric metric of every
    # section, "Section: Metric [unit]", the mean over the profiled launches).
    metrics: dict[str, float] = Field(default_factory=dict)


class GraphReplay(_Model):
    detected: bool = False
    launches: int = 0  # cudaGraphLaunch / hipGraphLaunch calls seen
    kernel_calls: int = 0  # kernel executions attributed to graph replay
    total_us: float = 0.0


class GraphCapture(_Model):
    """A trace of a CUDA/HIP graph *capture*: launches between …StreamBeginCapture and …EndCapture
    build a graph and execute nothing, so such a trace says little about kernel time."""

    detected: bool = False
    captures: int = 0  # stream-capture begin calls
    captured_launches: int = 0  # kernel launches recorded inside a capture


class DeviceTime(_Model):
    """One device's (rank's) kernel time, and how busy its timeline was."""

    device: int
    kernel_us: float = 0.0  # summed kernel durations (streams can overlap: may exceed busy_us)
    calls: int = 0
    busy_us: Optional[float] = None  # union of kernel intervals (None: no timestamps in the format)
    span_us: Optional[float] = None  # first kernel start to last kernel end
    idle_us: Optional[float] = None  # span - busy: gaps between kernels on this device


class Profile(_Model):
    """A normalized profile, whatever the source format (schema: schemas/profile.schema.json)."""

    source: str
    format: str  # kineto_json | rocprofv3_csv | rocpd_csv | rocprof_v2_csv | rocprof_v1_csv | rocprof_stats_csv | rocprofv3_json | rocpd_sqlite | nsys_sqlite | nsys_stats_csv | ncu_csv
    devices: list[DeviceInfo] = Field(default_factory=list)
    arch: Optional[str] = None
    # What the trace itself says (device properties, else hipBLASLt ISA tags) when --arch gave another arch.
    arch_from_trace: Optional[str] = None
    total_kernel_us: float = 0.0
    kernel_calls: int = 0
    kernels: list[KernelStat] = Field(default_factory=list)  # ranked, hottest first
    graph_replay: GraphReplay = Field(default_factory=GraphReplay)
    graph_capture: GraphCapture = Field(default_factory=GraphCapture)
    unattributed_us: float = 0.0  # kernel time whose shape could not be recovered
    linked_calls: int = 0  # kernel calls linked to an op with shapes
    device_time: list[DeviceTime] = Field(default_factory=list)  # per device, by index
    category_us: dict[str, float] = Field(default_factory=dict)  # kernel time per KernelCategory
    warnings: list[str] = Field(default_factory=list)
    # Values the trace cannot mean, by kind (negative_duration, non_finite_duration,
    # non_finite_timestamp, absurd_shape): counted and left out, never clamped into the numbers.
    anomalies: dict[str, int] = Field(default_factory=dict)


class Criterion(_Model):
    name: str  # regex | min_pct_gpu | gen | dtype | operator | regime | op
    # None: the trace does not carry what this criterion reads (no dtype, no launching op, no
    # shape), so it was not checked; shown as neither passed nor failed and never held against a card.
    passed: Optional[bool]
    reason: str
    required: bool = True
    status: Optional[Literal["passed", "failed", "not_checked"]] = None  # derived from passed, for readers of the JSON

    @model_validator(mode="after")
    def _derive_status(self) -> "Criterion":
        self.status = "not_checked" if self.passed is None else ("passed" if self.passed else "failed")
        return self


class Match(_Model):
    skill_id: str
    kernel: str
    pct_gpu: float
    matched: bool
    near_miss: bool = False  # failed exactly one required criterion
    criteria: list[Criterion] = Field(default_factory=list)


class CardProblem(_Model):
    """A card or fact file that is not used because it failed to load or to lint."""

    path: Optional[str] = None
    field: Optional[str] = None
    reason: str


class FamilyCoverage(_Model):
    """GPU time of one kernel family (operator class or category, with dtype) and whether a card covers it."""

    family: str  # dense_gemm | scaled_quant_gemm | batched_gemm | grouped_gemm | moe | gemm (op unknown) | attention | …
    dtype: Optional[str] = None  # None: the trace does not say
    arch: Optional[str] = None
    pct_gpu: float = 0.0
    kernels: int = 0
    # covered: kernels of this family that a card matched (only those: the row's share is theirs);
    # near_miss: kernels of a family, dtype and arch some card is for, which it did not match (the note
    # says which criterion failed); unknown: a GEMM whose launching op is not in the trace;
    # not_offered: collectives
    status: Literal["covered", "near_miss", "not_covered", "not_offered", "unknown"] = "not_covered"
    cards: list[str] = Field(default_factory=list)  # the matching cards, or the nearest one otherwise
    note: Optional[str] = None


class NearestCard(_Model):
    """An unmatched hot kernel, the card that came closest, and the criteria that card failed."""

    kernel: str
    demangled: Optional[str] = None
    pct_gpu: float
    category: KernelCategory = "other"
    card: Optional[str] = None  # None: no card is for this kernel's family (failed says so)
    failed: list[str] = Field(default_factory=list)  # "criterion: reason"


class NoMatch(_Model):
    """Why no card matched, in one sentence, and what to do about it (the Answer line, MCP and LangChain)."""

    kind: Literal["graph_capture", "arch_override", "arch_unknown", "no_card_for_arch", "near_miss",
                  "not_covered", "op_unknown", "no_cards", "nothing_offered"]
    reason: str
    next: str


class Coverage(_Model):
    families: list[FamilyCoverage] = Field(default_factory=list)  # hottest first
    nearest: list[NearestCard] = Field(default_factory=list)  # unmatched hot kernels, hottest first
    kb_families: list[str] = Field(default_factory=list)  # what each card of the knowledge base covers
    no_match: Optional[NoMatch] = None  # set when no card matched any hot kernel


class MatchReport(_Model):
    profile: str
    arch: Optional[str]
    card_problems: list[CardProblem] = Field(default_factory=list)  # cards left out of matching, and why
    matches: list[Match] = Field(default_factory=list)  # matched=True
    near_misses: list[Match] = Field(default_factory=list)
    unmatched_hot: list[str] = Field(default_factory=list)  # hot kernels no card touched
    communication: list[str] = Field(default_factory=list)  # collectives: shown, never offered to cards
    coverage: Optional[Coverage] = None  # what the trace's time is and which of it the cards cover


class PlanItem(_Model):
    skill_id: str
    kernel: str  # the profiled kernel this replaces
    pct_gpu: float
    shape: Optional[Shape] = None
    shape_provenance: ShapeProvenance = "unresolved"
    dtype: Optional[str] = None
    recipe: Optional[str] = None
    untuned: bool = False
    kernel_ref: Optional[str] = None
    backend: Optional[str] = None  # triton | flydsl
    config: dict[str, Any] = Field(default_factory=dict)
    lever: Optional[str] = None
    loses: list[str] = Field(default_factory=list)
    references: dict[str, Any] = Field(default_factory=dict)
    tolerance: dict[str, float] = Field(default_factory=dict)
    expected_speedup: Optional[float] = None
    # Where expected_speedup comes from: the current, non-stale GPU artifact of the same card, recipe,
    # shape and device class ("measured", quoted in `evidence`), else the card's prior.
    expected_source: Literal["measured", "card_prior"] = "card_prior"
    # What the card's prior is a ratio against (the recipe evidence entry it came from), since a
    # prior measured against an older reference must not read as one against today's baseline.
    prior_versus: Optional[str] = None
    evidence: Optional[dict[str, Any]] = None  # path, created, age, speedup, noise_pct, speed, verdict, verdict_text, device, commit, shape
    lever_measured_on: list[str] = Field(default_factory=list)  # the shapes the card's lever/loses words were measured on
    next_command: Optional[str] = None  # the run that would measure this item, when nothing has
    projected_e2e_gain_pct: Optional[float] = None  # f·(1−1/s), in percent of total GPU time
    status: Literal["planned", "unresolved_shape", "unsupported_shape"] = "planned"
    notes: list[str] = Field(default_factory=list)
    # The trace's own call (skillrun.plan.callpattern): its facts (op, scale layout, loop, graph), a
    # sentence, and the card reference that reproduces it (``reference``; None when no entry matches).
    trace_call: Optional[dict[str, Any]] = None
    # The port against that reference in the evidence quoted: name, speedup (both clocks), speed,
    # parity, detail, path. expected_speedup is this ratio when it was timed: the gain over what the trace runs.
    versus_trace_call: Optional[dict[str, Any]] = None
    # "your call returns wrong results here: ...; do: ..." when the evidence says the trace's call fails the oracle.
    wrong_results: Optional[str] = None


class Plan(_Model):
    profile: str
    arch: Optional[str]
    card_problems: list[CardProblem] = Field(default_factory=list)  # cards left out of matching, and why
    device: Optional[str] = None  # the profiled GPU's name, for the device class of evidence
    items: list[PlanItem] = Field(default_factory=list)
    # Sum over items of f·(1−1/s), keeping the baseline where s < 1 (those items add 0), and the plain sum.
    projected_gain_pct: Optional[float] = None
    projected_gain_all_pct: Optional[float] = None
    # projected_gain_pct split by where the ratio came from: measured (current GPU evidence) and the
    # cards' priors (never measured here; an untuned fallback's prior contributes none).
    measured_gain_pct: Optional[float] = None
    prior_gain_pct: Optional[float] = None
    warnings: list[str] = Field(default_factory=list)
    coverage: Optional[Coverage] = None  # the match report's coverage, so every plan says what it leaves out
