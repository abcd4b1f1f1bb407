"""Samplers: turn a need into row indices and weights, reading only the index."""

from .base import NotEnoughData, Sampler
from .her import HERPlan, HERSampler
from .mixture import MixturePlan, MixtureSampler
from .plan import ReadPlan, make_plan
from .priorities import BetaSchedule, PriorityIndex
from .prioritized import PrioritizedSampler
from .sequence import SequencePlan, SequenceSampler
from .uniform import UniformSampler

__all__ = [
    "BetaSchedule",
    "HERPlan",
    "HERSampler",
    "MixturePlan",
    "MixtureSampler",
    "NotEnoughData",
    "PrioritizedSampler",
    "PriorityIndex",
    "ReadPlan",
    "Sampler",
    "SequencePlan",
    "SequenceSampler",
    "UniformSampler",
    "make_plan",
]
