"""The slowdown trigger's contract: the rule a user sets and what fired it (perfdiag.api.slowdown
decides; the verdict and the PerfDiagnosis status carry these)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_BASELINE_STEPS = 50
MIN_BASELINE_STEPS = 2
MAX_BASELINE_STEPS = 1000  # the hook keeps the ends of its last 1024 steps
MAX_PERCENT = 1000.0


class SlowdownRule(BaseModel):
    """Capture when a rank's mean step time over the last `baseline_steps` steps is `percent`
    above the shortest such mean it reported recently."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    percent: float = Field(gt=0.0, le=MAX_PERCENT, description="how much slower than the baseline")
    baseline_steps: int = Field(
        default=DEFAULT_BASELINE_STEPS,
        ge=MIN_BASELINE_STEPS,
        le=MAX_BASELINE_STEPS,
        description="steps per mean (the baseline's and the current one's)",
    )
    confirmations: int = Field(
        default=2, ge=1, le=10, description="consecutive reports over the threshold"
    )

    @property
    def factor(self) -> float:
        return 1.0 + self.percent / 100.0


class Slowdown(BaseModel):
    """A fired rule: which rank, at which step, how slow against which baseline."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(ge=0, description="the rank whose step time fired the rule")
    step: int = Field(ge=0, description="the rank's step when the rule fired")
    mean_step_ms: float = Field(
        gt=0.0, description="its mean step over the last `steps` steps, the longest left out"
    )
    baseline_step_ms: float = Field(gt=0.0, description="its shortest recent mean")
    baseline_step: int = Field(ge=0, description="the step at which the baseline was reported")
    steps: int = Field(ge=1, description="steps per mean")
    threshold_percent: float = Field(gt=0.0, description="the rule's percent")

    @property
    def percent_over(self) -> float:
        return (self.mean_step_ms / self.baseline_step_ms - 1.0) * 100.0

    def describe(self) -> str:
        return (
            f"rank {self.rank}'s mean step over its last {self.steps} steps (to step "
            f"{self.step}) is {self.mean_step_ms:.1f} ms, {self.percent_over:.0f}% above its "
            f"baseline of {self.baseline_step_ms:.1f} ms (step {self.baseline_step}; the "
            f"trigger is {self.threshold_percent:g}%)"
        )
