"""Samplers: turn a need into read plans (plain data), reading only the in-RAM index.

``loading`` executes the plans; a sampler's ``sample(batch_size)`` reads one in this
process through its store. :class:`ReaderView` tells a sampler how the process that will
read its plans sees the store.
"""

from .base import Sampler, check_batch, read_fresh
from .her import HERSampler, episode_end
from .mixture import MixtureSampler
from .plans import (
    IN_PROCESS,
    HERPlan,
    MixturePlan,
    ReaderView,
    ReadPlan,
    SequencePlan,
    merge_plans,
)
from .prioritized import BetaSchedule, PrioritizedSampler
from .sequence import SequenceSampler, make_sequence_plan, sequence_valid
from .uniform import UniformSampler, uniform_rows
from .windows import make_plan, stack_rows

__all__ = [
    "IN_PROCESS",
    "BetaSchedule",
    "HERPlan",
    "HERSampler",
    "MixturePlan",
    "MixtureSampler",
    "PrioritizedSampler",
    "ReadPlan",
    "ReaderView",
    "Sampler",
    "SequencePlan",
    "SequenceSampler",
    "UniformSampler",
    "check_batch",
    "episode_end",
    "make_plan",
    "make_sequence_plan",
    "merge_plans",
    "read_fresh",
    "sequence_valid",
    "stack_rows",
    "uniform_rows",
]
