"""Samplers: turn a need into row indices and weights, reading only the index."""

from .base import NotEnoughData, Sampler
from .plan import ReadPlan, make_plan
from .uniform import UniformSampler

__all__ = ["NotEnoughData", "ReadPlan", "Sampler", "UniformSampler", "make_plan"]
